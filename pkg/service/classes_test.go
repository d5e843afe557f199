package service_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"bulwark/pkg/alert"
	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/mockprovider"
)

// How the worker handles each class of provider error, end to end: API
// process, worker process, mock provider over HTTP, real Redis and
// PostgreSQL.

// adminKeys returns GET /admin/keys by key id.
func adminKeys(t testing.TB, api *apiProc) map[string]map[string]any {
	t.Helper()
	code, out, _ := call(t, "GET", api.ts.URL+"/admin/keys", adminToken, nil)
	if code != http.StatusOK {
		t.Fatalf("GET /admin/keys: %d %v", code, out)
	}
	if leaked := secretsIn(fmt.Sprint(out)); len(leaked) > 0 {
		t.Fatalf("/admin/keys shows key values %v", leaked)
	}
	list, _ := out["keys"].([]any)
	m := map[string]map[string]any{}
	for _, k := range list {
		km := k.(map[string]any)
		m[km["id"].(string)] = km
	}
	return m
}

// coolingUntil parses a key's cooling_until, zero when absent.
func coolingUntil(t testing.TB, k map[string]any) time.Time {
	t.Helper()
	s, ok := k["cooling_until"].(string)
	if !ok {
		return time.Time{}
	}
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("cooling_until %q: %v", s, err)
	}
	return ts
}

// assertNotCooling fails if any of the keys is cooling, counts 429s or is
// disabled.
func assertNotCooling(t testing.TB, keys map[string]map[string]any, ids ...string) {
	t.Helper()
	for _, id := range ids {
		k := keys[id]
		if k == nil {
			t.Fatalf("key %s missing from /admin/keys", id)
		}
		if k["cooling_until"] != nil || k["consecutive_429s"] != 0.0 || k["disabled"] != false {
			t.Fatalf("key %s: cooling_until %v, consecutive_429s %v, disabled %v; want none, 0, false",
				id, k["cooling_until"], k["consecutive_429s"], k["disabled"])
		}
	}
}

// collect reads a request's events until its terminal one.
func collect(t testing.TB, ch <-chan sseEvent, timeout time.Duration) []sseEvent {
	t.Helper()
	deadline := time.After(timeout)
	var evs []sseEvent
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("stream ended without a terminal event after %v", eventTypes(evs))
			}
			evs = append(evs, ev)
			switch ev.Type {
			case "completed", "failed", "cancelled":
				return evs
			}
		case <-deadline:
			t.Fatalf("no terminal event within %s; got %v", timeout, eventTypes(evs))
		}
	}
}

func eventTypes(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

func eventsOf(evs []sseEvent, typ string) []sseEvent {
	var out []sseEvent
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// run submits body and returns its events up to the terminal one.
func (p *apiProc) run(t testing.TB, body map[string]any) (string, []sseEvent) {
	t.Helper()
	id := p.submit(t, body)
	ch, _ := stream(t, p.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
	return id, collect(t, ch, 12*time.Second)
}

// servedBy checks the terminal event is completed, served by provider.
func servedBy(t testing.TB, evs []sseEvent, provider string) {
	t.Helper()
	last := evs[len(evs)-1]
	res, _ := last.Data["result"].(map[string]any)
	if last.Type != "completed" || res["provider"] != provider {
		t.Fatalf("ended %s %v (events %v), want completed by %s", last.Type, last.Data, eventTypes(evs), provider)
	}
}

func injected(s *system, apiKey string, mode mockprovider.FaultMode) int64 {
	return s.mock.Stats().Keys[mockprovider.Fingerprint(apiKey)].Injected[mode]
}

// A 429 cools the key for max(2s, Retry-After), the other key of the tier
// answers, and the caller is told the request is retrying.
func TestRateLimitCoolsKeyHonouringRetryAfter(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultRateLimit, Count: 1,
		RetryAfter: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, evs := api.run(t, ask("rate limited once"))
	servedBy(t, evs, "claude")
	retry := eventsOf(evs, "retrying")
	if len(retry) != 1 || retry[0].Data["error"] != "rate limited" {
		t.Fatalf("retrying events %v; want one \"rate limited\" (events %v)", retry, eventTypes(evs))
	}
	if len(eventsOf(evs, "fallback")) != 0 {
		t.Fatalf("fell back although the other claude key was free: %v", eventTypes(evs))
	}

	keys := adminKeys(t, api)
	apiKeys := map[string]string{"claude-sonnet-1": "mock-claude-key-1", "claude-sonnet-2": "mock-claude-key-2"}
	var cooled, other string
	for id := range apiKeys {
		if keys[id]["consecutive_429s"] == 1.0 {
			cooled = id
		} else {
			other = id
		}
	}
	if cooled == "" || other == "" {
		t.Fatalf("want exactly one key with consecutive_429s 1: %v / %v", keys["claude-sonnet-1"], keys["claude-sonnet-2"])
	}
	until := coolingUntil(t, keys[cooled])
	if lo, hi := start.Add(4800*time.Millisecond), time.Now().Add(5500*time.Millisecond); until.Before(lo) || until.After(hi) {
		t.Fatalf("%s cooling until %s: %.1fs after the submission; want about Retry-After 5s",
			cooled, until.Format(time.RFC3339Nano), until.Sub(start).Seconds())
	}
	assertNotCooling(t, keys, other)
	if n := injected(s, apiKeys[cooled], mockprovider.FaultRateLimit); n != 1 {
		t.Fatalf("%s saw %d injected 429s, want 1", cooled, n)
	}
	if ok := s.mock.Stats().Keys[mockprovider.Fingerprint(apiKeys[other])].OK; ok != 1 {
		t.Fatalf("%s answered %d requests, want 1", other, ok)
	}
}

// A key out of quota (OpenAI insufficient_quota, Anthropic's spend limit;
// both come as 429) is disabled, not cooled; another key or the fallback
// answers; a key_quota_exhausted alert names the key id and never its
// value; an operator re-enables it.
func TestQuotaDisablesKeyAndAlerts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		provider string
		mode     mockprovider.FaultMode
		body     map[string]any
		keys     map[string]string // the route's key ids → values
		servedBy string
		reason   string
	}{
		{name: "anthropic spend limit", provider: "claude", mode: mockprovider.FaultSpendLimit,
			body: ask("spend limit"), keys: map[string]string{"claude-sonnet-1": "mock-claude-key-1", "claude-sonnet-2": "mock-claude-key-2"},
			servedBy: "claude", reason: "enforced_spend_limit_reached"},
		{name: "openai insufficient_quota", provider: "openai", mode: mockprovider.FaultInsufficientQuota,
			body: map[string]any{"provider": "openai", "model_tier": "gpt4o", "messages": []map[string]any{{"role": "user", "content": "no quota"}}},
			keys: map[string]string{"openai-gpt4o-1": "mock-openai-key-a"}, servedBy: "claude", reason: "insufficient_quota"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
			hooks := s.withAlerts()
			api := s.startAPI()
			s.startWorker()
			if err := s.mock.SetFault(mockprovider.Fault{Provider: tc.provider, Mode: tc.mode, Count: 1}); err != nil {
				t.Fatal(err)
			}
			_, evs := api.run(t, tc.body)
			servedBy(t, evs, tc.servedBy)
			if r := eventsOf(evs, "retrying"); len(r) != 1 || !strings.Contains(fmt.Sprint(r[0].Data["error"]), "quota") {
				t.Fatalf("retrying events %v, want one naming the quota", r)
			}

			keys := adminKeys(t, api)
			var off []string
			for id := range tc.keys {
				k := keys[id]
				if k["disabled"] == true {
					off = append(off, id)
					if reason, _ := k["disabled_reason"].(string); !strings.Contains(reason, "quota") || !strings.Contains(reason, tc.reason) {
						t.Fatalf("%s disabled_reason %q, want quota (%s)", id, reason, tc.reason)
					}
				}
				if k["cooling_until"] != nil || k["consecutive_429s"] != 0.0 {
					t.Fatalf("%s cools after a quota error: %v", id, k)
				}
			}
			if len(off) != 1 {
				t.Fatalf("disabled keys %v, want exactly one", off)
			}
			disabled := off[0]
			if n := injected(s, tc.keys[disabled], tc.mode); n != 1 {
				t.Fatalf("%s saw %d injected %s answers, want 1", disabled, n, tc.mode)
			}

			a := hooks.wait(t, alert.KindKeyQuotaExhausted, disabled, 5*time.Second)
			if !strings.Contains(a.Summary, disabled) || a.Text == "" {
				t.Fatalf("alert does not name %s: %+v", disabled, a)
			}
			for _, got := range hooks.all() {
				if leaked := secretsIn(got.Raw); len(leaked) > 0 {
					t.Fatalf("alert carries key values %v: %s", leaked, got.Raw)
				}
			}
			if leaked := secretsIn(s.logs.String()); len(leaked) > 0 {
				t.Fatalf("logs carry key values %v", leaked)
			}

			if code, out, _ := call(t, "POST", api.ts.URL+"/admin/keys/"+disabled+"/enable", adminToken, nil); code != http.StatusOK {
				t.Fatalf("enable %s: %d %v", disabled, code, out)
			}
			assertNotCooling(t, adminKeys(t, api), disabled)
			// The re-enabled key serves again (for openai/gpt4o it is the
			// route's only key, so the answer must come from it).
			body := map[string]any{}
			for k, v := range tc.body {
				body[k] = v
			}
			body["messages"] = []map[string]any{{"role": "user", "content": "after enable"}}
			_, evs = api.run(t, body)
			servedBy(t, evs, tc.provider)
		})
	}
}

// Anthropic's 529 overloaded is the provider's problem, not the key's:
// the request goes to the other provider at once, and no claude key cools.
func TestOverloadedFailsOverWithoutCooldown(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	_, evs := api.run(t, ask("overloaded"))
	servedBy(t, evs, "openai")
	if res := evs[len(evs)-1].Data["result"].(map[string]any); res["model_tier"] != "gpt4o" {
		t.Fatalf("served tier %v, want gpt4o", res["model_tier"])
	}
	if fb := eventsOf(evs, "fallback"); len(fb) != 1 || fb[0].Data["from"] != "claude/sonnet" {
		t.Fatalf("fallback events %v", fb)
	}
	// One call: another claude key would fare no better.
	if n := s.mock.Stats().Providers["claude"].Injected[mockprovider.FaultOverloaded]; n != 1 {
		t.Fatalf("claude answered %d overloaded, want 1 call before failing over", n)
	}
	assertNotCooling(t, adminKeys(t, api), "claude-sonnet-1", "claude-sonnet-2")
}

// A 5xx is transient: the worker backs off and tries again (another key),
// with no cooldown; when every claude call fails, the fallback answers.
func TestServerErrorRetriesWithoutCooldown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		count    int
		servedBy string
		calls    int64 // 5xx answers claude gives
	}{
		{name: "once", count: 1, servedBy: "claude", calls: 1},
		{name: "every call", count: 0, servedBy: "openai", calls: 4}, // dispatch.Config.MaxKeyTries
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
			api := s.startAPI()
			s.startWorker()
			if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultServerError, Count: tc.count}); err != nil {
				t.Fatal(err)
			}
			id, evs := api.run(t, ask("server error "+tc.name))
			servedBy(t, evs, tc.servedBy)
			if n := s.mock.Stats().Providers["claude"].Injected[mockprovider.FaultServerError]; n != tc.calls {
				t.Fatalf("claude answered %d 5xx, want %d", n, tc.calls)
			}
			if out := api.waitStatus(t, id, time.Second, "completed"); out["attempts"] != 1.0 {
				t.Fatalf("attempts %v, want 1 (retried within the attempt)", out["attempts"])
			}
			assertNotCooling(t, adminKeys(t, api), "claude-sonnet-1", "claude-sonnet-2")
		})
	}
}

// Any other 4xx is the request's fault: it fails at once, without retry or
// fallback; the caller gets a generic error, and the message the provider
// echoed the key in reaches no one with the key in it.
func TestPermanentErrorFailsAtOnce(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	var calls atomic.Int64
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("request-id", "req_bad")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"type":"error","error":{"type":"invalid_request_error","message":"messages.0.content: unsupported block for key %s"}}`,
			r.Header.Get("x-api-key"))
	}))
	t.Cleanup(bad.Close)
	p := s.cfg.Providers[llm.ProviderClaude]
	p.BaseURL = bad.URL
	s.cfg.Providers[llm.ProviderClaude] = p
	api := s.startAPI()
	s.startWorker()

	id, evs := api.run(t, ask("a request the provider rejects"))
	last := evs[len(evs)-1]
	if last.Type != "failed" {
		t.Fatalf("ended %s, want failed (events %v)", last.Type, eventTypes(evs))
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the provider was called %d times, want 1", n)
	}
	if n := s.mock.Stats().Total().Requests; n != 0 {
		t.Fatalf("fell back to openai (%d calls) on a permanent error", n)
	}
	if r := eventsOf(evs, "retrying"); len(r) != 0 {
		t.Fatalf("retried a permanent error: %v", eventTypes(evs))
	}
	out := api.waitStatus(t, id, time.Second, "failed")
	reason, _ := out["error"].(string)
	if out["attempts"] != 1.0 || out["error"] == nil || strings.Contains(reason, "messages.0.content") || !strings.Contains(reason, id) {
		t.Fatalf("status %v: attempts %v, error %q; want 1 attempt and a generic error naming the request (the provider's message is for operators)",
			out["status"], out["attempts"], reason)
	}
	for what, text := range map[string]string{"GET error": reason, "failed event": fmt.Sprint(last.Data), "logs": s.logs.String()} {
		if leaked := secretsIn(text); len(leaked) > 0 {
			t.Fatalf("%s carries key values %v: %s", what, leaked, reason)
		}
	}
	assertNotCooling(t, adminKeys(t, api), "claude-sonnet-1", "claude-sonnet-2")
}

// With every route answering 429 the request waits (not fails) for the
// earliest capacity and completes once the providers recover; a request
// whose queue_max_wait runs out first fails with deadline_exceeded.
func TestAllRoutesExhaustedWaits(t *testing.T) {
	t.Parallel()
	fault := func(s *system) {
		for _, p := range []string{"claude", "openai"} {
			if err := s.mock.SetFault(mockprovider.Fault{Provider: p, Mode: mockprovider.FaultRateLimit, RetryAfter: 2 * time.Second}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("completes after recovery", func(t *testing.T) {
		t.Parallel()
		s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
		api := s.startAPI()
		s.startWorker()
		fault(s)
		id := api.submit(t, ask("everything is rate limited"))
		ch, _ := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
		w := next(t, ch, 10*time.Second, "waiting", "completed", "failed")
		if ra, _ := w.Data["retry_after_seconds"].(float64); w.Type != "waiting" || ra < 1 {
			t.Fatalf("event %s %v, want waiting with retry_after_seconds >= 1", w.Type, w.Data)
		}
		if out := api.waitStatus(t, id, time.Second, "waiting"); out["retry_at"] == nil {
			t.Fatalf("waiting without retry_at: %v", out)
		}
		s.mock.ClearFaults()
		if ev := next(t, ch, 10*time.Second, "completed", "failed"); ev.Type != "completed" {
			t.Fatalf("after recovery: %s %v", ev.Type, ev.Data)
		}
		// One round of 429s is one failure of the all-providers breaker: a
		// request woken before capacity returned would count more, and
		// three open it (60 s by default).
		if st := breakerState(t, api, "all"); st != "closed" {
			t.Fatalf("all-providers breaker %q after one round of 429s", st)
		}
	})
	t.Run("fails at queue_max_wait", func(t *testing.T) {
		t.Parallel()
		s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
		// Long enough for one wait (2 s, rounded up to a whole second), too
		// short for the second (4 s: the cooldown doubles).
		s.cfg.Queue.MaxWait = 4 * time.Second
		api := s.startAPI()
		s.startWorker()
		fault(s)
		_, evs := api.run(t, ask("never recovers"))
		if len(eventsOf(evs, "waiting")) == 0 {
			t.Fatalf("no waiting event before the deadline: %v", eventTypes(evs))
		}
		last := evs[len(evs)-1]
		if last.Type != "failed" || !strings.Contains(fmt.Sprint(last.Data["error"]), "deadline_exceeded") {
			t.Fatalf("ended %s %v, want failed with deadline_exceeded", last.Type, last.Data)
		}
	})
}
