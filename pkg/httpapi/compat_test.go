package httpapi_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/finish"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
)

const chatBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"q"}]}`

// A compat request waits, on the hub, for its request to end: the answer
// arrives as soon as the store publishes the completion, in the SDK's
// format, with Bulwark's headers.
func TestCompatWaitsForTheAnswer(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil) // SyncTimeout 30s: only the published event can end the wait in time
	pending := s.start("POST", "/v1/chat/completions", tokAcme, chatBody)
	id := s.enqueuedID(t)
	s.awaitGet(t, id) // the handler has subscribed and found it queued
	select {
	case r := <-pending:
		t.Fatalf("answered before the request ended: %d %s", r.code, r.body)
	default:
	}
	s.jobs.complete(t, id, "hello")
	r := wait(t, pending)
	m := r.json(t)
	choices, _ := m["choices"].([]any)
	var content any
	if len(choices) == 1 {
		msg, _ := choices[0].(map[string]any)["message"].(map[string]any)
		content = msg["content"]
	}
	if r.code != http.StatusOK || content != "hello" || m["id"] != "chatcmpl-"+id || m["model"] != "gpt-4o" {
		t.Fatalf("answer: %d %s", r.code, r.body)
	}
	if h := r.hdr; h.Get("X-Bulwark-Request-Id") != id || h.Get("X-Bulwark-Cache") != "none" ||
		h.Get("X-Bulwark-Provider") != "claude" || h.Get("X-Bulwark-Model-Tier") != "sonnet" {
		t.Fatalf("headers %v", h)
	}
}

// A request that ends without an answer is the SDK's error for its code.
func TestCompatFailure(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	pending := s.start("POST", "/v1/messages", tokAcme,
		`{"model":"claude-sonnet","max_tokens":64,"messages":[{"role":"user","content":"q"}]}`)
	id := s.enqueuedID(t)
	s.awaitGet(t, id)
	rec, err := s.jobs.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := (memFinisher{s.jobs}).Finish(context.Background(), rec, finish.Failed(job.State{}, job.CodeProviderError, "400 from upstream")); err != nil {
		t.Fatal(err)
	}
	r := wait(t, pending)
	m := r.json(t)
	e, _ := m["error"].(map[string]any)
	details, _ := e["details"].(map[string]any)
	if r.code != http.StatusBadRequest || m["type"] != "error" || details["error_code"] != "provider_rejected" {
		t.Fatalf("failure: %d %s", r.code, r.body)
	}
	if strings.Contains(string(r.body), "400 from upstream") {
		t.Fatalf("the operators' detail reached the tenant: %s", r.body)
	}
}

// A cache hit is answered at once, streamed when asked, and says so.
func TestCompatCacheHitStreams(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(su *setup) {
		su.cache.hit = &llm.Response{Model: "m", StopReason: llm.StopEndTurn, Content: []llm.Block{{Type: llm.BlockText, Text: "cached answer"}}}
	})
	r := s.do(t, "POST", "/v1/messages", tokAcme,
		`{"model":"claude-sonnet","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"q"}]}`)
	if r.code != http.StatusOK || r.hdr.Get("X-Bulwark-Cache") != "exact" || !strings.HasPrefix(r.hdr.Get("Content-Type"), "text/event-stream") ||
		!strings.Contains(string(r.body), "event: message_stop") || !strings.Contains(string(r.body), "cached answer") {
		t.Fatalf("stream: %d %v\n%s", r.code, r.hdr, r.body)
	}
	if ids := s.queue.ids(); len(ids) != 0 {
		t.Fatalf("a cache hit was enqueued: %v", ids)
	}
}

// Past SyncTimeout a queued request is a 429 still_queued whose
// Retry-After is its ETA and whose header names the request to fetch; the
// request stays queued.
func TestCompatStillQueued(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(su *setup) { su.cfg.SyncTimeout = 20 * time.Millisecond })
	r := s.do(t, "POST", "/v1/chat/completions", tokAcme, chatBody)
	id := s.enqueuedID(t)
	e, _ := r.json(t)["error"].(map[string]any)
	if r.code != http.StatusTooManyRequests || e["code"] != "still_queued" || r.hdr.Get("Retry-After") != "3" ||
		r.hdr.Get("Retry-After-Ms") != "2500" ||
		r.hdr.Get("X-Bulwark-Request-Id") != id || !strings.Contains(e["message"].(string), "/v1/requests/"+id) {
		t.Fatalf("still queued: %d %v %s", r.code, r.hdr, r.body)
	}
	if st := s.jobs.status(id); st != job.StatusQueued {
		t.Fatalf("the request went %s", st)
	}
}

// A tenant holds at most MaxSyncWaits waiting compat requests on a
// process: one more is a 429 at once, and the place is free again once the
// wait ends.
func TestCompatSyncWaitGate(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	first := s.start("POST", "/v1/chat/completions", tokLimited, chatBody)
	id := s.enqueuedID(t)
	s.awaitGet(t, id)
	r := s.do(t, "POST", "/v1/chat/completions", tokLimited, chatBody)
	if e, _ := r.json(t)["error"].(map[string]any); r.code != http.StatusTooManyRequests || e["code"] != "too_many_waits" || r.hdr.Get("Retry-After") != "5" {
		t.Fatalf("second wait: %d %s", r.code, r.body)
	}
	other := s.start("POST", "/v1/chat/completions", tokAcme, chatBody) // another tenant waits beside it
	acme := s.enqueuedID(t)
	s.awaitGet(t, acme)
	s.jobs.complete(t, acme, "acme")
	if r := wait(t, other); r.code != http.StatusOK {
		t.Fatalf("another tenant: %d %s", r.code, r.body)
	}
	s.jobs.complete(t, id, "one")
	if r := wait(t, first); r.code != http.StatusOK {
		t.Fatalf("first: %d %s", r.code, r.body)
	}
	// The handler left the gate before its (small, buffered) answer was
	// sent: the next wait is admitted.
	third := s.start("POST", "/v1/chat/completions", tokLimited, chatBody)
	id = s.enqueuedID(t)
	s.awaitGet(t, id)
	s.jobs.complete(t, id, "three")
	if r := wait(t, third); r.code != http.StatusOK {
		t.Fatalf("third: %d %s", r.code, r.body)
	}
}

// Unknown models and bad Bulwark headers are refused before anything is
// stored, in the SDK's format.
func TestCompatBadInput(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	for _, tt := range []struct {
		name, path, body string
		hdr              []string
		code             int
		errCode          string
	}{
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"q"}]}`, nil, 404, "model_not_found"},
		{"bad cache header", "/v1/chat/completions", chatBody, []string{"X-Bulwark-Cache", "sometimes"}, 400, "invalid_header"},
		{"bad priority header", "/v1/chat/completions", chatBody, []string{"X-Bulwark-Priority", "urgent"}, 400, "invalid_header"},
		{"malformed", "/v1/chat/completions", `{"model":`, nil, 400, "invalid_request"},
		{"intake's 422 as a 400", "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"assistant","content":"q"}]}`, nil, 400, "invalid_request"},
	} {
		r := s.do(t, "POST", tt.path, tokAcme, tt.body, tt.hdr...)
		if e, _ := r.json(t)["error"].(map[string]any); r.code != tt.code || e["code"] != tt.errCode {
			t.Errorf("%s: %d %s", tt.name, r.code, r.body)
		}
	}
	if ids := s.queue.ids(); len(ids) != 0 {
		t.Fatalf("bad input enqueued: %v", ids)
	}
}

// giveUp sends a compat call with body and abandons it once its request
// is queued and waited on, as a client whose own timeout expires does; it
// returns the request's id.
func (s *server) giveUp(t *testing.T, body string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tokAcme)
	gaveUp := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gaveUp <- err
	}()
	id := s.enqueuedID(t)
	s.awaitGet(t, id) // the call waits
	cancel()          // and its caller gives up
	if err := <-gaveUp; err == nil {
		t.Fatal("the abandoned call was answered")
	}
	// The client knows at once, the server when it next reads the
	// connection: until its handler stops waiting, an answer arriving
	// would still be delivered (and the request unjoined).
	deadline := time.Now().Add(10 * time.Second)
	for s.hub.Follows(id) {
		if time.Now().After(deadline) {
			t.Fatal("the server never noticed the caller gave up")
		}
		time.Sleep(time.Millisecond)
	}
	return id
}

// A compat call resent while the one it repeats is queued — after the
// caller gave up waiting, as an SDK's own timeout and retry do — joins it:
// the same request id, nothing enqueued again, and that request's answer
// once it completes; likewise when it completed while nobody waited. Once
// the answer was delivered the same call is a new request.
func TestCompatResendJoins(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	id := s.giveUp(t, chatBody)

	resend := s.start("POST", "/v1/chat/completions", tokAcme, chatBody)
	s.awaitGet(t, id) // the resend found the first request
	select {
	case other := <-s.queue.enqueued:
		t.Fatalf("the resend was enqueued as %s", other)
	default:
	}
	s.jobs.complete(t, id, "the answer")
	r := wait(t, resend)
	if r.code != http.StatusOK || r.hdr.Get("X-Bulwark-Request-Id") != id || !strings.Contains(string(r.body), "the answer") ||
		r.hdr.Get("X-Bulwark-Cache") != "coalesced" { // the call was shared, not made for the resend
		t.Fatalf("resend: %d %v %s", r.code, r.hdr, r.body)
	}

	later := s.start("POST", "/v1/chat/completions", tokAcme, chatBody)
	next := s.enqueuedID(t)
	if next == id {
		t.Fatalf("after the end the same call joined %s", id)
	}
	s.jobs.complete(t, next, "again")
	if r := wait(t, later); r.code != http.StatusOK {
		t.Fatalf("later: %d %s", r.code, r.body)
	}

	// Completed while nobody waited: the resend gets the answer at once.
	other := `{"model":"gpt-4o","messages":[{"role":"user","content":"other"}]}`
	done := s.giveUp(t, other)
	s.jobs.complete(t, done, "kept for you")
	r = s.do(t, "POST", "/v1/chat/completions", tokAcme, other)
	if r.code != http.StatusOK || r.hdr.Get("X-Bulwark-Request-Id") != done || !strings.Contains(string(r.body), "kept for you") {
		t.Fatalf("resend after the end: %d %v %s", r.code, r.hdr, r.body)
	}
	select {
	case extra := <-s.queue.enqueued:
		t.Fatalf("the resend after the end was enqueued as %s", extra)
	default:
	}
}

// sseLines reads an event stream line by line as it arrives.
func sseLines(t *testing.T, body io.Reader) <-chan string {
	t.Helper()
	out := make(chan string, 64)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			out <- sc.Text()
		}
	}()
	return out
}

// nextLine returns the next line of the stream, failing after 10 s.
func nextLine(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatal("the stream ended")
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no line within 10s")
		return ""
	}
}

// A streaming compat call that has to wait gets its headers at once and a
// comment line every KeepAlive while it waits (proxies would cut an idle
// connection; the SDKs skip comments). Its answer follows as the dialect's
// events, with the provider and cache headers as trailers; a failure ends
// the stream with the dialect's error event, since the status is gone.
func TestCompatStreamWaitsInTheOpen(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(su *setup) { su.cfg.KeepAlive = 20 * time.Millisecond })
	for _, tc := range []struct {
		name, path, body string
		fail             bool
		want             []string // what must follow the waiting comments, in order
	}{
		{"openai answer", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"wait a"}]}`,
			false, []string{`"content":"the answer"`, "data: [DONE]"}},
		{"anthropic answer", "/v1/messages", `{"model":"claude-sonnet","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"wait b"}]}`,
			false, []string{"event: message_start", `"text":"the answer"`, "event: message_stop"}},
		{"openai failure", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"wait c"}]}`,
			true, []string{`data: {"error":{`}},
		{"anthropic failure", "/v1/messages", `{"model":"claude-sonnet","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"wait d"}]}`,
			true, []string{"event: error", `data: {"type":"error","error":{`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest("POST", s.url+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+tokAcme)
			resp, err := http.DefaultClient.Do(req) // returns once the headers are in
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			id := s.enqueuedID(t)
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") ||
				resp.Header.Get("X-Bulwark-Request-Id") != id {
				t.Fatalf("headers before the answer: %d %v", resp.StatusCode, resp.Header)
			}
			lines := sseLines(t, resp.Body)
			if l := nextLine(t, lines); l != ": waiting" {
				t.Fatalf("first line %q, want the waiting comment", l)
			}
			if tc.fail {
				rec, err := s.jobs.Get(context.Background(), id)
				if err != nil {
					t.Fatal(err)
				}
				if err := (memFinisher{s.jobs}).Finish(context.Background(), rec, finish.Failed(job.State{}, job.CodeProviderError, "400 from upstream")); err != nil {
					t.Fatal(err)
				}
			} else {
				s.jobs.complete(t, id, "the answer")
			}
			var got []string
			for _, want := range tc.want { // in order, whatever comes between
				for {
					l := nextLine(t, lines)
					got = append(got, l)
					if strings.Contains(l, want) {
						break
					}
				}
			}
			for l := range lines {
				got = append(got, l)
			}
			if body := strings.Join(got, "\n"); strings.Contains(body, "400 from upstream") {
				t.Fatalf("the operators' detail reached the tenant: %s", body)
			}
			if !tc.fail && (resp.Trailer.Get("X-Bulwark-Cache") != "none" || resp.Trailer.Get("X-Bulwark-Provider") != string(sonnet.Provider)) {
				t.Fatalf("trailers %v", resp.Trailer)
			}
		})
	}
}
