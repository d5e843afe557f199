package storm

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"bulwark/pkg/job"
	"bulwark/pkg/testkit/mockprovider"
)

// Causes that end a scenario's load early.
var (
	errLimit = errors.New("storm: the scenario's time limit passed")
)

// outcome is what happened to one request. Written by the one client that
// sent it; read after every client has returned.
type outcome struct {
	sent      bool
	sentAt    time.Time
	doneAt    time.Time // when the correct answer arrived
	ok        bool
	reason    string // why not ok
	resubmits int
	// cached is how Bulwark says it answered: none (a provider call),
	// exact, semantic or coalesced.
	cached string
	// route is the route that served the answer ("provider/tier"), when
	// Bulwark says.
	route string

	// prio is the priority it was sent with; id Bulwark's request id
	// (async: from the 202; compat: X-Bulwark-Request-Id), "" when none
	// came back; endedAt when its client was done with it (answered,
	// failed, cut).
	prio    string
	endedAt time.Time

	// Async only.
	critical  bool
	startedAt time.Time // first `started` event
	id        string
	estimates []estimate
}

// ended reports whether the request ended at its client for a reason of
// its own: answered, or failed — not cut at the time limit or
// interrupted.
func (o outcome) ended() bool {
	if o.ok {
		return true
	}
	switch o.reason {
	case "", "cut", "cancelled", "process_exited":
		return false
	}
	return !o.endedAt.IsZero()
}

// estimate is one queue estimate a client received.
type estimate struct {
	value    time.Duration
	at       time.Time // when it arrived
	first    bool      // the request's first estimate
	real     time.Duration
	resolved bool // a `started` event followed
}

// driver sends a scenario's requests.
type driver struct {
	sc     Scenario
	http   *http.Client
	apiURL string
	// apiURLs are every api process's base URL; on(i) aims request i at
	// one of them. Empty: apiURL serves every request.
	apiURLs []string
	prompts []string
}

// on returns the driver of request i: aimed at the api processes in turn
// (round robin), its submission, events and polls all on that one.
func (d *driver) on(i int) *driver {
	if len(d.apiURLs) < 2 {
		return d
	}
	c := *d
	c.apiURL = d.apiURLs[i%len(d.apiURLs)]
	return &c
}

// Run runs one scenario on fresh processes, Redis and database, and returns
// what it measured. The error reports a harness failure (a process that
// would not start or exited during the run); the Result is then partial.
func Run(ctx context.Context, env Env, sc Scenario) (res Result, err error) {
	res = Result{Scenario: sc.Name, Total: sc.Requests, Limit: sc.Limit, MockWindow: env.Bins.MockWindow || sc.Mixed,
		async: sc.Mode == Async, mixed: sc.Mixed, procs: sc.APIs > 0 || sc.Workers > 0}
	transport := &http.Transport{MaxIdleConnsPerHost: 2*sc.Clients + 16, IdleConnTimeout: 30 * time.Second}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	o := options{APIs: sc.APIs, Workers: sc.Workers}
	var calls *callLog // the fleet's recording proxy: each call's own duration
	if sc.Fleet {
		calls = newCallLog()
		defer calls.close() // after the system's processes are stopped
		o.ProviderURL = calls.url
	}
	sys, err := startSystemWith(ctx, env, sc, client, o)
	if err != nil {
		return res, err
	}
	defer func() {
		res.Logs = sys.tails(30)
		if env.KeepDir {
			res.Dir = sys.dir
		}
		if cerr := sys.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	// The load ends when every request is done, at the limit, or when a
	// process exits on its own.
	loadCtx, cancelLoad := context.WithCancelCause(ctx)
	defer cancelLoad(nil)
	stopAfter := context.AfterFunc(sys.ctx, func() { cancelLoad(context.Cause(sys.ctx)) })
	defer stopAfter()

	watch := newBreakerWatch(client, sys.apiURL)
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watchWG sync.WaitGroup
	watchWG.Go(func() { watch.run(watchCtx) })
	defer func() { stopWatch(); watchWG.Wait() }()

	if sc.FailPrimary {
		if err := setFault(ctx, client, sys.mockURL, `{"provider":"openai","mode":"rate_limit","retry_after":"1s"}`); err != nil {
			return res, err
		}
	}
	d := &driver{sc: sc, http: client, apiURL: sys.apiURL, apiURLs: sys.apiURLs, prompts: sc.prompts()}
	outcomes := make([]outcome, sc.Requests)
	limitCtx, cancelLimit := context.WithTimeoutCause(loadCtx, sc.Limit, errLimit)
	defer cancelLimit()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range sc.Clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= sc.Requests || limitCtx.Err() != nil {
					return
				}
				if sc.Mode == Async {
					outcomes[i] = d.on(i).async(limitCtx, i)
				} else {
					outcomes[i] = d.on(i).chat(limitCtx, i)
				}
				outcomes[i].endedAt = time.Now()
			}
		})
	}
	wg.Wait()
	cause := context.Cause(limitCtx)
	res.Cut = errors.Is(cause, errLimit)

	// Read the counters before anything else happens: when the load was
	// cut, requests still queued go on calling the provider. Read them
	// even when ctx was cancelled (an interrupted run still reports).
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	stats, serr := mockStats(sctx, client, sys.mockURL)
	var werr error
	if res.procs {
		res.WorkerCalls, werr = sys.workerCalls(sctx, client)
	}
	stopWatch()
	watchWG.Wait()
	watch.poll(sctx)
	res.BreakerOpenings, res.OpenedBreakers, res.OpeningsByName, res.BreakerPollErrors = watch.result()
	res.summarise(outcomes, d.prompts, sc.capacity())
	if sc.Fleet {
		res.Fleet = fleetResult(sctx, sys.databaseDSN(), outcomes, d.prompts, calls.snapshot(), sc)
	}
	if env.EstimatesDir != "" && sc.Mode == Async {
		if err := writeEstimates(filepath.Join(env.EstimatesDir, sc.Name+"-estimates.csv"), outcomes); err != nil {
			return res, err
		}
	}
	if serr == nil {
		t := stats.Total()
		// Chat calls only (the local embedder makes no embeddings calls;
		// were one configured, its calls would not be LLM calls).
		res.ProviderCalls, res.Provider429, res.Busy = t.Requests-t.Embeddings, t.RateLimited, t.Busy
		if res.Sent > 0 {
			res.CallsPerRequest = float64(res.ProviderCalls) / float64(res.Sent)
		}
		res.MaxInFlight = t.MaxInFlight
		if sc.Mixed {
			res.mixedStats(stats)
		} else {
			res.poolStats(sc, stats)
		}
	}
	if sc.Mixed && res.Wall > 0 {
		// The cloud keys' share of their capacity: the local route has
		// no rate to compare with.
		res.Goodput = float64(res.Answered-res.Routes[mixedLocalRoute]) / (res.Wall.Seconds() * MixedCloudCapacity())
	}
	switch {
	case cause != nil && !res.Cut && !errors.Is(cause, context.Canceled):
		return res, cause // a process exited
	case ctx.Err() != nil:
		return res, context.Cause(ctx)
	case serr != nil:
		return res, serr
	case werr != nil:
		return res, werr
	}
	return res, nil
}

// summarise fills the result from the outcomes.
// capacity is the keys' requests per second, goodput's denominator.
func (r *Result) summarise(outcomes []outcome, prompts []string, capacity float64) {
	r.Lost, r.Served, r.Routes = map[string]int{}, map[string]int{}, map[string]int{}
	distinct := map[string]bool{}
	called := map[string]int{} // provider-answered requests per prompt
	var first, last time.Time
	var lat, critical []time.Duration
	var etaAll, etaFirst []float64
	for i, o := range outcomes {
		if !o.sent {
			r.Lost["not_sent"]++
			continue
		}
		r.Sent++
		distinct[prompts[i]] = true
		r.Resubmits += o.resubmits
		if first.IsZero() || o.sentAt.Before(first) {
			first = o.sentAt
		}
		if o.ok {
			r.Answered++
			r.Served[cmp.Or(o.cached, "unknown")]++
			r.Routes[cmp.Or(o.route, "unknown")]++
			if o.cached == "none" {
				called[prompts[i]]++
			}
			lat = append(lat, o.doneAt.Sub(o.sentAt))
			if o.doneAt.After(last) {
				last = o.doneAt
			}
		} else {
			if o.reason == reasonWrong {
				r.Wrong++
			}
			r.Lost[o.reason]++
		}
		if o.critical && !o.startedAt.IsZero() {
			critical = append(critical, o.startedAt.Sub(o.sentAt))
		}
	}
	// Estimates made before any call finished know no call latency: the
	// first wave of a cold start is reported apart ("warm" excludes it).
	var firstDone time.Time
	for _, o := range outcomes {
		if o.ok && (firstDone.IsZero() || o.doneAt.Before(firstDone)) {
			firstDone = o.doneAt
		}
	}
	var etaWarm []float64
	var absAll, absFirst []time.Duration
	r.ETAStarved, r.ETALate = 0, 0
	for _, o := range outcomes {
		for _, e := range o.estimates {
			switch {
			case e.resolved:
			case !o.startedAt.IsZero():
				// Arrived after the request's last `started` event, none
				// following: it had already started, so no wait remained.
				e.real = 0
				r.ETALate++
			case o.sent && !o.endedAt.IsZero():
				// Never started: counted against the wait until the
				// request's end, which the real wait is at least.
				e.real = max(0, o.endedAt.Sub(e.at))
				r.ETAStarved++
			default:
				continue
			}
			err := etaError(e.value, e.real)
			etaAll = append(etaAll, err)
			abs := (e.value - e.real).Abs()
			absAll = append(absAll, abs)
			if e.first {
				etaFirst = append(etaFirst, err)
				absFirst = append(absFirst, abs)
				if !firstDone.IsZero() && e.at.After(firstDone) {
					etaWarm = append(etaWarm, err)
				}
			}
		}
	}
	r.DistinctPrompts = len(distinct)
	for _, n := range called {
		if n > 1 {
			r.PromptsCalledTwice++
		}
	}
	if r.Answered > 0 {
		r.Wall = last.Sub(first)
		if r.Wall > 0 {
			r.Goodput = float64(r.Answered) / (r.Wall.Seconds() * capacity)
		}
		r.P50, r.P99 = percentile(lat, 0.50), percentile(lat, 0.99)
	}
	r.SteadyRate = steadyRate(outcomes)
	r.CriticalWaits = len(critical)
	r.CriticalP99 = percentile(critical, 0.99)
	r.ETA, r.ETAFirst, r.ETAFirstWarm = errorStats(etaAll), errorStats(etaFirst), errorStats(etaWarm)
	r.ETAAbs, r.ETAFirstAbs = absStats(absAll), absStats(absFirst)
}

// steadyRate is the rate of correct answers between the 25th and the
// 90th percentile of their arrival times, per second: the throughput
// once the keys' full buckets have spent their first burst (a second of
// capacity, which more tasks than the keys serve drain in a second or
// two) and before the last clients run out of requests. 0 with fewer
// than 10 answers.
func steadyRate(outcomes []outcome) float64 {
	var done []time.Time
	for _, o := range outcomes {
		if o.ok {
			done = append(done, o.doneAt)
		}
	}
	if len(done) < 10 {
		return 0
	}
	slices.SortFunc(done, time.Time.Compare)
	lo, hi := len(done)/4, len(done)-1-len(done)/10
	span := done[hi].Sub(done[lo])
	if span <= 0 {
		return 0
	}
	return float64(hi-lo) / span.Seconds()
}

// reasonWrong marks an answer that is not mockprovider.Reply(prompt).
const reasonWrong = "wrong_answer"

// abortReason names why a request's context ended.
func abortReason(ctx context.Context) string {
	if errors.Is(context.Cause(ctx), errLimit) {
		return "cut"
	}
	if errors.Is(context.Cause(ctx), errExited) {
		return "process_exited"
	}
	return "cancelled"
}

// failReason names a transport error or, if the context ended, why.
func failReason(ctx context.Context, what string) string {
	if ctx.Err() != nil {
		return abortReason(ctx)
	}
	return what
}

// send POSTs body as JSON with the tenant token and extra headers, and
// returns the status, headers and body.
func (d *driver) send(ctx context.Context, method, path string, body any, hdr map[string]string) (int, http.Header, []byte, error) {
	var rd io.Reader
	if body != nil {
		js, err := json.Marshal(body)
		if err != nil {
			return 0, nil, nil, err
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.apiURL+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tenantToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, raw, nil
}

// retryAfter reads Retry-After (seconds), clamped to [100 ms, 5 s].
func retryAfter(h http.Header) time.Duration {
	s, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil {
		return time.Second
	}
	return min(max(time.Duration(s)*time.Second, 100*time.Millisecond), 5*time.Second)
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func messages(prompt string) []map[string]string {
	return []map[string]string{{"role": "user", "content": prompt}}
}

// chat sends request i through POST /v1/chat/completions and waits for the
// answer. A 429 that names a request id (the sync wait ran out) is
// followed by polling that request, as the README tells clients to; a 429
// without one (nothing was taken) is sent again after Retry-After.
func (d *driver) chat(ctx context.Context, i int) outcome {
	prompt := d.prompts[i]
	o := outcome{sent: true, sentAt: time.Now(), prio: d.sc.priorityOf(i)}
	model, layer := d.sc.ask(i)
	body := map[string]any{"model": model, "max_tokens": d.sc.maxTokens(), "messages": messages(prompt)}
	hdr := map[string]string{"X-Bulwark-Priority": o.prio}
	if layer != "" {
		hdr["X-Bulwark-Cache-Layer"] = layer
	}
	for {
		code, h, raw, err := d.send(ctx, http.MethodPost, "/v1/chat/completions", body, hdr)
		if err != nil {
			o.reason = failReason(ctx, "connection_error")
			return o
		}
		if id := h.Get("X-Bulwark-Request-Id"); id != "" {
			o.id = id
		}
		switch {
		case code == http.StatusOK:
			var resp struct {
				Choices []struct {
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
			}
			if json.Unmarshal(raw, &resp) != nil || len(resp.Choices) == 0 {
				o.reason = "bad_answer_body"
				return o
			}
			return d.check(o, prompt, resp.Choices[0].Message.Content, h.Get("X-Bulwark-Cache"),
				routeName(h.Get("X-Bulwark-Provider"), h.Get("X-Bulwark-Model-Tier")))
		case code == http.StatusTooManyRequests && h.Get("X-Bulwark-Request-Id") != "":
			return d.poll(ctx, h.Get("X-Bulwark-Request-Id"), prompt, o)
		case code == http.StatusTooManyRequests:
			if !sleep(ctx, retryAfter(h)) {
				o.reason = abortReason(ctx)
				return o
			}
			o.resubmits++
		default:
			o.reason = "http_" + strconv.Itoa(code)
			return o
		}
	}
}

// check marks o answered when content is the mock's answer to prompt;
// cached is how Bulwark says it answered, route the route that served it.
func (d *driver) check(o outcome, prompt, content, cached, route string) outcome {
	if content != mockprovider.Reply(prompt) {
		o.reason = reasonWrong
		return o
	}
	o.ok, o.doneAt, o.cached, o.route = true, time.Now(), cached, route
	return o
}

// routeName is "provider/tier", or "" when Bulwark named no provider.
func routeName(provider, tier string) string {
	if provider == "" {
		return ""
	}
	return provider + "/" + tier
}

// resultRoute is the route a result names.
func resultRoute(r *job.Result) string { return routeName(string(r.Provider), r.Tier) }

// requestView is the part of GET /v1/requests/{id} the clients read.
type requestView struct {
	ID                   string      `json:"id"`
	Status               job.Status  `json:"status"`
	EstimatedWaitSeconds *int        `json:"estimated_wait_seconds"`
	EstimatedWaitMS      *int64      `json:"estimated_wait_ms"`
	Result               *job.Result `json:"result"`
	Error                string      `json:"error"`
}

// poll fetches GET /v1/requests/{id} every 250 ms until it ends.
func (d *driver) poll(ctx context.Context, id, prompt string, o outcome) outcome {
	for {
		if !sleep(ctx, 250*time.Millisecond) {
			o.reason = abortReason(ctx)
			return o
		}
		code, _, raw, err := d.send(ctx, http.MethodGet, "/v1/requests/"+id, nil, nil)
		if err != nil {
			o.reason = failReason(ctx, "connection_error")
			return o
		}
		var v requestView
		if code != http.StatusOK || json.Unmarshal(raw, &v) != nil {
			o.reason = "http_" + strconv.Itoa(code)
			return o
		}
		switch v.Status {
		case job.StatusCompleted:
			if v.Result == nil {
				o.reason = reasonWrong
				return o
			}
			return d.check(o, prompt, v.Result.Content, string(v.Result.Cached), resultRoute(v.Result))
		case job.StatusFailed, job.StatusCancelled:
			o.reason = string(v.Status) + ":" + errorCode(v.Error)
			return o
		}
	}
}

// errorCode is the leading code of a request's error ("deadline_exceeded:
// waited …" → "deadline_exceeded"), for grouping lost requests.
func errorCode(msg string) string {
	code, _, _ := strings.Cut(msg, ":")
	if code == "" {
		return "unknown"
	}
	return strings.ReplaceAll(code, " ", "_")
}

// async submits request i through POST /v1/requests and follows its events
// until it completes or fails.
func (d *driver) async(ctx context.Context, i int) outcome {
	prompt := d.prompts[i]
	prio := d.sc.priorityOf(i)
	o := outcome{sent: true, sentAt: time.Now(), prio: prio, critical: prio == "critical"}
	body := map[string]any{"provider": "openai", "model_tier": "gpt4o-mini", "priority": prio,
		"max_tokens": d.sc.maxTokens(), "messages": messages(prompt)}
	hdr := map[string]string{"Accept-Language": "en"}
	var v requestView
	for {
		code, h, raw, err := d.send(ctx, http.MethodPost, "/v1/requests", body, hdr)
		if err != nil {
			o.reason = failReason(ctx, "connection_error")
			return o
		}
		if code == http.StatusTooManyRequests {
			if !sleep(ctx, retryAfter(h)) {
				o.reason = abortReason(ctx)
				return o
			}
			o.resubmits++
			continue
		}
		if (code != http.StatusOK && code != http.StatusAccepted) || json.Unmarshal(raw, &v) != nil || v.ID == "" {
			o.reason = "http_" + strconv.Itoa(code)
			return o
		}
		break
	}
	now := time.Now()
	switch {
	case v.Status == job.StatusCompleted: // a cache hit
		if v.Result == nil {
			o.reason = reasonWrong
			return o
		}
		return d.check(o, prompt, v.Result.Content, string(v.Result.Cached), resultRoute(v.Result))
	case v.Status == job.StatusQueued && v.EstimatedWaitSeconds != nil:
		o.estimates = append(o.estimates, estimate{value: waitOf(*v.EstimatedWaitSeconds, v.EstimatedWaitMS), at: now, first: true})
	}
	o.id = v.ID
	return d.follow(ctx, v.ID, prompt, o)
}

// follow reads GET /v1/requests/{id}/events until a terminal event,
// reconnecting with Last-Event-ID if the stream ends early.
func (d *driver) follow(ctx context.Context, id, prompt string, o outcome) outcome {
	lastID := ""
	for {
		if d.stream(ctx, id, prompt, &o, &lastID) {
			return o
		}
		// The stream broke (or the API closed it) before the end:
		// reconnect and get what was missed.
		if !sleep(ctx, 100*time.Millisecond) {
			o.reason = abortReason(ctx)
			return o
		}
	}
}

// stream reads one SSE connection. It reports whether o is final.
func (d *driver) stream(ctx context.Context, id, prompt string, o *outcome, lastID *string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.apiURL+"/v1/requests/"+id+"/events", nil)
	if err != nil {
		o.reason = "bad_request"
		return true
	}
	req.Header.Set("Authorization", "Bearer "+tenantToken)
	req.Header.Set("Accept-Language", "en")
	if *lastID != "" {
		req.Header.Set("Last-Event-ID", *lastID)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		o.reason = "events_http_" + strconv.Itoa(resp.StatusCode)
		return true
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var evID, evType string
	var data []byte
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if evType != "" {
				if evID != "" {
					*lastID = evID
				}
				if d.event(o, prompt, data) {
					return true
				}
			}
			evID, evType, data = "", "", nil
		case strings.HasPrefix(line, "id: "):
			evID = line[len("id: "):]
		case strings.HasPrefix(line, "event: "):
			evType = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data = append(data, line[len("data: "):]...)
		}
	}
	return false
}

// event applies one SSE event to o; it reports whether o is final.
func (d *driver) event(o *outcome, prompt string, data []byte) bool {
	now := time.Now()
	var ev job.Event
	if err := json.Unmarshal(data, &ev); err != nil {
		o.reason = "bad_event"
		return true
	}
	switch ev.Type {
	case job.EventQueued:
		// The stored queued event of the submission carries no position:
		// only position updates are estimates.
		if ev.QueuePosition > 0 {
			ms := ev.EstimatedWaitMS
			o.estimates = append(o.estimates, estimate{value: waitOf(ev.EstimatedWaitSeconds, &ms),
				at: now, first: len(o.estimates) == 0})
		}
	case job.EventStarted:
		at := ev.At
		if at.IsZero() || at.After(now) {
			at = now
		}
		if o.startedAt.IsZero() {
			o.startedAt = at
		}
		for k := range o.estimates {
			if e := &o.estimates[k]; !e.resolved {
				e.real, e.resolved = max(0, at.Sub(e.at)), true
			}
		}
	case job.EventCompleted:
		if ev.Result == nil {
			o.reason = reasonWrong
			return true
		}
		*o = d.check(*o, prompt, ev.Result.Content, string(ev.Result.Cached), resultRoute(ev.Result))
		return true
	case job.EventFailed, job.EventCancelled:
		o.reason = string(ev.Type) + ":" + errorCode(ev.Error)
		return true
	}
	return false
}

// mockStats reads GET /mock/stats.
func mockStats(ctx context.Context, client *http.Client, mockURL string) (mockprovider.Stats, error) {
	var st mockprovider.Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, mockURL+"/mock/stats", nil)
	if err != nil {
		return st, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return st, fmt.Errorf("storm: GET /mock/stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("storm: GET /mock/stats: status %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("storm: GET /mock/stats: %w", err)
	}
	return st, nil
}

// waitOf is an estimate to the millisecond when Bulwark sent
// estimated_wait_ms (a positive value), else its whole seconds.
func waitOf(secs int, ms *int64) time.Duration {
	if ms != nil && *ms > 0 {
		return time.Duration(*ms) * time.Millisecond
	}
	return time.Duration(secs) * time.Second
}

// setFault adds a fault to the mock (POST /mock/faults).
func setFault(ctx context.Context, client *http.Client, mockURL, fault string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, mockURL+"/mock/faults", strings.NewReader(fault))
	if err != nil {
		return fmt.Errorf("storm: set fault: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("storm: set fault: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("storm: set fault: HTTP %d", resp.StatusCode)
	}
	return nil
}

// writeEstimates writes every queue estimate the clients received as CSV,
// one row each: the request's index and id, whether it was critical, when
// it was sent and when the estimate arrived (seconds after the first send),
// the estimated and the real wait (seconds), and whether it was the
// request's first estimate. It is how the ETA model was checked against
// what happened (storm -estimates).
func writeEstimates(path string, outcomes []outcome) error {
	var t0 time.Time
	for _, o := range outcomes {
		if o.sent && (t0.IsZero() || o.sentAt.Before(t0)) {
			t0 = o.sentAt
		}
	}
	var b strings.Builder
	b.WriteString("request,id,critical,sent_s,at_s,estimate_s,real_s,first\n")
	for i, o := range outcomes {
		for _, e := range o.estimates {
			if !e.resolved {
				continue
			}
			fmt.Fprintf(&b, "%d,%s,%t,%.3f,%.3f,%.3f,%.3f,%t\n", i, o.id, o.critical,
				o.sentAt.Sub(t0).Seconds(), e.at.Sub(t0).Seconds(), e.value.Seconds(), e.real.Seconds(), e.first)
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("storm: write the estimates: %w", err)
	}
	return nil
}
