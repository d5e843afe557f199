package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/job"
	"bulwark/pkg/priority"
)

// sse is one Server-Sent Event.
type sse struct {
	id, typ string
	data    map[string]any
}

// stream is an open event stream; its events arrive on C, closed when the
// server ends the stream.
type stream struct {
	resp *http.Response
	C    chan sse
}

// openStream opens id's event stream; hdr are header name/value pairs.
func (s *server) openStream(t *testing.T, id, token string, hdr ...string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/v1/requests/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	st := &stream{resp: resp, C: make(chan sse, 64)}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		close(st.C)
		return st
	}
	go func() {
		defer close(st.C)
		sc := bufio.NewScanner(resp.Body)
		var ev sse
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.typ != "" {
					st.C <- ev
				}
				ev = sse{}
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				ev.typ = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.data)
			}
		}
	}()
	return st
}

// next returns the stream's next event.
func (st *stream) next(t *testing.T) sse {
	t.Helper()
	select {
	case ev, ok := <-st.C:
		if !ok {
			t.Fatal("the stream ended")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
		return sse{}
	}
}

// ended waits for the server to end the stream.
func (st *stream) ended(t *testing.T) {
	t.Helper()
	select {
	case ev, ok := <-st.C:
		if ok {
			t.Fatalf("event %+v after the end", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
}

// A stream replays the stored events with their ids, adds the position,
// then follows the live events from the hub and ends after the terminal
// one; a reconnection gets only what it missed, or the ending again.
func TestEventStream(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	id := s.submit(t, tokAcme, "q")
	st := s.openStream(t, id, tokAcme, "Accept-Language", "en")
	if ct := st.resp.Header.Get("Content-Type"); st.resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("open: %d %q", st.resp.StatusCode, ct)
	}
	queued := st.next(t)
	if queued.typ != "queued" || queued.id == "" || queued.data["request_id"] != id {
		t.Fatalf("first event %+v, want the stored queued event", queued)
	}
	pos := st.next(t)
	if pos.typ != "queued" || pos.id != "" || pos.data["queue_position"] != 2.0 || pos.data["estimated_wait_ms"] != 2500.0 ||
		!strings.HasPrefix(pos.data["message"].(string), "Your request is queued") {
		t.Fatalf("position %+v", pos)
	}
	s.jobs.complete(t, id, "done")
	done := st.next(t)
	res, _ := done.data["result"].(map[string]any)
	if done.typ != "completed" || done.id == "" || res["content"] != "done" {
		t.Fatalf("live event %+v", done)
	}
	st.ended(t)

	again := s.openStream(t, id, tokAcme, "Last-Event-ID", queued.id)
	if ev := again.next(t); ev.typ != "completed" || ev.id != done.id {
		t.Fatalf("resumed after the queued event: %+v", ev)
	}
	again.ended(t)
	last := s.openStream(t, id, tokAcme, "Last-Event-ID", done.id)
	if ev := last.next(t); ev.typ != "completed" || ev.data["status"] != "completed" {
		t.Fatalf("resumed after the end: %+v", ev)
	}
	last.ended(t)

	for _, tt := range []struct {
		name, id, token string
		hdr             []string
		code            int
	}{
		{"bad Last-Event-ID", id, tokAcme, []string{"Last-Event-ID", "yesterday"}, http.StatusBadRequest},
		{"future Last-Event-ID", id, tokAcme, []string{"Last-Event-ID", "99999999999999-0"}, http.StatusBadRequest},
		{"another tenant's", id, tokGlobex, nil, http.StatusNotFound},
		{"unknown", "req_unknown", tokAcme, nil, http.StatusNotFound},
	} {
		if st := s.openStream(t, tt.id, tt.token, tt.hdr...); st.resp.StatusCode != tt.code {
			t.Errorf("%s: %d", tt.name, st.resp.StatusCode)
		}
	}
}

// A request whose live record vanishes (lost with a Redis master) ends
// its followers' streams at the next keep-alive, failed as lost, instead
// of holding them open with nothing ever to come.
func TestEventStreamEndsWhenTheRecordIsGone(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(su *setup) { su.cfg.KeepAlive = 20 * time.Millisecond })
	id := s.submit(t, tokAcme, "q")
	st := s.openStream(t, id, tokAcme)
	if ev := st.next(t); ev.typ != "queued" {
		t.Fatalf("first event %+v", ev)
	}
	if ev := st.next(t); ev.typ != "queued" || ev.data["queue_position"] != 2.0 {
		t.Fatalf("position %+v", ev)
	}
	s.jobs.forget(id)
	ev := st.next(t)
	if errText, _ := ev.data["error"].(string); ev.typ != "failed" || ev.data["code"] != "lost" || !strings.HasPrefix(errText, "lost: ") {
		t.Fatalf("after the record vanished: %+v", ev)
	}
	st.ended(t)
}

// A coalesced request's stream follows the request it joined, under its
// own id; its own cancellation ends it.
func TestEventStreamFollower(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	lead := s.submit(t, tokAcme, "q")
	follower := func(id string, status job.Status) {
		s.jobs.put(job.Record{Job: job.Job{ID: id, Tenant: "acme", Priority: priority.Normal, CreatedAt: time.Now()},
			Status: status, State: job.State{CoalescedInto: lead, Cached: job.CachedCoalesced}})
	}
	follower("req_follow", job.StatusQueued)
	follower("req_gone", job.StatusCancelled)

	st := s.openStream(t, "req_follow", tokAcme)
	if ev := st.next(t); ev.typ != "queued" || ev.data["request_id"] != "req_follow" {
		t.Fatalf("replayed leader's event %+v, want it under the follower's id", ev)
	}
	st.next(t) // position
	s.jobs.complete(t, lead, "shared")
	if ev := st.next(t); ev.typ != "completed" || ev.data["request_id"] != "req_follow" {
		t.Fatalf("leader's completion %+v", ev)
	}
	st.ended(t)

	gone := s.openStream(t, "req_gone", tokAcme)
	if ev := gone.next(t); ev.typ != "cancelled" {
		t.Fatalf("cancelled follower's stream %+v", ev)
	}
	gone.ended(t)
}

// A tenant holds at most MaxStreams open streams on a process: one more is
// a 429, and the place is free again once a stream ends.
func TestEventStreamGate(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	id := s.submit(t, tokLimited, "q")
	first := s.openStream(t, id, tokLimited)
	first.next(t) // the stream is open, and counted
	second := s.openStream(t, id, tokLimited)
	if second.resp.StatusCode != http.StatusTooManyRequests || second.resp.Header.Get("Retry-After") != "5" {
		t.Fatalf("second stream: %d", second.resp.StatusCode)
	}
	if other := s.openStream(t, s.submit(t, tokAcme, "q"), tokAcme); other.resp.StatusCode != http.StatusOK {
		t.Fatalf("another tenant's stream: %d", other.resp.StatusCode)
	}
	s.jobs.complete(t, id, "done")
	for ev := first.next(t); ev.typ != "completed"; ev = first.next(t) {
	}
	first.ended(t) // the handler has returned, leaving the gate
	third := s.openStream(t, id, tokLimited)
	if third.resp.StatusCode != http.StatusOK {
		t.Fatalf("after the first ended: %d", third.resp.StatusCode)
	}
	if ev := third.next(t); ev.typ != "queued" {
		t.Fatalf("third stream %+v", ev)
	}
}
