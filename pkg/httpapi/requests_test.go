package httpapi_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/history"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/progress"
	"bulwark/pkg/queue"
)

// A body over the limit is a 413, whether its length is announced or only
// found while reading.
func TestBodyLimit(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(su *setup) { su.cfg.MaxBodyBytes = 256 })
	big := submitBody(strings.Repeat("x", 300))
	if r := s.do(t, "POST", "/v1/requests", tokAcme, big); r.code != http.StatusRequestEntityTooLarge {
		t.Fatalf("announced: %d %s", r.code, r.body)
	} else if typ, _ := r.errorOf(t); typ != "body_too_large" {
		t.Fatalf("announced: %s", r.body)
	}
	req, _ := http.NewRequest("POST", s.url+"/v1/requests", io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1 // chunked: the limit is found while decoding
	req.Header.Set("Authorization", "Bearer "+tokAcme)
	if r := send(t, req); r.code != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked: %d %s", r.code, r.body)
	}
	r := s.do(t, "POST", "/v1/chat/completions", tokAcme, `{"model":"gpt-4o","messages":[{"role":"user","content":"`+strings.Repeat("x", 300)+`"}]}`)
	if e, _ := r.json(t)["error"].(map[string]any); r.code != http.StatusRequestEntityTooLarge || e["code"] != "body_too_large" {
		t.Fatalf("compat: %d %s", r.code, r.body)
	}
	if ids := s.queue.ids(); len(ids) != 0 {
		t.Fatalf("enqueued %v", ids)
	}
	s.submit(t, tokAcme, "small") // a body under the limit passes
}

// Malformed bodies are a 400, well-formed but invalid ones a 422 (404 for
// an unknown route), each naming the field at fault where there is one.
func TestSubmitBadInput(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	for _, tt := range []struct {
		name, body string
		code       int
		typ, field string
	}{
		{"empty", "", 400, "invalid_json", ""},
		{"malformed", `{"provider":`, 400, "invalid_json", ""},
		{"unknown field", `{"provider":"claude","model_tier":"sonnet","prompt":"q"}`, 400, "invalid_json", ""},
		{"trailing data", submitBody("q") + ` {}`, 400, "invalid_json", ""},
		{"wrong type", `{"provider":"claude","model_tier":"sonnet","max_tokens":"many"}`, 400, "invalid_type", "max_tokens"},
		{"content neither string nor blocks", `{"provider":"claude","model_tier":"sonnet","messages":[{"role":"user","content":5}]}`, 400, "invalid_request", "messages[0].content"},
		{"empty content", `{"provider":"claude","model_tier":"sonnet","messages":[{"role":"user","content":""}]}`, 400, "invalid_request", "messages[0].content"},
		{"no route", `{"messages":[{"role":"user","content":"q"}]}`, 422, "invalid_request", "model_tier"},
		{"unknown route", `{"provider":"claude","model_tier":"opus","messages":[{"role":"user","content":"q"}]}`, 404, "unknown_model", "model_tier"},
		{"bad priority", `{"provider":"claude","model_tier":"sonnet","priority":"urgent","messages":[{"role":"user","content":"q"}]}`, 422, "invalid_request", "priority"},
		{"bad role", `{"provider":"claude","model_tier":"sonnet","messages":[{"role":"robot","content":"q"}]}`, 422, "invalid_request", "messages[0].role"},
		{"max_tokens", `{"provider":"claude","model_tier":"sonnet","max_tokens":5000,"messages":[{"role":"user","content":"q"}]}`, 422, "invalid_request", "max_tokens"},
	} {
		r := s.do(t, "POST", "/v1/requests", tokAcme, tt.body)
		typ, field := r.errorOf(t)
		if r.code != tt.code || typ != tt.typ || field != tt.field {
			t.Errorf("%s: %d %s, want %d %s on %q", tt.name, r.code, r.body, tt.code, tt.typ, tt.field)
		}
	}
	if ids := s.queue.ids(); len(ids) != 0 {
		t.Fatalf("bad input enqueued: %v", ids)
	}
}

// An accepted request is a 202 with its position, wait and message in the
// caller's language, and is then readable by its tenant only.
func TestSubmitAndGet(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	body := `{"provider":"claude","model_tier":"sonnet","priority":"critical","messages":[{"role":"user","content":"q"}]}`
	r := s.do(t, "POST", "/v1/requests", tokAcme, body, "Accept-Language", "en-GB,en")
	m := r.json(t)
	id, _ := m["id"].(string)
	if r.code != http.StatusAccepted || m["status"] != "queued" || m["queue_position"] != 2.0 ||
		m["estimated_wait_seconds"] != 3.0 || m["estimated_wait_ms"] != 2500.0 || m["message"] != progress.QueuedMessage("en", 2, 3) {
		t.Fatalf("submit: %d %s", r.code, r.body)
	}
	if got := s.enqueuedID(t); got != id {
		t.Fatalf("enqueued %s, answered %s", got, id)
	}
	zh := s.do(t, "POST", "/v1/requests", tokAcme, submitBody("other"))
	if zh.json(t)["message"] != progress.QueuedMessage("zh", 2, 3) {
		t.Fatalf("default language: %s", zh.body)
	}

	r = s.do(t, "GET", "/v1/requests/"+id, tokAcme, "")
	m = r.json(t)
	if r.code != http.StatusOK || m["id"] != id || m["status"] != "queued" || m["priority"] != "high" || m["queue_position"] != 2.0 ||
		m["estimated_wait_ms"] != 2500.0 || m["result"] != nil {
		t.Fatalf("get: %d %s (critical must be capped to acme's high)", r.code, r.body)
	}
	unknown := s.do(t, "GET", "/v1/requests/req_unknown", tokAcme, "")
	foreign := s.do(t, "GET", "/v1/requests/"+id, tokGlobex, "")
	for name, r := range map[string]reply{"unknown": unknown, "another tenant's": foreign} {
		if typ, field := r.errorOf(t); r.code != http.StatusNotFound || typ != "not_found" || field != "id" {
			t.Errorf("%s id: %d %s", name, r.code, r.body)
		}
	}
	if strings.Contains(string(foreign.body), "acme") {
		t.Fatalf("another tenant's request revealed: %s", foreign.body)
	}

	s.jobs.complete(t, id, "the answer")
	r = s.do(t, "GET", "/v1/requests/"+id, tokAcme, "")
	m = r.json(t)
	res, _ := m["result"].(map[string]any)
	if m["status"] != "completed" || res["content"] != "the answer" || res["provider"] != "claude" || res["cached"] != "none" {
		t.Fatalf("completed: %s", r.body)
	}
	if _, ok := m["queue_position"]; ok {
		t.Fatalf("a completed request has a queue position: %s", r.body)
	}
}

// A coalesced request reads as the one it joined; an expired one is read
// from history, for its own tenant only.
func TestGetFollowsLeaderAndHistory(t *testing.T) {
	t.Parallel()
	expired := &history.Row{ID: "req_old", Tenant: "acme", Priority: priority.Low, Status: job.StatusCompleted,
		Response: &llm.Response{Content: []llm.Block{{Type: llm.BlockText, Text: "archived"}}}, ServedRoute: &sonnet,
		Cached: job.CachedNone, CreatedAt: time.Now().Add(-48 * time.Hour)}
	lost := &history.Row{ID: "req_lost", Tenant: "acme", Priority: priority.Normal, Status: job.StatusQueued,
		CreatedAt: time.Now().Add(-time.Hour)}
	s := newServer(t, func(su *setup) { su.deps.History = memHistory{"req_old": expired, "req_lost": lost} })
	lead := s.submit(t, tokAcme, "q")
	s.jobs.put(job.Record{Job: job.Job{ID: "req_follow", Tenant: "acme", Priority: priority.Normal, CreatedAt: time.Now()},
		Status: job.StatusQueued, State: job.State{CoalescedInto: lead, Cached: job.CachedCoalesced}})
	s.jobs.complete(t, lead, "shared")
	r := s.do(t, "GET", "/v1/requests/req_follow", tokAcme, "")
	m := r.json(t)
	res, _ := m["result"].(map[string]any)
	if r.code != http.StatusOK || m["id"] != "req_follow" || m["status"] != "completed" || res["content"] != "shared" || res["cached"] != "coalesced" {
		t.Fatalf("follower: %d %s", r.code, r.body)
	}

	r = s.do(t, "GET", "/v1/requests/req_old", tokAcme, "")
	m = r.json(t)
	res, _ = m["result"].(map[string]any)
	if r.code != http.StatusOK || m["status"] != "completed" || m["priority"] != "low" || res["content"] != "archived" {
		t.Fatalf("from history: %d %s", r.code, r.body)
	}
	if r := s.do(t, "GET", "/v1/requests/req_old", tokGlobex, ""); r.code != http.StatusNotFound {
		t.Fatalf("another tenant's history: %d %s", r.code, r.body)
	}
	// History saw it queued, Redis no longer has it: lost, not queued for
	// ever.
	r = s.do(t, "GET", "/v1/requests/req_lost", tokAcme, "")
	m = r.json(t)
	if errText, _ := m["error"].(string); r.code != http.StatusOK || m["status"] != "failed" || !strings.HasPrefix(errText, "lost: ") {
		t.Fatalf("a record lost from Redis: %d %s", r.code, r.body)
	}
}

// Cancel: 200 the first time (the task leaves the queue), 409 once ended,
// 404 for an unknown id or another tenant's, which stays queued.
func TestCancel(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	id := s.submit(t, tokAcme, "q")
	if r := s.do(t, "DELETE", "/v1/requests/"+id, tokGlobex, ""); r.code != http.StatusNotFound {
		t.Fatalf("another tenant's: %d %s", r.code, r.body)
	}
	if st := s.jobs.status(id); st != job.StatusQueued || len(s.queue.cancels()) != 0 {
		t.Fatalf("another tenant cancelled it: %s %v", st, s.queue.cancels())
	}
	r := s.do(t, "DELETE", "/v1/requests/"+id, tokAcme, "")
	if m := r.json(t); r.code != http.StatusOK || m["id"] != id || m["status"] != "cancelled" {
		t.Fatalf("cancel: %d %s", r.code, r.body)
	}
	if st, c := s.jobs.status(id), s.queue.cancels(); st != job.StatusCancelled || len(c) != 1 || c[0] != id {
		t.Fatalf("after cancel: %s, queue cancels %v", st, c)
	}
	if r := s.do(t, "DELETE", "/v1/requests/"+id, tokAcme, ""); r.code != http.StatusConflict {
		t.Fatalf("cancel again: %d %s", r.code, r.body)
	} else if typ, _ := r.errorOf(t); typ != "already_finished" {
		t.Fatalf("cancel again: %s", r.body)
	}
	if r := s.do(t, "DELETE", "/v1/requests/req_unknown", tokAcme, ""); r.code != http.StatusNotFound {
		t.Fatalf("unknown: %d %s", r.code, r.body)
	}
	if r := s.do(t, "GET", "/v1/requests/"+id, tokAcme, ""); r.json(t)["status"] != "cancelled" {
		t.Fatalf("get after cancel: %s", r.body)
	}
}

// What intake refuses or answers at once maps to its HTTP answer: a cache
// hit 200 with the result, service_degraded 202 with Retry-After, the rate
// limit, a full tenant and a full queue 429 with Retry-After.
func TestSubmitOutcomes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		edit  func(*setup)
		token string
		code  int
		typ   string // status, or error type
		retry string
	}{
		{"cache hit", func(su *setup) {
			su.cache.hit = &llm.Response{Content: []llm.Block{{Type: llm.BlockText, Text: "cached"}}}
		}, tokAcme, 200, "completed", ""},
		{"degraded", func(su *setup) { su.breakers.open = true }, tokAcme, 202, "service_degraded", "42"},
		{"rate limited", func(su *setup) { su.limiter.deny = true }, tokLimited, 429, "tenant_rate_limited", "9"},
		{"queue full", func(su *setup) { su.admitErr = &queue.FullError{Depth: 9, RetryAfter: 1500 * time.Millisecond} }, tokAcme, 429, "queue_full", "2"},
	} {
		s := newServer(t, tt.edit)
		r := s.do(t, "POST", "/v1/requests", tt.token, submitBody("q"))
		m := r.json(t)
		got, _ := m["status"].(string)
		if typ, _ := r.errorOf(t); typ != "" {
			got = typ
		}
		if r.code != tt.code || got != tt.typ || r.hdr.Get("Retry-After") != tt.retry {
			t.Errorf("%s: %d %s Retry-After %q", tt.name, r.code, r.body, r.hdr.Get("Retry-After"))
		}
		if tt.name == "cache hit" {
			if res, _ := m["result"].(map[string]any); res["content"] != "cached" || res["cached"] != "exact" {
				t.Errorf("cache hit: %s", r.body)
			}
		}
	}

	// The "limited" tenant may have one request in flight.
	s := newServer(t, nil)
	s.submit(t, tokLimited, "first")
	r := s.do(t, "POST", "/v1/requests", tokLimited, submitBody("second"))
	if typ, _ := r.errorOf(t); r.code != http.StatusTooManyRequests || typ != "tenant_queue_full" || r.hdr.Get("Retry-After") != "1" {
		t.Fatalf("tenant full: %d %s %q", r.code, r.body, r.hdr.Get("Retry-After"))
	}
	if !bytes.Contains(r.body, []byte("1 requests in flight")) {
		t.Fatalf("tenant full: %s", r.body)
	}
}
