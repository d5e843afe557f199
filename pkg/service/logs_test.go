package service_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/testkit/mockprovider"
)

// logLines parses every line of the system's log; a line that is not a
// JSON object fails the test.
func logLines(t testing.TB, s *system) []map[string]any {
	t.Helper()
	var out []map[string]any
	for i, line := range strings.Split(s.logs.String(), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %d is not JSON (%v): %.300s", i+1, err, line)
		}
		out = append(out, m)
	}
	return out
}

// A full flow — fallback after 429s, a cache hit, a cancellation, compat
// and admin calls, refused tokens — leaves no key or token in the logs,
// every log line is JSON, and the worker's lines name their request.
func TestLogsCarryNoSecrets(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	insp := s.inspector()
	low := queue.Name(priority.Low)
	if err := insp.PauseQueue(low); err != nil {
		t.Fatal(err)
	}
	s.startWorker()

	// A plain request, then the same again: a cache hit.
	const prompt = "Car 88: BMS reports P0AFA after OTA 5.0.2; safe to drive?"
	plain := api.submit(t, ask(prompt))
	api.waitStatus(t, plain, 15*time.Second, "completed")
	waitFor(t, 10*time.Second, "the answer to be cached", func() bool {
		var n int
		err := api.base.PG.QueryRow(t.Context(), "SELECT count(*) FROM semantic_cache").Scan(&n)
		return err == nil && n == 1
	})
	_, hit := api.submitWith(t, devToken, ask(prompt))
	if res, _ := hit["result"].(map[string]any); res["cached"] != "exact" {
		t.Fatalf("second ask: %v", hit)
	}

	// OpenAI answers 429: the request falls back to Claude.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "openai", Mode: mockprovider.FaultRateLimit, RetryAfter: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	fb := api.submit(t, map[string]any{"provider": "openai", "model_tier": "gpt4o",
		"messages": []map[string]any{{"role": "user", "content": "fallback please"}}})
	out := api.waitStatus(t, fb, 15*time.Second, "completed", "failed")
	if res, _ := out["result"].(map[string]any); out["status"] != "completed" || res["provider"] != "claude" {
		t.Fatalf("fallback request: %v", out)
	}
	s.mock.ClearFaults()

	// A cancelled request.
	cancelled := api.submit(t, map[string]any{"provider": "claude", "model_tier": "haiku", "priority": "low",
		"messages": []map[string]any{{"role": "user", "content": "cancel me"}}})
	if code, out, _ := call(t, "DELETE", api.ts.URL+"/v1/requests/"+cancelled, devToken, nil); code != 200 {
		t.Fatalf("cancel: %d %v", code, out)
	}

	// A compat call, admin calls, and refused tokens (which must not be
	// logged either).
	if code, out, _ := call(t, "POST", api.ts.URL+"/v1/messages", "", map[string]any{"model": "claude-sonnet", "max_tokens": 50,
		"messages": []map[string]any{{"role": "user", "content": "compat call"}}}, "x-api-key", devToken); code != 200 {
		t.Fatalf("compat: %d %v", code, out)
	}
	const refused = "wrong-token-that-must-not-be-logged"
	call(t, "GET", api.ts.URL+"/v1/requests/"+plain, refused, nil)
	call(t, "GET", api.ts.URL+"/admin/keys", refused, nil)
	call(t, "POST", api.ts.URL+"/v1/chat/completions", refused, map[string]any{"model": "gpt-4o"})
	call(t, "GET", api.ts.URL+"/v1/requests/"+plain, otherTenantToken, nil)
	for _, p := range []string{"/admin/keys", "/admin/breakers", "/admin/report"} {
		if code, _, _ := call(t, "GET", api.ts.URL+p, adminToken, nil); code != http.StatusOK {
			t.Fatalf("%s: %d", p, code)
		}
	}
	if code, _, _ := call(t, "POST", api.ts.URL+"/admin/keys/openai-gpt4o-1/enable", adminToken, nil); code != http.StatusOK {
		t.Fatal("enable the cooled OpenAI key")
	}
	// Wait for the worker's last lines: every history row final. The
	// cancelled request's row says so too (the API records it: no worker
	// ever sees it).
	waitFor(t, 10*time.Second, "the history rows to be final", func() bool {
		var n int
		err := api.base.PG.QueryRow(t.Context(), "SELECT count(*) FROM requests WHERE status NOT IN ('completed', 'failed', 'cancelled')").Scan(&n)
		return err == nil && n == 0
	})
	var status, reason string
	var finished *time.Time
	if err := api.base.PG.QueryRow(t.Context(), "SELECT status, coalesce(error, ''), finished_at FROM requests WHERE id = $1", cancelled).
		Scan(&status, &reason, &finished); err != nil || status != "cancelled" || reason == "" || finished == nil {
		t.Fatalf("history of the cancelled request: %q %q %v %v", status, reason, finished, err)
	}
	if err := api.base.Redis.Del(t.Context(), s.cfg.Redis.Prefix+"job:"+cancelled).Err(); err != nil {
		t.Fatal(err)
	}
	if _, out, _ := call(t, "GET", api.ts.URL+"/v1/requests/"+cancelled, devToken, nil); out["status"] != "cancelled" {
		t.Fatalf("the cancelled request read from the history: %v", out)
	}

	logs := s.logs.String()
	secrets := append([]string{devToken, otherTenantToken, adminToken, refused}, mockKeyValues...)
	for _, sec := range secrets {
		if i := strings.Index(logs, sec); i >= 0 {
			t.Errorf("the log carries secret %q: …%s…", sec, logs[max(0, i-200):min(len(logs), i+100)])
		}
	}

	lines := logLines(t, s)
	byRequest := map[string][]string{} // request id → messages
	for _, l := range lines {
		msg, _ := l["msg"].(string)
		rid, has := l["request_id"]
		if has {
			id, _ := rid.(string)
			if !strings.HasPrefix(id, "req_") {
				t.Errorf("request_id %v is not a request id: %v", rid, l)
			}
			byRequest[id] = append(byRequest[id], msg)
		}
		if strings.HasPrefix(msg, "dispatch:") && !has {
			t.Errorf("a dispatch line names no request: %v", l)
		}
	}
	has := func(id, msg string) bool {
		for _, m := range byRequest[id] {
			if m == msg {
				return true
			}
		}
		return false
	}
	for _, want := range []struct{ id, msg string }{
		{plain, "dispatch: completed"},
		{plain, "http"},
		{fb, "dispatch: provider call failed"},
		{fb, "dispatch: fell back"},
		{fb, "dispatch: completed"},
		{cancelled, "http"},
	} {
		if !has(want.id, want.msg) {
			t.Errorf("no %q line for request %s; its lines: %v", want.msg, want.id, byRequest[want.id])
		}
	}
	if len(lines) < 20 {
		t.Fatalf("only %d log lines: the check proves little", len(lines))
	}
}
