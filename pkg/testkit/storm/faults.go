package storm

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/job"
	"bulwark/pkg/testkit/mockprovider"
)

// The fault matrix (faults_test.go) runs a storm on the real processes
// while something breaks — a worker killed mid-call, Redis restarted, the
// provider failing — and counts at the end, for every request:
//
//   - (a) every accepted request (202 from POST /v1/requests, or an answer
//     of the compat endpoint naming its request id) reached a terminal
//     state, read back with GET /v1/requests/{id} after the load; a failed
//     one says why;
//   - (b) every answer is mockprovider.Reply of the caller's own prompt;
//   - (c) no prompt reached the provider again after it had been
//     answered. The mock counts calls per key, so the workers call it
//     through a recording proxy (callLog) that knows every call's prompt,
//     worker and outcome; every request asks a prompt of its own.
//
// This file holds the machinery: a system with the proxy, a load whose
// clients retry what was not accepted (never what was), the final check
// and the one-line summary.

// faultReportEnv names a file to which each fault test appends its
// summary line; faultKeepEnv, when set, keeps every fault test's folder
// (config and process logs), not only a failed one's.
const (
	faultReportEnv = "BULWARK_FAULT_REPORT"
	faultKeepEnv   = "BULWARK_FAULT_KEEP"
)

// faultRun is one fault test's system, call log and load.
type faultRun struct {
	sc        Scenario
	sys       *system
	calls     *callLog
	client    *http.Client
	transport *http.Transport
	d         *driver
	// compatEvery > 0 sends every compatEvery-th request through POST
	// /v1/chat/completions instead of POST /v1/requests.
	compatEvery int

	// reqs[i] is written only by request i's client until done is closed.
	reqs    []faultReq
	began   time.Time
	clients sync.WaitGroup // the requests' clients (launch)
	done    chan struct{}  // closed when every client has returned
	stop    context.CancelCauseFunc
	ctx     context.Context // the load's; its cause says why it was cut
	release func()          // frees the load's timer and process watch

	// watch counts breaker openings from start until the load ends.
	watch     *breakerWatch
	stopWatch context.CancelFunc
	watchDone chan struct{}

	mu      sync.Mutex
	ended   int           // requests whose client has returned; guarded by mu
	changed chan struct{} // closed and replaced when a request ends; guarded by mu
}

// faultReq is what happened to one request.
type faultReq struct {
	compat   bool
	id       string    // "" until accepted
	accepted time.Time // when the client learnt its id
	submits  int       // POSTs sent (more than one: retried before it was accepted)
	// endAt is when the client learnt that the request ended (zero: it
	// never did).
	endAt time.Time
	o     outcome
	// final is GET /v1/requests/{id} after the load; finalErr says why
	// it could not be read.
	final    requestView
	finalErr string
}

// startFault starts a system for sc with o (each worker's provider calls
// through a new callLog) and returns it, the load not yet started.
func startFault(ctx context.Context, env Env, sc Scenario, o options, compatEvery int) (*faultRun, error) {
	transport := &http.Transport{MaxIdleConnsPerHost: 2*sc.Requests + 32, IdleConnTimeout: 30 * time.Second}
	client := &http.Client{Transport: transport}
	calls := newCallLog()
	o.ProviderURL = calls.url
	sys, err := startSystemWith(ctx, env, sc, client, o)
	if err != nil {
		calls.close()
		transport.CloseIdleConnections()
		return nil, err
	}
	f := &faultRun{sc: sc, sys: sys, calls: calls, client: client, transport: transport, compatEvery: compatEvery,
		d: &driver{sc: sc, http: client, apiURL: sys.apiURL, prompts: sc.prompts()}, reqs: make([]faultReq, sc.Requests),
		done: make(chan struct{}), changed: make(chan struct{})}
	for i := range f.reqs {
		f.reqs[i].compat = compatEvery > 0 && i%compatEvery == compatEvery-1
	}
	return f, nil
}

// close stops the system and the proxy; keep keeps the system's folder
// (config and process logs), whose path it returns.
func (f *faultRun) close(keep bool) (string, error) {
	f.sys.keepDir = f.sys.keepDir || keep || os.Getenv(faultKeepEnv) != ""
	err := f.sys.close()
	f.calls.close()
	f.transport.CloseIdleConnections()
	if f.sys.keepDir {
		return f.sys.dir, err
	}
	return "", err
}

// start sends every request at once, each from its own client, and
// returns; the load ends when every request has ended, at limit, or when
// a process exits on its own.
func (f *faultRun) start(ctx context.Context, limit time.Duration) {
	f.begin(ctx, limit)
	for i := range f.reqs {
		f.launch(i, f.one)
	}
	f.launched()
}

// begin starts the load — its clock, its time limit, the breaker watch —
// without sending anything: a test that sends its requests at moments of
// its own launches each one's client, then calls launched.
func (f *faultRun) begin(ctx context.Context, limit time.Duration) {
	ctx, cancel := context.WithCancelCause(ctx)
	f.stop = cancel
	ctx, cancelLimit := context.WithTimeoutCause(ctx, limit, errLimit)
	f.ctx = ctx
	stopAfter := context.AfterFunc(f.sys.ctx, func() { cancel(context.Cause(f.sys.ctx)) })
	f.release = func() {
		stopAfter()
		cancelLimit()
	}
	f.watch = newBreakerWatch(f.client, f.sys.apiURL)
	wctx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	f.stopWatch, f.watchDone = stopWatch, make(chan struct{})
	go func() {
		defer close(f.watchDone)
		f.watch.run(wctx)
	}()
	f.began = time.Now()
}

// launch runs client, request i's, in a goroutine of its own under the
// load's context, and counts the request ended when it returns.
func (f *faultRun) launch(i int, client func(ctx context.Context, i int)) {
	f.clients.Go(func() {
		client(f.ctx, i)
		f.mu.Lock()
		f.ended++
		close(f.changed)
		f.changed = make(chan struct{})
		f.mu.Unlock()
	})
}

// launched says that every client has been launched: the load ends when
// they have all returned.
func (f *faultRun) launched() {
	go func() {
		f.clients.Wait()
		f.release()
		close(f.done)
	}()
}

// wait waits for the load to end and returns why it was cut, if it was
// (the time limit, a process that exited on its own, ctx).
func (f *faultRun) wait(ctx context.Context) error {
	select {
	case <-f.done:
	case <-ctx.Done():
		f.stop(context.Cause(ctx))
		<-f.done
	}
	f.stopWatch()
	<-f.watchDone
	if c := context.Cause(f.ctx); c != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	return nil
}

// awaitEnded waits until n requests have ended (or the load is over).
func (f *faultRun) awaitEnded(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		ended, changed := f.ended, f.changed
		f.mu.Unlock()
		if ended >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-f.done:
			return nil
		case <-changed:
		}
	}
}

// idempotencyKey makes a resubmission of request i — after a connection
// error or a 5xx, when the client cannot know whether it was taken —
// return the request it may already have created instead of a second one.
func (f *faultRun) idempotencyKey(i int) string { return fmt.Sprintf("storm-%s-%d", f.sc.Name, i) }

// one runs request i to its end.
func (f *faultRun) one(ctx context.Context, i int) {
	r := &f.reqs[i]
	r.o = outcome{sent: true, sentAt: time.Now()}
	if r.compat {
		f.chat(ctx, i)
	} else {
		f.async(ctx, i)
	}
	f.markEnd(i)
}

// markEnd records, once request i's client has returned, when it learnt
// that the request ended — if it did.
func (f *faultRun) markEnd(i int) {
	r := &f.reqs[i]
	o := r.o
	if o.ok || o.reason == reasonWrong || strings.HasPrefix(o.reason, string(job.EventFailed)+":") ||
		strings.HasPrefix(o.reason, string(job.EventCancelled)+":") {
		r.endAt = time.Now()
	}
}

// resubmitDelay is how long a client waits before sending again what a
// connection error or a 5xx left unanswered.
const resubmitDelay = 200 * time.Millisecond

// async submits request i through POST /v1/requests — again after a
// connection error, a 5xx or a 429, never once it has an id — and follows
// its events to its end.
func (f *faultRun) async(ctx context.Context, i int) {
	r := &f.reqs[i]
	prompt := f.d.prompts[i]
	body := map[string]any{"provider": "openai", "model_tier": "gpt4o-mini", "priority": "normal",
		"max_tokens": MaxTokens, "messages": messages(prompt)}
	hdr := map[string]string{"Accept-Language": "en", "Idempotency-Key": f.idempotencyKey(i)}
	var v requestView
	for {
		r.submits++
		code, h, raw, err := f.d.send(ctx, http.MethodPost, "/v1/requests", body, hdr)
		var wait time.Duration
		switch {
		case err != nil || code >= 500:
			wait = resubmitDelay
		case code == http.StatusTooManyRequests:
			wait = retryAfter(h)
		case (code == http.StatusOK || code == http.StatusAccepted) && json.Unmarshal(raw, &v) == nil && v.ID != "":
		default:
			r.o.reason = "http_" + strconv.Itoa(code)
			return
		}
		if wait == 0 {
			break
		}
		if !sleep(ctx, wait) {
			r.o.reason = abortReason(ctx)
			return
		}
	}
	r.id, r.accepted = v.ID, time.Now()
	if v.Status == job.StatusCompleted { // a cache hit
		if v.Result == nil {
			r.o.reason = reasonWrong
			return
		}
		r.o = f.d.check(r.o, prompt, v.Result.Content, string(v.Result.Cached), resultRoute(v.Result))
		return
	}
	f.follow(ctx, i)
}

// chat sends request i through POST /v1/chat/completions. An answer with
// its request id, or a 429 or 5xx other than 503 that names one (the
// request was taken), is final or followed; a connection error, a 503 (a
// request stored but not confirmed by the replicas may be lost with a
// master that is failing over: an SDK sends it again), or a 429 or 5xx
// without an id, is sent again with the same Idempotency-Key, which finds
// the request if it was kept.
func (f *faultRun) chat(ctx context.Context, i int) {
	r := &f.reqs[i]
	prompt := f.d.prompts[i]
	body := map[string]any{"model": "gpt-4o-mini", "max_tokens": MaxTokens, "messages": messages(prompt)}
	hdr := map[string]string{"X-Bulwark-Priority": "normal", "Accept-Language": "en", "Idempotency-Key": f.idempotencyKey(i)}
	for {
		r.submits++
		code, h, raw, err := f.d.send(ctx, http.MethodPost, "/v1/chat/completions", body, hdr)
		id := ""
		if err == nil {
			id = h.Get("X-Bulwark-Request-Id")
		}
		var wait time.Duration
		switch {
		case err == nil && code == http.StatusOK:
			r.id, r.accepted = id, time.Now()
			if id == "" {
				r.o.reason = "compat_answer_without_request_id"
				return
			}
			var resp struct {
				Choices []struct {
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
			}
			if json.Unmarshal(raw, &resp) != nil || len(resp.Choices) == 0 {
				r.o.reason = reasonWrong
				return
			}
			r.o = f.d.check(r.o, prompt, resp.Choices[0].Message.Content, h.Get("X-Bulwark-Cache"),
				routeName(h.Get("X-Bulwark-Provider"), h.Get("X-Bulwark-Model-Tier")))
			return
		case id != "" && (code == http.StatusTooManyRequests || code >= 500 && code != http.StatusServiceUnavailable):
			r.id, r.accepted = id, time.Now()
			f.follow(ctx, i)
			return
		case err == nil && code == http.StatusServiceUnavailable:
			wait = retryAfter(h)
		case err != nil || code >= 500:
			wait = resubmitDelay
		case code == http.StatusTooManyRequests:
			wait = retryAfter(h)
		default:
			r.o.reason = "http_" + strconv.Itoa(code)
			return
		}
		if !sleep(ctx, wait) {
			r.o.reason = abortReason(ctx)
			return
		}
	}
}

// follow reads request i's events until a terminal one, reconnecting with
// Last-Event-ID whenever the stream breaks or the API answers 5xx (Redis
// may be away).
func (f *faultRun) follow(ctx context.Context, i int) {
	r := &f.reqs[i]
	lastID := ""
	for {
		if f.d.stream(ctx, r.id, f.d.prompts[i], &r.o, &lastID) {
			if !strings.HasPrefix(r.o.reason, "events_http_5") {
				return
			}
			r.o.reason = ""
		}
		if !sleep(ctx, 100*time.Millisecond) {
			r.o.reason = abortReason(ctx)
			return
		}
	}
}

// verify reads every accepted request with GET /v1/requests/{id}, a few
// tries each, after the load.
func (f *faultRun) verify(ctx context.Context) {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range f.reqs {
		r := &f.reqs[i]
		if r.id == "" {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			for try := range 5 {
				if try > 0 && !sleep(ctx, 500*time.Millisecond) {
					return
				}
				code, _, raw, err := f.d.send(ctx, http.MethodGet, "/v1/requests/"+r.id, nil, nil)
				switch {
				case err != nil:
					r.finalErr = err.Error()
				case code != http.StatusOK:
					r.finalErr = "GET: HTTP " + strconv.Itoa(code)
					if code < 500 {
						return
					}
				default:
					r.finalErr = ""
					if err := json.Unmarshal(raw, &r.final); err != nil {
						r.finalErr = "GET: " + err.Error()
					}
					return
				}
			}
		})
	}
	wg.Wait()
}

// workerKill is one SIGKILL of a worker process.
type workerKill struct {
	at     time.Time
	worker string
	pid    int
	// ready is how long its replacement took to answer /metrics.
	ready time.Duration
	// held are the ids of the tasks the worker was working on by its last
	// asynq heartbeat (at most 5 s before the kill): mid-call, or waiting
	// inside the worker for a slot or a key. heldErr says why they could
	// not be read.
	held    []string
	heldErr error
}

// heldTasks returns the ids of the tasks the worker process pid works
// on, from its last asynq heartbeat (asynq writes each server's active
// workers to Redis every 5 s).
func heldTasks(insp *asynq.Inspector, pid int) ([]string, error) {
	servers, err := insp.Servers()
	if err != nil {
		return nil, fmt.Errorf("storm: asynq servers: %w", err)
	}
	var ids []string
	for _, s := range servers {
		if s.PID != pid {
			continue
		}
		for _, w := range s.ActiveWorkers {
			ids = append(ids, w.TaskID)
		}
	}
	return ids, nil
}

// undelivered marks every answer the proxy wrote after its worker had been
// killed as not delivered: the process was gone, whatever the write
// returned (a write to a dead peer's socket may still succeed once).
func undelivered(calls []providerCall, kills []workerKill) []providerCall {
	for i := range calls {
		c := &calls[i]
		for _, k := range kills {
			if c.Worker == k.worker && !c.End.IsZero() && !c.End.Before(k.at) {
				c.Status, c.Aborted = 0, true
			}
		}
	}
	return calls
}

// killRecovery is what one kill cost: the requests whose provider call
// was in flight on the killed worker when it died, and when the last of
// them ended.
type killRecovery struct {
	kill     workerKill
	requests []int         // by index
	recovery time.Duration // kill → the last of them ended
	open     []int         // those that never ended
	// again counts those of requests that a later kill caught mid-call
	// too: their recovery includes that kill's.
	again int
	// held are the requests the worker held by its last heartbeat and
	// that had not ended at the kill (mid-call ones included), heldRecovery
	// when the last of them ended, heldOpen those that never did.
	held         []int
	heldRecovery time.Duration
	heldOpen     []int
}

// recoveries measures every kill. A request belongs to a kill when the
// proxy had a call of its prompt from the killed worker in flight at the
// moment of the kill (begun before, not ended before).
func (f *faultRun) recoveries(kills []workerKill, calls []providerCall) []killRecovery {
	byPrompt := f.promptIndex()
	out := make([]killRecovery, 0, len(kills))
	for _, k := range kills {
		kr := killRecovery{kill: k}
		seen := map[int]bool{}
		for _, c := range calls {
			i, ok := byPrompt[c.Prompt]
			if !ok || c.Worker != k.worker || c.Start.After(k.at) || (!c.End.IsZero() && c.End.Before(k.at)) || seen[i] {
				continue
			}
			seen[i] = true
			kr.requests = append(kr.requests, i)
			if end := f.reqs[i].endAt; end.IsZero() {
				kr.open = append(kr.open, i)
			} else {
				kr.recovery = max(kr.recovery, end.Sub(k.at))
			}
		}
		slices.Sort(kr.requests)
		byID := f.idIndex()
		for _, id := range k.held {
			if i, ok := byID[id]; ok && !seen[i] {
				seen[i] = true
				if end := f.reqs[i].endAt; end.IsZero() || end.After(k.at) {
					kr.held = append(kr.held, i)
				}
			}
		}
		kr.held = append(kr.held, kr.requests...)
		slices.Sort(kr.held)
		for _, i := range kr.held {
			if end := f.reqs[i].endAt; end.IsZero() {
				kr.heldOpen = append(kr.heldOpen, i)
			} else {
				kr.heldRecovery = max(kr.heldRecovery, end.Sub(k.at))
			}
		}
		out = append(out, kr)
	}
	for n := range out {
		later := map[int]bool{}
		for _, o := range out[n+1:] {
			for _, i := range o.requests {
				later[i] = true
			}
		}
		for _, i := range out[n].requests {
			if later[i] {
				out[n].again++
			}
		}
	}
	return out
}

// idIndex maps the accepted requests' ids to their index (after the
// load).
func (f *faultRun) idIndex() map[string]int {
	m := make(map[string]int, len(f.reqs))
	for i := range f.reqs {
		if id := f.reqs[i].id; id != "" {
			m[id] = i
		}
	}
	return m
}

func (f *faultRun) promptIndex() map[string]int {
	m := make(map[string]int, len(f.d.prompts))
	for i, p := range f.d.prompts {
		m[p] = i
	}
	return m
}

// FaultResult is what one fault test counted.
type FaultResult struct {
	Test string
	// Requests in all; Accepted got a request id; Completed, Failed
	// (failed or cancelled) and Lost (not terminal, or unreadable) by GET
	// /v1/requests/{id} after the load; Wrong answers are not
	// mockprovider.Reply of the prompt (by the client or by the GET).
	Requests, Accepted, Completed, Failed, Lost, Wrong int
	// Resubmits counts POSTs sent again before a request was accepted.
	Resubmits int
	// ProviderCalls made by the workers (through the proxy): Answered
	// with 200, Aborted by the worker going away, Dropped by the proxy.
	ProviderCalls, CallsAnswered, CallsAborted, CallsDropped int
	// Duplicates counts provider calls of a prompt that began after it had
	// been answered; DuplicatesAfterKill those explained by the worker
	// that received the answer being killed before it ended the request.
	Duplicates, DuplicatesAfterKill int
	// Recovery holds the test's recovery times, RecoveryWhat what they
	// measure.
	Recovery     []time.Duration
	RecoveryWhat string
	// Wall is the load's time, from the first send to the last end a
	// client saw; P50 and Max of the requests' times, send to end.
	Wall, P50, Max time.Duration
	// CallGap is the longest time between two provider calls in a row
	// (how long the provider saw no call at all).
	CallGap time.Duration
	// BreakerOpenings seen by polling GET /admin/breakers during the
	// load, and the breakers that opened.
	BreakerOpenings int
	OpenedBreakers  []string
	// Notes holds test-specific counts (fallback served, faults injected).
	Notes string
}

// String is the result on one line, for the test log and the README.
func (r FaultResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s requests=%d accepted=%d completed=%d failed=%d lost=%d wrong=%d duplicates=%d",
		r.Test, r.Requests, r.Accepted, r.Completed, r.Failed, r.Lost, r.Wrong, r.Duplicates)
	if r.DuplicatesAfterKill > 0 {
		fmt.Fprintf(&b, "(after_kill=%d)", r.DuplicatesAfterKill)
	}
	fmt.Fprintf(&b, " provider_calls=%d(ok=%d,aborted=%d,dropped=%d) resubmits=%d",
		r.ProviderCalls, r.CallsAnswered, r.CallsAborted, r.CallsDropped, r.Resubmits)
	if len(r.Recovery) > 0 {
		fmt.Fprintf(&b, " recovery_s[%s]=", r.RecoveryWhat)
		if len(r.Recovery) == 1 {
			fmt.Fprintf(&b, "%.1f", r.Recovery[0].Seconds())
		} else {
			fmt.Fprintf(&b, "min/median/max %.1f/%.1f/%.1f(n=%d)", slices.Min(r.Recovery).Seconds(),
				percentile(r.Recovery, 0.5).Seconds(), slices.Max(r.Recovery).Seconds(), len(r.Recovery))
		}
	}
	fmt.Fprintf(&b, " wall=%.1fs p50=%.1fs max=%.1fs longest_call_gap=%.1fs breaker_openings=%d", r.Wall.Seconds(), r.P50.Seconds(),
		r.Max.Seconds(), r.CallGap.Seconds(), r.BreakerOpenings)
	if len(r.OpenedBreakers) > 0 {
		fmt.Fprintf(&b, "[%s]", strings.Join(r.OpenedBreakers, ","))
	}
	if r.Notes != "" {
		b.WriteString(" " + r.Notes)
	}
	return b.String()
}

// result counts the load after verify and lists every violation, each
// with the request ids and the process log lines that name them. kills
// explain repeats whose answer went to a worker killed before the request
// ended.
func (f *faultRun) result(test string, kills []workerKill) (FaultResult, []string) {
	res := FaultResult{Test: test, Requests: len(f.reqs)}
	var problems []string
	var lastEnd time.Time
	var lat []time.Duration
	byStatus := map[string][]int{}
	for i := range f.reqs {
		r := &f.reqs[i]
		res.Resubmits += max(0, r.submits-1)
		if r.endAt.After(lastEnd) {
			lastEnd = r.endAt
		}
		if !r.endAt.IsZero() {
			lat = append(lat, r.endAt.Sub(r.o.sentAt))
		}
		if r.id == "" {
			byStatus["not_accepted:"+cmp.Or(r.o.reason, "unknown")] = append(byStatus["not_accepted:"+cmp.Or(r.o.reason, "unknown")], i)
			continue
		}
		res.Accepted++
		st := r.final.Status
		switch {
		case r.finalErr != "":
			res.Lost++
			byStatus["unreadable"] = append(byStatus["unreadable"], i)
		case !st.Terminal():
			res.Lost++
			byStatus["lost:"+string(st)] = append(byStatus["lost:"+string(st)], i)
		case st == job.StatusCompleted:
			res.Completed++
			if r.final.Result == nil || r.final.Result.Content != mockprovider.Reply(f.d.prompts[i]) || r.o.reason == reasonWrong {
				res.Wrong++
				byStatus["wrong_answer"] = append(byStatus["wrong_answer"], i)
			} else if !r.o.ok {
				// Completed and right, but its client never saw it.
				byStatus["client_missed_end:"+cmp.Or(r.o.reason, "unknown")] = append(byStatus["client_missed_end:"+cmp.Or(r.o.reason, "unknown")], i)
			}
		default: // failed or cancelled
			res.Failed++
			key := string(st) + ":" + errorCode(r.final.Error)
			if strings.TrimSpace(r.final.Error) == "" {
				key = string(st) + ":WITHOUT_ERROR"
			}
			byStatus[key] = append(byStatus[key], i)
		}
	}
	if !lastEnd.IsZero() {
		res.Wall = lastEnd.Sub(f.began)
	}
	res.P50, res.Max = percentile(lat, 0.5), percentile(lat, 1)
	if f.watch != nil {
		res.BreakerOpenings, res.OpenedBreakers, _, _ = f.watch.result()
	}

	calls := undelivered(f.calls.snapshot(), kills)
	res.CallGap = longestGap(calls)
	for _, c := range calls {
		if c.Prompt == "" {
			continue
		}
		res.ProviderCalls++
		switch {
		case c.Status == http.StatusOK:
			res.CallsAnswered++
		case c.Dropped:
			res.CallsDropped++
		case c.Aborted:
			res.CallsAborted++
		}
	}
	byPrompt := f.promptIndex()
	var dups []string
	for _, rp := range repeats(calls) {
		i := byPrompt[rp.Again.Prompt]
		explained := false
		for _, k := range kills {
			if k.worker == rp.Answered.Worker && k.at.After(rp.Answered.Start) &&
				(f.reqs[i].endAt.IsZero() || f.reqs[i].endAt.After(k.at)) {
				explained = true
			}
		}
		res.Duplicates++
		if explained {
			res.DuplicatesAfterKill++
			continue
		}
		if len(dups) < 10 {
			dups = append(dups, fmt.Sprintf("request %d %s: answered by %s at +%.1fs (%s), called again by %s at +%.1fs (status %d)",
				i, f.reqs[i].id, rp.Answered.Worker, rp.Answered.End.Sub(f.began).Seconds(), rp.Answered.Path,
				rp.Again.Worker, rp.Again.Start.Sub(f.began).Seconds(), rp.Again.Status))
		}
	}
	if n := res.Duplicates - res.DuplicatesAfterKill; n > 0 {
		problems = append(problems, fmt.Sprintf("(c) %d provider calls of prompts already answered:\n  %s", n, strings.Join(dups, "\n  ")))
	}

	keys := make([]string, 0, len(byStatus))
	for k := range byStatus {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, "completed") {
			continue
		}
		idx := byStatus[k]
		var b strings.Builder
		fmt.Fprintf(&b, "%d requests %s:", len(idx), k)
		for n, i := range idx {
			if n == 8 {
				fmt.Fprintf(&b, "\n  … and %d more", len(idx)-n)
				break
			}
			r := &f.reqs[i]
			fmt.Fprintf(&b, "\n  request %d %s (compat=%v, submits=%d, client: %s, GET: status=%q error=%q %s)",
				i, cmp.Or(r.id, "-"), r.compat, r.submits, cmp.Or(r.o.reason, "ok"), r.final.Status, r.final.Error, r.finalErr)
			if r.id != "" && n < 4 {
				for _, l := range f.logLines(r.id, 12) {
					b.WriteString("\n    " + l)
				}
			}
		}
		problems = append(problems, b.String())
	}
	return res, problems
}

// longestGap is the longest time between the starts of two provider
// calls in a row.
func longestGap(calls []providerCall) time.Duration {
	starts := make([]time.Time, 0, len(calls))
	for _, c := range calls {
		if c.Prompt != "" {
			starts = append(starts, c.Start)
		}
	}
	slices.SortFunc(starts, time.Time.Compare)
	var gap time.Duration
	for i := 1; i < len(starts); i++ {
		gap = max(gap, starts[i].Sub(starts[i-1]))
	}
	return gap
}

// servedBy counts the completed requests by the provider that answered.
func (f *faultRun) servedBy() map[string]int {
	m := map[string]int{}
	for i := range f.reqs {
		if r := &f.reqs[i]; r.final.Status == job.StatusCompleted && r.final.Result != nil {
			m[string(r.final.Result.Provider)]++
		}
	}
	return m
}

// logLines returns up to n lines that mention id from every process log
// (in start order), each headed by the log's name.
func (f *faultRun) logLines(id string, n int) []string {
	f.sys.mu.Lock()
	procs := slices.Clone(f.sys.procs)
	f.sys.mu.Unlock()
	var out []string
	for _, p := range procs {
		fh, err := os.Open(p.logPath)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			if strings.Contains(sc.Text(), id) {
				line := sc.Text()
				if len(line) > 600 {
					line = line[:600] + "…"
				}
				out = append(out, filepath.Base(p.logPath)+": "+line)
				if len(out) >= n {
					_ = fh.Close()
					return out
				}
			}
		}
		_ = fh.Close()
	}
	return out
}

// reportFault appends line to $BULWARK_FAULT_REPORT, if set.
func reportFault(line string) error {
	path := os.Getenv(faultReportEnv)
	if path == "" {
		return nil
	}
	fh, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("storm: %s: %w", faultReportEnv, err)
	}
	_, err = fh.WriteString(line + "\n")
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("storm: %s: %w", faultReportEnv, err)
	}
	return nil
}

// mockFaults manages the mock's injected faults (POST, GET and DELETE
// /mock/faults).
type mockFaults struct {
	client *http.Client
	url    string
}

func (m mockFaults) add(ctx context.Context, f mockprovider.Fault) error {
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("storm: fault: %w", err)
	}
	return setFault(ctx, m.client, m.url, string(b))
}

// pending returns the faults in force.
func (m mockFaults) pending(ctx context.Context) ([]mockprovider.Fault, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.url+"/mock/faults", nil)
	if err != nil {
		return nil, fmt.Errorf("storm: list faults: %w", err)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("storm: list faults: %w", err)
	}
	defer resp.Body.Close()
	var out struct {
		Faults []mockprovider.Fault `json:"faults"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("storm: list faults: HTTP %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("storm: list faults: %w", err)
	}
	return out.Faults, nil
}

func (m mockFaults) clear(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, m.url+"/mock/faults", nil)
	if err != nil {
		return fmt.Errorf("storm: clear faults: %w", err)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return fmt.Errorf("storm: clear faults: %w", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("storm: clear faults: HTTP %d", resp.StatusCode)
	}
	return nil
}

// readiness is GET /readyz's answer.
type readiness struct {
	Code     int               `json:"-"`
	Ready    bool              `json:"ready"`
	Degraded []string          `json:"degraded"`
	Checks   map[string]string `json:"checks"`
}

// String is the answer on one line, for the test log.
func (r readiness) String() string {
	checks := make([]string, 0, len(r.Checks))
	for _, k := range slices.Sorted(maps.Keys(r.Checks)) {
		checks = append(checks, k+"="+r.Checks[k])
	}
	return fmt.Sprintf("HTTP %d ready=%v degraded=%v checks={%s}", r.Code, r.Ready, r.Degraded, strings.Join(checks, ","))
}

// degradedWithout reports whether the answer is the API serving without
// dep: 200, ready, dep alone degraded and down, Redis ok.
func (r readiness) degradedWithout(dep string) bool {
	return r.Code == http.StatusOK && r.Ready && slices.Equal(r.Degraded, []string{dep}) &&
		r.Checks[dep] == "down" && r.Checks["redis"] == "ok"
}

// healthy reports whether the answer is 200, ready, nothing degraded and
// every check ok.
func (r readiness) healthy() bool {
	if r.Code != http.StatusOK || !r.Ready || len(r.Degraded) > 0 || len(r.Checks) == 0 {
		return false
	}
	for _, v := range r.Checks {
		if v != "ok" {
			return false
		}
	}
	return true
}

// readyz reads GET /readyz of the api at apiURL, with the admin token:
// without it the answer is the status alone, and the faults read which
// dependency is down or degraded.
func readyz(ctx context.Context, client *http.Client, apiURL string) (readiness, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/readyz", nil)
	if err != nil {
		return readiness{}, fmt.Errorf("storm: readyz: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := client.Do(req)
	if err != nil {
		return readiness{}, fmt.Errorf("storm: readyz: %w", err)
	}
	defer resp.Body.Close()
	r := readiness{Code: resp.StatusCode}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return r, fmt.Errorf("storm: readyz: HTTP %d: %w", resp.StatusCode, err)
	}
	return r, nil
}

// awaitReadyz polls /readyz every 250 ms until an answer satisfies ok, and
// returns it with when it came; on timeout the error names the last
// answer.
func awaitReadyz(ctx context.Context, client *http.Client, apiURL string, within time.Duration,
	ok func(readiness) bool) (readiness, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var last readiness
	var lastErr error
	for {
		last, lastErr = readyz(ctx, client, apiURL)
		if lastErr == nil && ok(last) {
			return last, time.Now(), nil
		}
		if !sleep(ctx, 250*time.Millisecond) {
			if lastErr != nil {
				return last, time.Time{}, fmt.Errorf("storm: /readyz within %s: %w", within, lastErr)
			}
			return last, time.Time{}, fmt.Errorf("storm: /readyz within %s: the last answer was %s", within, last)
		}
	}
}
