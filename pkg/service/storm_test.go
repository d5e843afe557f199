package service_test

import (
	"net/http"
	"testing"
	"time"

	"bulwark/pkg/testkit/mockprovider"
)

// The storm: four keys (two per provider) that the mock meters over 1 s
// windows, as the providers do, offered three times their capacity and
// then a burst of ten times: no breaker opens and the provider sees
// almost no 429; then one provider forced to 429 (fallback carries the
// load); then both (the breakers open, new requests are answered
// service_degraded, and everything completes after recovery). Bounded well
// under a minute.
func TestStorm(t *testing.T) {
	t.Parallel()
	keys := `
keys:
  - {id: c1, provider: claude, model_tier: sonnet, api_key: "storm-c1", rpm_limit: 60, tpm_limit: 1000000}
  - {id: c2, provider: claude, model_tier: sonnet, api_key: "storm-c2", rpm_limit: 60, tpm_limit: 1000000}
  - {id: o1, provider: openai, model_tier: gpt4o, api_key: "storm-o1", rpm_limit: 60, tpm_limit: 1000000}
  - {id: o2, provider: openai, model_tier: gpt4o, api_key: "storm-o2", rpm_limit: 60, tpm_limit: 1000000}
`
	lim := mockprovider.Limits{RPM: 60, TPM: 1000000}
	s := newSystem(t, opts{keysYML: keys,
		extraYML: "queue: {queue_max_depth: 2000}\ncache: {enabled: false}\nbreaker: {open_duration: 2s}",
		mock: mockprovider.Config{Latency: 5 * time.Millisecond, Keys: map[string]mockprovider.Limits{
			"storm-c1": lim, "storm-c2": lim, "storm-o1": lim, "storm-o2": lim}}})
	api := s.startAPI()
	s.startWorker()
	s.startWorker()

	// Phase A: offer 3× the capacity (4 keys × 1/s) for 4 s, half on each
	// provider, then 10× for a second at once.
	var ids []string
	for sec := range 4 {
		ids = append(ids, api.submitMany(t, 6, "storm-c"+string(rune('0'+sec)), nil)...)
		ids = append(ids, api.submitMany(t, 6, "storm-o"+string(rune('0'+sec)), map[string]any{"provider": "openai", "model_tier": "gpt4o"})...)
		time.Sleep(time.Second) // pacing the offered load, not synchronising
	}
	ids = append(ids, api.submitMany(t, 20, "burst-c", nil)...)
	ids = append(ids, api.submitMany(t, 20, "burst-o", map[string]any{"provider": "openai", "model_tier": "gpt4o"})...)
	for _, id := range ids {
		if out := api.waitStatus(t, id, 45*time.Second, "completed", "failed"); out["status"] != "completed" {
			t.Fatalf("storm request %s: %v", id, out)
		}
	}
	st := s.mock.Stats().Total()
	t.Logf("phase A: %d provider calls, %d ok, %d over-subscription 429s", st.Requests, st.OK, st.RateLimited)
	// The pool absorbs 50 ms of arrival jitter on these one-request
	// buckets (60 RPM over a 1 s window); under the race detector on a
	// loaded two-core machine a goroutine is sometimes late by more, so
	// this in-process test allows 20 % (seen: 2-15 % with the whole suite
	// and other load on the machine; each 429 cools its key and slows it,
	// and must never open a breaker, which is checked below). The
	// real-process storm (pkg/testkit/storm, TestShortStorm) holds the 2 % line.
	if float64(st.RateLimited) > 0.20*float64(st.Requests) {
		t.Fatalf("provider-side 429s %d of %d calls (> 20%%)", st.RateLimited, st.Requests)
	}
	for _, name := range []string{"all", "claude/sonnet", "openai/gpt4o"} {
		if got := breakerOpened(t, api, name); got {
			t.Fatalf("breaker %s opened during a storm the pool paces", name)
		}
	}

	// Phase B: Claude answers 429 to everything; Claude requests are served
	// by the equivalent OpenAI tier.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultRateLimit, RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	fb := api.submitMany(t, 4, "fallback", nil)
	for _, id := range fb {
		out := api.waitStatus(t, id, 30*time.Second, "completed", "failed")
		res, _ := out["result"].(map[string]any)
		if out["status"] != "completed" || res["provider"] != "openai" || res["model_tier"] != "gpt4o" {
			t.Fatalf("fallback request %s: %v", id, out)
		}
	}

	// Phase C: both providers 429. The breakers open, a new submission is
	// told service_degraded but queued, and all finish after recovery.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "openai", Mode: mockprovider.FaultRateLimit, RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	down := api.submitMany(t, 3, "both-down", nil)
	waitFor(t, 30*time.Second, "the all-providers breaker to open", func() bool {
		return breakerState(t, api, "all") != "closed"
	})
	code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("submitted while degraded"))
	if code != http.StatusAccepted || out["status"] != "service_degraded" || out["suggestion"] == "" || out["retry_after_seconds"] == nil {
		t.Fatalf("submission while open: %d %v", code, out)
	}
	down = append(down, out["id"].(string))
	s.mock.ClearFaults()
	for _, id := range down {
		if out := api.waitStatus(t, id, 50*time.Second, "completed", "failed"); out["status"] != "completed" {
			t.Fatalf("request %s after recovery: %v", id, out)
		}
	}
	waitFor(t, 20*time.Second, "the all-providers breaker to close", func() bool {
		return breakerState(t, api, "all") == "closed"
	})
}

func breakerState(t *testing.T, api *apiProc, name string) string {
	t.Helper()
	_, out, _ := call(t, "GET", api.ts.URL+"/admin/breakers", adminToken, nil)
	list, _ := out["breakers"].([]any)
	for _, b := range list {
		m := b.(map[string]any)
		if m["Name"] == name || m["name"] == name {
			if s, ok := m["State"].(string); ok {
				return s
			}
			s, _ := m["state"].(string)
			return s
		}
	}
	return "closed"
}

// breakerOpened reports whether breaker name ever opened (OpenedAt is kept
// after it closes).
func breakerOpened(t *testing.T, api *apiProc, name string) bool {
	t.Helper()
	_, out, _ := call(t, "GET", api.ts.URL+"/admin/breakers", adminToken, nil)
	list, _ := out["breakers"].([]any)
	for _, b := range list {
		m := b.(map[string]any)
		if m["name"] == name {
			_, opened := m["opened_at"]
			return opened
		}
	}
	return false
}
