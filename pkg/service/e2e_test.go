package service_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/testkit/mockprovider"
)

func TestSubmitStreamCompleted(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	s.startWorker()

	prompt := "OTA batch 7 failed with P0A80 on car 12; what now?"
	id := api.submit(t, ask(prompt))
	ch, _ := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
	ev := next(t, ch, 15*time.Second, "completed", "failed")
	if ev.Type != "completed" {
		t.Fatalf("ended %s: %v", ev.Type, ev.Data)
	}
	res := ev.Data["result"].(map[string]any)
	if got, want := res["content"], mockprovider.Reply(prompt); got != want {
		t.Fatalf("answer %q, want %q", got, want)
	}
	if res["provider"] != "claude" || res["model_tier"] != "sonnet" {
		t.Fatalf("served by %v/%v", res["provider"], res["model_tier"])
	}
	if ev.Data["request_id"] != id {
		t.Fatalf("event of %v", ev.Data["request_id"])
	}
	// The stream ends after the terminal event.
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("stream went on after completed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stream did not end")
	}
	out := api.waitStatus(t, id, 5*time.Second, "completed")
	if out["result"].(map[string]any)["content"] != mockprovider.Reply(prompt) {
		t.Fatalf("GET result: %v", out)
	}
}

// The API process dies mid-stream; the client reconnects to another API
// process with Last-Event-ID and gets exactly the events it missed.
func TestReplayAfterAPIRestart(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api1 := s.startAPI()
	insp := s.inspector()
	if err := insp.PauseQueue(queue.Name(priority.Normal)); err != nil {
		t.Fatal(err)
	}
	s.startWorker()

	id := api1.submit(t, ask("replay me"))
	ch, _ := stream(t, api1.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
	first := next(t, ch, 5*time.Second, "queued")
	if first.ID == "" {
		t.Fatal("stored event without id")
	}
	api1.stop() // the API process goes away mid-stream

	if err := insp.UnpauseQueue(queue.Name(priority.Normal)); err != nil {
		t.Fatal(err)
	}
	api2 := s.startAPI()
	api2.waitStatus(t, id, 15*time.Second, "completed")
	ch2, _ := stream(t, api2.ts.URL+"/v1/requests/"+id+"/events", devToken, first.ID)
	var types []string
	for ev := range ch2 {
		if ev.ID == first.ID {
			t.Fatalf("replayed the event before Last-Event-ID")
		}
		types = append(types, ev.Type)
	}
	if got := strings.Join(types, ","); got != "started,completed" {
		t.Fatalf("replay after %s: %s, want started,completed", first.ID, got)
	}
}

func TestBadInputClasses(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	u := api.ts.URL + "/v1/requests"
	long := strings.Repeat("x", 2<<20)
	tests := []struct {
		name   string
		method string
		url    string
		token  string
		body   any
		status int
		field  string
	}{
		{"no token", "POST", u, "", ask("x"), http.StatusUnauthorized, ""},
		{"bad token", "POST", u, "nope", ask("x"), http.StatusUnauthorized, ""},
		{"malformed json", "POST", u, devToken, `{"provider": "claude",`, http.StatusBadRequest, ""},
		{"empty body", "POST", u, devToken, "", http.StatusBadRequest, ""},
		{"wrong type", "POST", u, devToken, `{"provider":"claude","model_tier":"sonnet","max_tokens":"many","messages":[{"role":"user","content":"x"}]}`, http.StatusBadRequest, "max_tokens"},
		{"unknown field", "POST", u, devToken, `{"provider":"claude","model_tier":"sonnet","bogus":1,"messages":[{"role":"user","content":"x"}]}`, http.StatusBadRequest, ""},
		{"unknown tier", "POST", u, devToken, map[string]any{"provider": "claude", "model_tier": "opus", "messages": []map[string]any{{"role": "user", "content": "x"}}}, http.StatusNotFound, "model_tier"},
		{"empty messages", "POST", u, devToken, map[string]any{"provider": "claude", "model_tier": "sonnet", "messages": []any{}}, http.StatusUnprocessableEntity, "messages"},
		{"empty content", "POST", u, devToken, map[string]any{"provider": "claude", "model_tier": "sonnet", "messages": []map[string]any{{"role": "user", "content": ""}}}, http.StatusBadRequest, "messages[0].content"},
		{"bad role", "POST", u, devToken, map[string]any{"provider": "claude", "model_tier": "sonnet", "messages": []map[string]any{{"role": "robot", "content": "x"}}}, http.StatusUnprocessableEntity, "messages[0].role"},
		{"invalid priority", "POST", u, devToken, map[string]any{"provider": "claude", "model_tier": "sonnet", "priority": "urgent", "messages": []map[string]any{{"role": "user", "content": "x"}}}, http.StatusUnprocessableEntity, "priority"},
		{"priority out of range", "POST", u, devToken, map[string]any{"provider": "claude", "model_tier": "sonnet", "priority": 9, "messages": []map[string]any{{"role": "user", "content": "x"}}}, http.StatusUnprocessableEntity, "priority"},
		{"max_tokens too big", "POST", u, devToken, map[string]any{"provider": "claude", "model_tier": "sonnet", "max_tokens": 10_000_000, "messages": []map[string]any{{"role": "user", "content": "x"}}}, http.StatusUnprocessableEntity, "max_tokens"},
		{"prompt too long", "POST", u, devToken, map[string]any{"provider": "claude", "model_tier": "sonnet", "messages": []map[string]any{{"role": "user", "content": strings.Repeat("y", 300_000)}}}, http.StatusRequestEntityTooLarge, "messages"},
		{"body too large", "POST", u, devToken, `{"provider":"claude","model_tier":"sonnet","messages":[{"role":"user","content":"` + long + `"}]}`, http.StatusRequestEntityTooLarge, ""},
		{"unknown id", "GET", u + "/req_nope", devToken, nil, http.StatusNotFound, "id"},
		{"unknown endpoint", "GET", api.ts.URL + "/v2/x", devToken, nil, http.StatusNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, _ := call(t, tt.method, tt.url, tt.token, tt.body)
			if code != tt.status {
				t.Fatalf("status %d, want %d: %v", code, tt.status, out)
			}
			e, ok := out["error"].(map[string]any)
			if !ok || e["message"] == "" || e["type"] == "" {
				t.Fatalf("no JSON error with type and message: %v", out)
			}
			if tt.field != "" && e["field"] != tt.field {
				t.Fatalf("field %v, want %s (%v)", e["field"], tt.field, e["message"])
			}
		})
	}
	// Nothing was enqueued or stored by any of them.
	insp := s.inspector()
	for _, p := range priority.All {
		if info, err := insp.GetQueueInfo(queue.Name(p)); err == nil && info.Size > 0 {
			t.Fatalf("queue %s holds %d tasks after bad input", p, info.Size)
		}
	}
	var n int
	if err := api.base.PG.QueryRow(t.Context(), "SELECT count(*) FROM requests").Scan(&n); err != nil || n != 0 {
		t.Fatalf("history rows after bad input: %d %v", n, err)
	}
}

// /readyz checks Redis and PostgreSQL; /metrics of the API reports the
// shared state and the worker's reports the provider calls it made.
func TestHealthAndMetrics(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	s.startWorker()
	if code, out, _ := call(t, "GET", api.ts.URL+"/readyz", adminToken, nil); code != 200 || out["ready"] != true {
		t.Fatalf("readyz: %d %v", code, out)
	}
	id := api.submit(t, ask("metrics please"))
	api.waitStatus(t, id, 15*time.Second, "completed")

	_, out, _ := call(t, "GET", api.ts.URL+"/metrics", adminToken, nil)
	apiMetrics := out["_raw"].(string)
	for _, want := range []string{
		`bulwark_queue_depth{priority="critical"} 0`,
		`bulwark_keys_available{route="claude/sonnet"} 2`,
		`bulwark_slots_in_use{priority="normal"} `, // the value races the worker's slot release
		`bulwark_requests_submitted_total{priority="normal"} 1`,
		`bulwark_cache_lookups_total{layer="agent",result="miss"} 1`,
		`bulwark_redis_pool_connections{state="in_use"} `, // each process's own pools
		`bulwark_redis_pool_timeouts_total 0`,
		`pgxpool_max_conns 8`,
	} {
		if !strings.Contains(apiMetrics, want) {
			t.Errorf("API /metrics lacks %s", want)
		}
	}
	scrape := func() string {
		rec := httptest.NewRecorder()
		s.workers[0].MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	// The worker counts a completion just after recording it: wait for it.
	var workerMetrics string
	waitFor(t, 5*time.Second, "the worker to count the completion", func() bool {
		workerMetrics = scrape()
		return strings.Contains(workerMetrics, `bulwark_requests_total{priority="normal",status="completed"} 1`)
	})
	for _, want := range []string{
		`bulwark_provider_calls_total{key_id="claude-sonnet-`,
		`outcome="ok",provider="claude",tier="sonnet"} 1`,
		`bulwark_requests_total{priority="normal",status="completed"} 1`,
		`bulwark_tokens_total{direction="output",provider="claude",tier="sonnet"}`,
	} {
		if !strings.Contains(workerMetrics, want) {
			t.Errorf("worker /metrics lacks %s", want)
		}
	}
	for _, k := range []string{"mock-claude-key-1", "mock-claude-key-2"} {
		if strings.Contains(apiMetrics+workerMetrics, k) {
			t.Fatal("a key value in the metrics")
		}
	}
}
