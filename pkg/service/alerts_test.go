package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/alert"
	"bulwark/pkg/config"
	"bulwark/pkg/maintenance"
	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/mockprovider"
)

// hookReceiver is a generic alert webhook: it records every payload.
type hookReceiver struct {
	ts     *httptest.Server
	mu     sync.Mutex
	got    []receivedAlert
	notify chan struct{} // signalled (non-blocking) on each arrival
}

// receivedAlert is one delivered alert and its raw body.
type receivedAlert struct {
	alert.GenericPayload
	Raw string
}

// withAlerts points the system's generic alert webhook at a new receiver.
// Call it before starting processes.
func (s *system) withAlerts() *hookReceiver {
	r := &hookReceiver{notify: make(chan struct{}, 1)}
	r.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		raw, _ := io.ReadAll(req.Body)
		var p alert.GenericPayload
		if err := json.Unmarshal(raw, &p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, receivedAlert{GenericPayload: p, Raw: string(raw)})
		r.mu.Unlock()
		select {
		case r.notify <- struct{}{}:
		default:
		}
	}))
	s.t.Cleanup(r.ts.Close)
	s.cfg.Alerts.Generic = append(s.cfg.Alerts.Generic, config.Webhook{URL: secret.New(r.ts.URL)})
	return r
}

func (r *hookReceiver) all() []receivedAlert {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedAlert(nil), r.got...)
}

// find returns the alerts of kind (and subject, unless empty).
func (r *hookReceiver) find(kind alert.Kind, subject string) []receivedAlert {
	var out []receivedAlert
	for _, a := range r.all() {
		if a.Kind == kind && (subject == "" || a.Subject == subject) {
			out = append(out, a)
		}
	}
	return out
}

// wait returns the first alert of kind about subject, waiting for it.
func (r *hookReceiver) wait(t testing.TB, kind alert.Kind, subject string, timeout time.Duration) receivedAlert {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if got := r.find(kind, subject); len(got) > 0 {
			return got[0]
		}
		select {
		case <-r.notify:
		case <-deadline:
			var seen []string
			for _, a := range r.all() {
				seen = append(seen, string(a.Kind)+"/"+a.Subject)
			}
			t.Fatalf("no %s alert about %q within %s; received %v", kind, subject, timeout, seen)
		}
	}
}

// secretsIn lists the configured key values found in s.
func secretsIn(s string) []string {
	var out []string
	for _, k := range []string{"mock-claude-key-1", "mock-claude-key-2", "mock-claude-key-3", "mock-openai-key-a",
		"mock-openai-key-b", "brk-c1", "brk-c2", "brk-c3", "brk-o1"} {
		if strings.Contains(s, k) {
			out = append(out, k)
		}
	}
	return out
}

// Claude answering 429 to every call opens claude/sonnet's breaker (three
// consecutive refusals: 429s on keys already cooled once; a first 429 on a
// paced key only cools that key): the admin view shows it open, a
// breaker_open alert reaches the webhook, and the requests are served by
// the fallback. Once the provider recovers and the open duration passes,
// probes close it and a breaker_closed alert follows.
func TestBreakerOpenAndClosedAlerts(t *testing.T) {
	t.Parallel()
	keys := `
keys:
  - {id: bc1, provider: claude, model_tier: sonnet, api_key: "brk-c1", rpm_limit: 600, tpm_limit: 400000}
  - {id: bc2, provider: claude, model_tier: sonnet, api_key: "brk-c2", rpm_limit: 600, tpm_limit: 400000}
  - {id: bc3, provider: claude, model_tier: sonnet, api_key: "brk-c3", rpm_limit: 600, tpm_limit: 400000}
  - {id: bo1, provider: openai, model_tier: gpt4o, api_key: "brk-o1", rpm_limit: 600, tpm_limit: 400000}
`
	s := newSystem(t, opts{keysYML: keys, extraYML: "cache: {enabled: false}"})
	s.cfg.Breaker.OpenDuration = 2 * time.Second
	hooks := s.withAlerts()
	api := s.startAPI()
	s.startWorker()

	// Every claude call 429s: each key cools, is tried again after its
	// cooldown, is refused again; the third such refusal opens the breaker.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultRateLimit,
		RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	opensBy := time.Now().Add(20 * time.Second)
	for i := 0; breakerState(t, api, "claude/sonnet") != "open"; i++ {
		if time.Now().After(opensBy) {
			t.Fatalf("claude/sonnet breaker %q while claude refuses every call, want open", breakerState(t, api, "claude/sonnet"))
		}
		id := api.submit(t, ask(fmt.Sprintf("trip the breaker %d", i)))
		out := api.waitStatus(t, id, 10*time.Second, "completed", "failed")
		if res, _ := out["result"].(map[string]any); out["status"] != "completed" || res["provider"] != "openai" {
			t.Fatalf("request while claude 429s: %v", out)
		}
	}
	s.mock.ClearFaults()
	if st := breakerState(t, api, "all"); st != "closed" {
		t.Fatalf("all-providers breaker %q while openai served, want closed", st)
	}
	opened := hooks.wait(t, alert.KindBreakerOpen, "claude/sonnet", 5*time.Second)
	if opened.Severity != alert.SeverityCritical || !strings.Contains(opened.Summary, "claude/sonnet") || opened.Text == "" {
		t.Fatalf("breaker_open alert: %+v", opened)
	}
	if leaked := secretsIn(opened.Raw); len(leaked) > 0 {
		t.Fatalf("breaker_open alert carries key values %v: %s", leaked, opened.Raw)
	}

	// Recovery: the fault is spent; after the open duration the breaker lets
	// probes through, and two successes close it.
	deadline := time.Now().Add(12 * time.Second)
	for i := 0; breakerState(t, api, "claude/sonnet") != "closed"; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("claude/sonnet breaker still %q after recovery", breakerState(t, api, "claude/sonnet"))
		}
		id := api.submit(t, ask(fmt.Sprintf("probe %d after recovery", i)))
		if out := api.waitStatus(t, id, 10*time.Second, "completed", "failed"); out["status"] != "completed" {
			t.Fatalf("request during recovery: %v", out)
		}
		time.Sleep(100 * time.Millisecond) // pacing probe requests while the breaker is open
	}
	closed := hooks.wait(t, alert.KindBreakerClosed, "claude/sonnet", 5*time.Second)
	if closed.Severity != alert.SeverityInfo {
		t.Fatalf("breaker_closed alert: %+v", closed)
	}
	if n := len(hooks.find(alert.KindBreakerOpen, "claude/sonnet")); n != 1 {
		t.Fatalf("%d breaker_open alerts, want 1 (throttled)", n)
	}
}

// The periodic evaluation turns key-pool state into alerts: a tier whose
// keys are all disabled raises tier_exhausted, and once a key is back,
// tier_recovered follows exactly once.
func TestAlertEvaluateTierExhausted(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	hooks := s.withAlerts()
	api := s.startAPI()
	b := s.open()
	defer b.Close()
	_, mux := b.Worker(b.Clients()) // the handlers only; no server runs
	evaluate := func() {
		t.Helper()
		if err := mux.ProcessTask(context.Background(), asynq.NewTask(maintenance.TaskAlerts, nil)); err != nil {
			t.Fatalf("evaluate: %v", err)
		}
	}

	evaluate()
	if got := hooks.all(); len(got) != 0 {
		t.Fatalf("alerts with every key available: %+v", got)
	}
	for _, id := range []string{"claude-sonnet-1", "claude-sonnet-2"} {
		if code, out, _ := call(t, "POST", api.ts.URL+"/admin/keys/"+id+"/disable", adminToken, nil); code != http.StatusOK {
			t.Fatalf("disable %s: %d %v", id, code, out)
		}
	}
	evaluate()
	ex := hooks.wait(t, alert.KindTierExhausted, "claude/sonnet", 5*time.Second)
	if !strings.Contains(ex.Summary, "claude/sonnet") {
		t.Fatalf("tier_exhausted alert: %+v", ex)
	}
	if n := len(hooks.all()); n != 1 {
		t.Fatalf("%d alerts, want only claude/sonnet's tier_exhausted: %+v", n, hooks.all())
	}

	if code, out, _ := call(t, "POST", api.ts.URL+"/admin/keys/claude-sonnet-2/enable", adminToken, nil); code != http.StatusOK {
		t.Fatalf("enable: %d %v", code, out)
	}
	evaluate()
	hooks.wait(t, alert.KindTierRecovered, "claude/sonnet", 5*time.Second)
	evaluate() // a recovery is announced once
	if n := len(hooks.find(alert.KindTierRecovered, "")); n != 1 {
		t.Fatalf("%d tier_recovered alerts, want 1", n)
	}
}
