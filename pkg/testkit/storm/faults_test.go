package storm

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/testkit/mockprovider"
)

// The fault matrix: each test runs a storm on its own real processes,
// Redis and database (see faults.go for what is counted and how), breaks
// something mid-storm, and checks (a) every accepted request ended, (b)
// every answer is its own prompt's, (c) no prompt was called again after
// its answer. Each prints one summary line (and appends it to
// $BULWARK_FAULT_REPORT); on a failure it names the requests, their
// statuses and the process log lines that mention them, and keeps the
// system's folder.

// sharedBins holds the binaries, built once for the fault tests;
// TestMain removes them.
var sharedBins struct {
	once sync.Once
	dir  string
	b    Binaries
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedBins.dir != "" {
		_ = os.RemoveAll(sharedBins.dir)
	}
	os.Exit(code)
}

func sharedBinaries(t *testing.T) Binaries {
	t.Helper()
	sharedBins.once.Do(func() {
		if sharedBins.dir, sharedBins.err = os.MkdirTemp("", "bulwark-storm-bin-*"); sharedBins.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		sharedBins.b, sharedBins.err = Build(ctx, sharedBins.dir)
	})
	if sharedBins.err != nil {
		t.Fatal(sharedBins.err)
	}
	return sharedBins.b
}

// faultScenario is a storm of n async requests, each with a prompt of its
// own, with the mock answering after latency±jitter; no cache.
func faultScenario(name string, n int, latency, jitter time.Duration) Scenario {
	return Scenario{Name: name, Requests: n, Clients: n, Mode: Async, Latency: latency, Jitter: jitter}
}

// setupFault starts a fault test's system; at cleanup it stops it,
// keeping its folder when the test failed.
func setupFault(t *testing.T, sc Scenario, o options, compatEvery int) *faultRun {
	t.Helper()
	if testing.Short() {
		t.Skip("fault matrix: real processes under a storm for minutes; skipped under -short")
	}
	if os.Getenv("BULWARK_FAULTS") != "1" {
		// Minutes of real processes each, and timing-sensitive on a loaded
		// machine: run by `make faults`, not by `make test`.
		t.Skip("fault matrix: set BULWARK_FAULTS=1 (make faults)")
	}
	f, err := startFault(t.Context(), Env{Bins: sharedBinaries(t)}, sc, o, compatEvery)
	if err != nil && o.PostgresDown {
		t.Fatalf("with PostgreSQL down at start-up the api and workers must start anyway (/readyz 200, postgres degraded): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dir, err := f.close(t.Failed())
		if err != nil {
			t.Errorf("stopping the system: %v", err)
		}
		if dir != "" {
			t.Logf("config and process logs kept in %s", dir)
		}
	})
	return f
}

// finish verifies the load, prints and reports the summary line, and
// fails the test on every violation.
func finish(t *testing.T, f *faultRun, res FaultResult, problems []string) {
	t.Helper()
	line := res.String()
	t.Log(line)
	if err := reportFault(line); err != nil {
		t.Error(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if t.Failed() {
		t.Log("process logs:\n" + f.sys.tails(25))
	}
}

// verifyCtx bounds the final reads.
func verifyCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestFaultWorkerKilled kills a worker process with SIGKILL while it has
// provider calls in flight, ten times in a row during a storm of 200
// async requests (mock latency 1 s), starting a replacement each time so
// three keep running. asynq gives a dead worker's tasks back once their
// lease (30 s) has been expired for 30 s, on a running worker's
// recoverer (every minute): a kill's requests take about 60–120 s, more
// when a later kill catches them again. Recovery per kill: from the kill
// until every request whose provider call the killed worker had in flight
// ended; the line also gives it for every request the worker held.
func TestFaultWorkerKilled(t *testing.T) {
	t.Parallel()
	const kills, killGap = 10, 2 * time.Second
	sc := faultScenario("F-worker-killed", 200, time.Second, 200*time.Millisecond)
	f := setupFault(t, sc, options{Workers: 3}, 0)
	ctx := t.Context()

	live := map[string]*process{}
	f.sys.mu.Lock()
	for _, p := range f.sys.procs {
		if strings.HasPrefix(p.name, "worker-") {
			live[p.name] = p
		}
	}
	f.sys.mu.Unlock()

	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: f.sys.redisAddr})
	defer func() { _ = insp.Close() }()

	// A kill strands every task its worker had taken (up to the NORMAL
	// cap, 27), not only those mid-call: after about seven kills every
	// request of the storm waits for asynq's recovery, and the last kills
	// catch recovered requests again (two recoveries in a row).
	f.start(ctx, 215*time.Second)
	// The kills stop when the storm is over: no call left to kill.
	kctx, stopKills := context.WithCancel(ctx)
	defer stopKills()
	go func() {
		select {
		case <-f.done:
			stopKills()
		case <-kctx.Done():
		}
	}()
	var done []workerKill
	for len(done) < kills {
		name, err := f.calls.awaitMidCall(kctx, slices.Sorted(maps.Keys(live)))
		if err != nil {
			break
		}
		victim := live[name]
		held, herr := heldTasks(insp, victim.pid())
		k := workerKill{at: time.Now(), worker: name, pid: victim.pid(), held: held, heldErr: herr}
		victim.kill()
		delete(live, name)
		p, url, err := f.sys.startWorker()
		if err != nil {
			t.Fatalf("replacement worker: %v", err)
		}
		if err := waitReady(ctx, p, "GET "+url, httpOK(f.client, url)); err != nil {
			t.Fatalf("replacement worker: %v", err)
		}
		live[p.name] = p
		k.ready = time.Since(k.at)
		done = append(done, k)
		// Kills come no closer together than killGap: a schedule, not a
		// synchronisation.
		if !sleep(kctx, time.Until(k.at.Add(killGap))) {
			break
		}
	}
	stopKills()
	cut := f.wait(ctx)
	f.verify(verifyCtx(t))

	res, problems := f.result(t.Name(), done)
	res.RecoveryWhat = "kill→its mid-call requests ended"
	var heldRec []time.Duration
	held := 0
	for n, kr := range f.recoveries(done, f.calls.snapshot()) {
		again := ""
		if kr.again > 0 {
			again = fmt.Sprintf(" (%d of them mid-call again at a later kill)", kr.again)
		}
		heldText := fmt.Sprintf("%d held in all (its last asynq heartbeat), the last ended %.1fs after the kill%s",
			len(kr.held), kr.heldRecovery.Seconds(), openText(f, kr.heldOpen))
		if kr.kill.heldErr != nil {
			heldText = "held tasks unknown: " + kr.kill.heldErr.Error()
		}
		t.Logf("kill %d: %s (pid %d) at +%.1fs, replacement ready in %.1fs: %d requests mid-call%s, the last ended %.1fs after the kill%s; %s; mid-call: %s",
			n+1, kr.kill.worker, kr.kill.pid, kr.kill.at.Sub(f.began).Seconds(), kr.kill.ready.Seconds(), len(kr.requests), again,
			kr.recovery.Seconds(), openText(f, kr.open), heldText, idsText(f, kr.requests))
		if len(kr.open) > 0 || len(kr.heldOpen) > 0 {
			problems = append(problems, fmt.Sprintf("kill %d (%s): requests it held never ended: %s",
				n+1, kr.kill.worker, idsText(f, kr.heldOpen)))
			continue
		}
		if len(kr.requests) > 0 {
			res.Recovery = append(res.Recovery, kr.recovery)
		}
		if len(kr.held) > 0 {
			heldRec = append(heldRec, kr.heldRecovery)
			held += len(kr.held)
		}
	}
	res.Notes = fmt.Sprintf("kills=%d", len(done))
	if len(heldRec) > 0 {
		res.Notes += fmt.Sprintf(" held_by_killed=%d held_recovery_s=min/median/max %.1f/%.1f/%.1f", held, slices.Min(heldRec).Seconds(),
			percentile(heldRec, 0.5).Seconds(), slices.Max(heldRec).Seconds())
	}
	if len(done) < kills {
		problems = append(problems, fmt.Sprintf("only %d of %d kills: the storm ended (or the test's time ran out) first", len(done), kills))
	}
	if cut != nil {
		problems = append(problems, fmt.Sprintf("the load was cut: %v", cut))
	}
	finish(t, f, res, problems)
}

func openText(f *faultRun, open []int) string {
	if len(open) == 0 {
		return ""
	}
	return fmt.Sprintf(" — but %d never ended: %s", len(open), idsText(f, open))
}

// idsText lists the requests' ids.
func idsText(f *faultRun, idx []int) string {
	ids := make([]string, len(idx))
	for j, i := range idx {
		ids[j] = f.reqs[i].id
	}
	return strings.Join(ids, " ")
}

// TestFaultRedisRestart restarts Redis (append-only file, fsync every
// second) mid-storm: SIGTERM, which flushes the file, then a new
// redis-server on the same port and folder. Every fourth request goes
// through the OpenAI-compatible endpoint. Clients resubmit what was not
// accepted (with the same Idempotency-Key), never what was. Recovery: from
// Redis answering again to the first request ending after it.
func TestFaultRedisRestart(t *testing.T) {
	t.Parallel()
	// stallAfter: a request open at the restart that ends later than this
	// after Redis is back waited for something other than the queue.
	const stallAfter = 30 * time.Second
	sc := faultScenario("F-redis-restart", 200, 500*time.Millisecond, 100*time.Millisecond)
	f := setupFault(t, sc, options{Workers: 2, AppendOnly: true}, 4)
	ctx := t.Context()

	// Room for asynq to give back a task whose end it could not write
	// while Redis was away: lease (30 s) + 30 s + its recoverer's minute.
	f.start(ctx, 240*time.Second)
	if err := f.awaitEnded(ctx, 50); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	down, err := f.sys.restartRedis(ctx)
	if err != nil {
		t.Fatalf("restarting Redis: %v", err)
	}
	back := time.Now()
	cut := f.wait(ctx)
	f.verify(verifyCtx(t))

	res, problems := f.result(t.Name(), nil)
	var first time.Time
	inFlight := 0
	for i := range f.reqs {
		r := &f.reqs[i]
		if !r.endAt.IsZero() && r.endAt.After(back) && (first.IsZero() || r.endAt.Before(first)) {
			first = r.endAt
		}
		if r.id != "" && r.accepted.Before(began) && (r.endAt.IsZero() || r.endAt.After(began)) {
			inFlight++
		}
	}
	res.RecoveryWhat = "redis back→first request ended"
	if !first.IsZero() {
		res.Recovery = []time.Duration{first.Sub(back)}
	}
	// Requests open at the restart that took much longer than the storm's
	// pace: each is named with the log lines that mention it.
	var stalled []int
	for i := range f.reqs {
		r := &f.reqs[i]
		if r.id != "" && r.accepted.Before(began) && (r.endAt.IsZero() || r.endAt.Sub(back) > stallAfter) {
			stalled = append(stalled, i)
		}
	}
	for n, i := range stalled {
		r := &f.reqs[i]
		if r.endAt.IsZero() {
			t.Logf("request %d %s, open at the restart, never ended", i, r.id)
		} else {
			t.Logf("request %d %s, open at the restart, ended %.1fs after Redis was back", i, r.id, r.endAt.Sub(back).Seconds())
		}
		if n < 3 {
			for _, l := range f.logLines(r.id, 8) {
				t.Log("    " + l)
			}
		}
	}
	res.Notes = fmt.Sprintf("redis_restart_at=+%.1fs redis_away=%.2fs accepted_open_at_restart=%d ended_over_%s_after_restart=%d",
		began.Sub(f.began).Seconds(), down.Seconds(), inFlight, stallAfter, len(stalled))
	if cut != nil {
		problems = append(problems, fmt.Sprintf("the load was cut: %v", cut))
	}
	finish(t, f, res, problems)
}

// TestFaultProviderErrors: the provider fails part of the calls for a
// while, or every call for two minutes; requests must still all complete.
func TestFaultProviderErrors(t *testing.T) {
	t.Parallel()
	t.Run("share", testProviderErrorShare)
	t.Run("down", testProviderDown)
}

// testProviderErrorShare: for 15 s the mock answers up to half the calls
// on OpenAI with 500 (server_error) or, one in four, 503 (overloaded) — a
// fault of count 1 is added whenever the previous one has been used, at
// most every 250 ms, while OpenAI alone would carry about 8 calls a
// second — and Claude keys back the fallback route. All requests must complete, the fallback carrying what
// it can. Recovery: from the faults' end to the last request ending.
func testProviderErrorShare(t *testing.T) {
	t.Parallel()
	const faultsFor = 15 * time.Second
	sc := faultScenario("F-provider-share", 200, 300*time.Millisecond, 100*time.Millisecond)
	sc.FallbackKeys = true
	f := setupFault(t, sc, options{Workers: 2}, 0)
	ctx := t.Context()
	mf := mockFaults{client: f.client, url: f.sys.mockURL}

	f.start(ctx, 150*time.Second)
	modes := []mockprovider.FaultMode{mockprovider.FaultServerError, mockprovider.FaultServerError, mockprovider.FaultServerError,
		mockprovider.FaultOverloaded}
	added := 0
	tick := time.NewTicker(250 * time.Millisecond)
	end := time.After(faultsFor)
inject:
	for {
		pending, err := mf.pending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(pending) == 0 {
			if err := mf.add(ctx, mockprovider.Fault{Provider: "openai", Mode: modes[added%len(modes)], Count: 1}); err != nil {
				t.Fatal(err)
			}
			added++
		}
		select {
		case <-end:
			break inject
		case <-f.done:
			break inject
		case <-ctx.Done():
			t.Fatal(context.Cause(ctx))
		case <-tick.C:
		}
	}
	tick.Stop()
	if err := mf.clear(ctx); err != nil {
		t.Fatal(err)
	}
	cleared := time.Now()
	cut := f.wait(ctx)
	f.verify(verifyCtx(t))
	stats, serr := mockStats(verifyCtx(t), f.client, f.sys.mockURL)

	res, problems := f.result(t.Name(), nil)
	res.RecoveryWhat = "faults end→last request ended"
	res.Recovery = []time.Duration{max(0, lastEnd(f).Sub(cleared))}
	served := f.servedBy()
	res.Notes = fmt.Sprintf("served_by={%s} faults_added=%d", countsText(served), added)
	if serr == nil {
		res.Notes += fmt.Sprintf(" openai_injected={%s}", injectedText(stats.Providers["openai"].Injected))
	}
	if served["claude"] == 0 {
		problems = append(problems, "the fallback (Claude) served no request while OpenAI failed about half its calls")
	}
	if cut != nil {
		problems = append(problems, fmt.Sprintf("the load was cut: %v", cut))
	}
	finish(t, f, res, problems)
}

// testProviderDown: once 20 requests have ended, every provider call fails
// for 120 s — on both providers, every other call's connection dropped by
// the proxy and the rest answered 500 by the mock — then the provider
// recovers. The queued requests must wait (queue_max_wait 300 s) and all
// complete after the recovery. Recovery: from the provider's return to
// the last request ending.
func testProviderDown(t *testing.T) {
	t.Parallel()
	const outage = 120 * time.Second
	sc := faultScenario("F-provider-down", 150, 300*time.Millisecond, 100*time.Millisecond)
	sc.FallbackKeys = true
	f := setupFault(t, sc, options{Workers: 2}, 0)
	ctx := t.Context()
	mf := mockFaults{client: f.client, url: f.sys.mockURL}

	f.start(ctx, 290*time.Second)
	if err := f.awaitEnded(ctx, 20); err != nil {
		t.Fatal(err)
	}
	downAt := time.Now()
	f.calls.dropEvery.Store(2)
	if err := mf.add(ctx, mockprovider.Fault{Mode: mockprovider.FaultServerError}); err != nil {
		t.Fatal(err)
	}
	// The outage lasts its time unless the storm ends first (every
	// request ended during it: a finding of its own).
	select {
	case <-time.After(outage):
	case <-f.done:
	case <-ctx.Done():
		t.Fatal(context.Cause(ctx))
	}
	if err := mf.clear(ctx); err != nil {
		t.Fatal(err)
	}
	f.calls.dropEvery.Store(0)
	upAt := time.Now()
	cut := f.wait(ctx)
	f.verify(verifyCtx(t))

	res, problems := f.result(t.Name(), nil)
	res.RecoveryWhat = "provider back→last request ended"
	res.Recovery = []time.Duration{max(0, lastEnd(f).Sub(upAt))}
	during := map[string]int{}
	for i := range f.reqs {
		r := &f.reqs[i]
		if !r.endAt.IsZero() && r.endAt.After(downAt) && r.endAt.Before(upAt) {
			during[string(r.final.Status)]++
		}
	}
	res.Notes = fmt.Sprintf("outage=+%.1fs..+%.1fs ended_during_outage={%s} served_by={%s}", downAt.Sub(f.began).Seconds(),
		upAt.Sub(f.began).Seconds(), countsText(during), countsText(f.servedBy()))
	if cut != nil {
		problems = append(problems, fmt.Sprintf("the load was cut: %v", cut))
	}
	finish(t, f, res, problems)
}

// lastEnd is when the last request ended, as its client saw it.
func lastEnd(f *faultRun) time.Time {
	var last time.Time
	for i := range f.reqs {
		if e := f.reqs[i].endAt; e.After(last) {
			last = e
		}
	}
	return last
}

func injectedText(m map[mockprovider.FaultMode]int64) string {
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[string(k)] = int(v)
	}
	return countsText(c)
}

// The proxy reads the prompt of both wire formats, and repeats finds calls
// after an answer only.
func TestCallLogPromptsAndRepeats(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body, want string
	}{
		{`{"model":"gpt-4o-mini","messages":[{"role":"system","content":"s"},{"role":"user","content":"hello"}]}`, "hello"},
		{`{"model":"claude-haiku-4-5","messages":[{"role":"user","content":[{"type":"text","text":"he"},{"type":"text","text":"llo"}]}]}`, "hello"},
		{`{"model":"x","messages":[{"role":"user","content":"first"},{"role":"assistant","content":"a"}]}`, "first"},
		{`{"input":"embed me"}`, ""},
		{`not json`, ""},
	}
	for _, tt := range tests {
		if got := promptOf([]byte(tt.body)); got != tt.want {
			t.Errorf("promptOf(%s) = %q, want %q", tt.body, got, tt.want)
		}
	}
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	calls := []providerCall{
		{Worker: "w1", Prompt: "a", Start: at(0), End: at(1), Status: 500},
		{Worker: "w1", Prompt: "a", Start: at(2), End: at(3), Status: 200},
		{Worker: "w2", Prompt: "b", Start: at(0), End: at(5), Aborted: true},
		{Worker: "w3", Prompt: "b", Start: at(6), End: at(7), Status: 200},
		{Worker: "w2", Prompt: "a", Start: at(4), End: at(5), Status: 200}, // after a's answer
		{Worker: "w2", Prompt: "c", Start: at(0), End: at(1), Status: 200},
		{Worker: "w1", Prompt: "c", Start: at(0), End: at(2), Status: 200}, // overlapping: not a repeat
	}
	got := repeats(calls)
	if len(got) != 1 || got[0].Again.Prompt != "a" || !got[0].Again.Start.Equal(at(4)) || !got[0].Answered.End.Equal(at(3)) {
		t.Errorf("repeats = %+v, want the one call of a at +4s after its answer at +3s", got)
	}
}

// The proxy forwards a call to the mock and back unchanged, records it,
// and drops the connections it is told to.
func TestCallLogProxy(t *testing.T) {
	t.Parallel()
	mock, err := mockprovider.New(mockprovider.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(mock)
	t.Cleanup(ts.Close)
	l := newCallLog()
	t.Cleanup(l.close)
	base, err := l.url(ts.URL, "worker-1")
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	call := func() (int, string, error) {
		body := `{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"why P0A80?"}]}`
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer k")
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) == 0 {
			return resp.StatusCode, "", fmt.Errorf("decoding the answer: %v", err)
		}
		return resp.StatusCode, out.Choices[0].Message.Content, nil
	}
	code, content, err := call()
	if err != nil || code != http.StatusOK || content != mockprovider.Reply("why P0A80?") {
		t.Fatalf("through the proxy: %d %q %v", code, content, err)
	}
	l.dropEvery.Store(1)
	if _, _, err := call(); err == nil {
		t.Fatal("a dropped call answered")
	}
	got := l.snapshot()
	if len(got) != 2 || got[0].Status != http.StatusOK || got[0].Prompt != "why P0A80?" || got[0].Worker != "worker-1" ||
		!got[1].Dropped || got[1].Status != 0 || l.inFlight("worker-1") != 0 {
		t.Errorf("recorded calls %+v, in flight %d", got, l.inFlight("worker-1"))
	}
}
