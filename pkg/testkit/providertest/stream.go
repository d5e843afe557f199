package providertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/testkit/wiretest"
)

// StreamCase is what the Stream cases need to know of a streaming adapter
// beyond the Harness.
type StreamCase struct {
	// ErrorEvent is an error as the provider sends it in the middle of a
	// stream: a whole event, its blank line included. KEY_PLACEHOLDER in
	// it stands for the key sent.
	ErrorEvent string
	// Class and Code are what the client makes of ErrorEvent.
	Class llm.Class
	Code  string
}

// deltaWait bounds how long the suite's provider waits for the client to
// emit its first delta before it writes a stream's last event. It is a
// failure guard, not a synchronisation: the provider goes on as soon as
// the delta came.
const deltaWait = 10 * time.Second

// recorder records what a Stream call emits. Emit is called by the
// client's goroutine only (Stream never emits concurrently); seen closes
// at the first delta, for the suite's provider, which runs elsewhere.
type recorder struct {
	deltas []llm.Delta
	seen   chan struct{}
	once   sync.Once
	// first, when set, runs at the first delta.
	first func()
}

func newRecorder() *recorder { return &recorder{seen: make(chan struct{})} }

func (r *recorder) emit(d llm.Delta) {
	r.deltas = append(r.deltas, d)
	r.once.Do(func() {
		close(r.seen)
		if r.first != nil {
			r.first()
		}
	})
}

// eventWriter writes a stream's events one at a time, flushing each.
type eventWriter struct {
	w      http.ResponseWriter
	events []string
	next   int
}

// streamOf writes resp with the adapter's stream writer, as the answer to
// a request that info describes, and splits it into its events.
func (h *Harness) streamOf(t *testing.T, w http.ResponseWriter, resp *llm.Response, info Info) *eventWriter {
	var b bytes.Buffer
	if err := h.Wire.WriteStream(&b, resp, info); err != nil {
		t.Error(err)
	}
	var events []string
	for _, ev := range strings.SplitAfter(b.String(), "\n\n") {
		if ev != "" {
			events = append(events, ev)
		}
	}
	return &eventWriter{w: w, events: events}
}

func (e *eventWriter) write(ev string) {
	_, _ = io.WriteString(e.w, ev)
	e.w.(http.Flusher).Flush()
}

// untilDelta writes events until the client has emitted its first delta,
// but never the last: a client that emits only once the stream has ended
// never sees its end, and fails.
func (e *eventWriter) untilDelta(t *testing.T, r *http.Request, rec *recorder) {
	for e.next < len(e.events)-1 {
		e.write(e.events[e.next])
		e.next++
		select {
		case <-rec.seen:
			return
		default:
		}
	}
	select {
	case <-rec.seen:
	case <-r.Context().Done():
	case <-time.After(deltaWait):
		t.Error("no delta before the end of the stream: emit must be called as the events arrive")
	}
}

// rest writes the events not written yet.
func (e *eventWriter) rest() {
	for ; e.next < len(e.events); e.next++ {
		e.write(e.events[e.next])
	}
}

// serveStream starts a provider that checks each request as serve does,
// and answers it with handle (info is what the request asked for); it
// returns a client with timeout (0: the default) pointed at it.
func (h *Harness) serveStream(t *testing.T, key string, timeout time.Duration, handle func(w http.ResponseWriter, r *http.Request, info Info)) llm.Streamer {
	t.Helper()
	endpoint := "/gw" + h.Path
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := h.checkRequest(r, body, endpoint, key); err != nil {
			t.Error(err)
			http.Error(w, err.Error(), http.StatusTeapot)
			return
		}
		info, _, _ := h.Wire.DecodeRequest(body)
		if r.Header.Get("Accept") == "text/event-stream" {
			if !info.Stream {
				t.Error("a stream request whose body does not ask for a stream")
			}
			w.Header().Set("Content-Type", "text/event-stream")
		}
		for k, v := range h.RateLimit.Header {
			w.Header().Set(k, v)
		}
		handle(w, r, info)
	}))
	t.Cleanup(srv.Close)
	return h.streamer(t, h.New(Config{BaseURL: srv.URL + "/gw", Timeout: timeout}, srv.Client()))
}

// streamer is c as an llm.Streamer.
func (h *Harness) streamer(t *testing.T, c llm.Client) llm.Streamer {
	t.Helper()
	s, ok := c.(llm.Streamer)
	if !ok {
		t.Fatalf("%T does not implement llm.Streamer", c)
	}
	return s
}

// CheckDeltas checks that deltas add up to content, as llm.Delta says they
// must: blocks numbered in order without gaps, each opened by a delta
// carrying its type (and a tool_use block's id and name), whose pieces
// concatenate to its text or input JSON (compared as JSON).
func CheckDeltas(t *testing.T, deltas []llm.Delta, content []llm.Block) {
	t.Helper()
	got := []llm.Block{}
	for _, d := range deltas {
		switch {
		case d.Index == len(got):
			if d.Type == "" {
				t.Errorf("the first delta of block %d has no type: %+v", d.Index, d)
			}
			got = append(got, llm.Block{Type: d.Type, ToolUseID: d.ToolUseID, ToolName: d.ToolName})
		case d.Index < 0 || d.Index > len(got):
			t.Fatalf("a delta for block %d when %d blocks started: %+v", d.Index, len(got), d)
		case d.Type != "" && d.Type != got[d.Index].Type:
			t.Errorf("a %s delta for %s block %d", d.Type, got[d.Index].Type, d.Index)
		}
		b := &got[d.Index]
		if b.Type == llm.BlockToolUse {
			b.Input = append(b.Input, d.Text...)
		} else {
			b.Text += d.Text
		}
	}
	for i := range got {
		if got[i].Type == llm.BlockToolUse && len(got[i].Input) == 0 {
			got[i].Input = []byte("{}") // an empty input streams as nothing
		}
	}
	if d := wiretest.Diff(content, got); d != "" {
		t.Errorf("the deltas do not add up to the answer (-answer +deltas):\n%s", d)
	}
}

// DeltasOf cuts resp into the deltas a provider streaming it would make
// the client emit: each block's first delta with its type (and a tool_use
// block's id and name) and first piece, then the rest in pieces
// (provider.SplitText). They add up to resp.Content (CheckDeltas).
func DeltasOf(resp *llm.Response) []llm.Delta {
	var out []llm.Delta
	for i, b := range resp.Content {
		text := b.Text
		if b.Type == llm.BlockToolUse {
			text = string(b.Input)
		}
		pieces := provider.SplitText(text)
		first := ""
		if len(pieces) > 0 {
			first, pieces = pieces[0], pieces[1:]
		}
		out = append(out, llm.Delta{Index: i, Type: b.Type, ToolUseID: b.ToolUseID, ToolName: b.ToolName, Text: first})
		for _, p := range pieces {
			out = append(out, llm.Delta{Index: i, Text: p})
		}
	}
	return out
}

// streamFailure calls s with key and returns the *llm.Error it must fail
// with, and what it emitted first.
func (h *Harness) streamFailure(t *testing.T, s llm.Streamer, key string) (*llm.Error, []llm.Delta) {
	t.Helper()
	rec := newRecorder()
	_, err := s.Stream(t.Context(), h.cred(key), request(), rec.emit)
	var pe *llm.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not an *llm.Error", err)
	}
	if pe.Provider != h.Provider {
		t.Errorf("provider %s, want %s", pe.Provider, h.Provider)
	}
	h.checkNoKey(t, err, key)
	return pe, rec.deltas
}

// checkNoKey checks that no rendering of err holds key or Harness.Secrets.
func (h *Harness) checkNoKey(t *testing.T, err error, key string) {
	t.Helper()
	for _, s := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
		for _, secretText := range append([]string{key}, h.Secrets...) {
			if strings.Contains(s, secretText) {
				t.Errorf("error text leaks %q: %s", secretText, s)
			}
		}
	}
}

// sameError compares errors of Complete and Stream; resets read relative
// to the time of the answer may differ by the time between the calls.
var sameError = cmpopts.EquateApproxTime(time.Minute)

func (h *Harness) testStream(t *testing.T) {
	for _, tc := range wiretest.Responses() {
		t.Run("Success "+tc.Name, func(t *testing.T) {
			t.Parallel()
			h.testStreamSuccess(t, tc.Value)
		})
	}

	// Before the stream starts, a failure is Complete's, whatever it is.
	for _, tt := range append(sharedErrors(), h.Errors...) {
		t.Run("as Complete: "+tt.Name, func(t *testing.T) {
			t.Parallel()
			body := tt.body
			if tt.File != "" {
				body = fixture(t, tt.File)
			}
			header := tt.Header
			if tt.Limits {
				header = merge(h.ErrorRateLimit.Header, tt.Header)
			}
			c := h.serve(t, "key-s1", answer{status: tt.Status, header: header, body: body})
			want := h.failure(t, c, "key-s1")
			got, deltas := h.streamFailure(t, h.streamer(t, c), "key-s1")
			if d := cmp.Diff(want, got, sameError); d != "" {
				t.Errorf("Stream's error differs from Complete's (-Complete +Stream):\n%s", d)
			}
			if len(deltas) != 0 {
				t.Errorf("deltas emitted for an error answer: %+v", deltas)
			}
		})
	}

	t.Run("as Complete: a 401 that echoes the key", func(t *testing.T) {
		t.Parallel()
		key := h.Leak.Key
		c := h.serve(t, key, answer{status: 401, body: fixture(t, h.Leak.File), header: map[string]string{"x-echo": keyPlaceholder}})
		if pe, _ := h.streamFailure(t, h.streamer(t, c), key); pe.Class != llm.ClassAuth {
			t.Errorf("class %s, want auth", pe.Class)
		}
	})

	t.Run("an error event mid-stream is classified by the provider's table", func(t *testing.T) {
		t.Parallel()
		const key = "gw-5e4d3c2b1a0f9e8d"
		s := h.serveMidStream(t, key, 0, func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, strings.ReplaceAll(h.Stream.ErrorEvent, keyPlaceholder, key))
		})
		pe, deltas := h.streamFailure(t, s, key)
		if pe.Class != h.Stream.Class || pe.Code != h.Stream.Code {
			t.Errorf("class %s, code %q; want %s, %q", pe.Class, pe.Code, h.Stream.Class, h.Stream.Code)
		}
		if len(deltas) == 0 {
			t.Error("no delta before the error event")
		}
	})

	t.Run("a stream cut off is transient", func(t *testing.T) {
		t.Parallel()
		s := h.serveMidStream(t, "key-s2", 0, func(http.ResponseWriter, *http.Request) {
			panic(http.ErrAbortHandler) // the connection closes, no end
		})
		pe, deltas := h.streamFailure(t, s, "key-s2")
		if pe.Class != llm.ClassTransient || len(deltas) == 0 {
			t.Errorf("class %s after %d deltas, want transient after some", pe.Class, len(deltas))
		}
	})

	t.Run("a stream that ends before its end event is transient", func(t *testing.T) {
		t.Parallel()
		s := h.serveMidStream(t, "key-s3", 0, func(http.ResponseWriter, *http.Request) {})
		if pe, _ := h.streamFailure(t, s, "key-s3"); pe.Class != llm.ClassTransient || pe.Status != http.StatusOK {
			t.Errorf("class %s, status %d; want transient, 200", pe.Class, pe.Status)
		}
	})

	t.Run("a 200 that is not a stream is transient", func(t *testing.T) {
		t.Parallel()
		page := strings.Join(append([]string{"<html>maintenance"}, h.Secrets...), " ") + "</html>"
		s := h.serveStream(t, "key-s4", 0, func(w http.ResponseWriter, _ *http.Request, _ Info) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, page)
		})
		if pe, _ := h.streamFailure(t, s, "key-s4"); pe.Class != llm.ClassTransient || pe.Status != http.StatusOK {
			t.Errorf("class %s, status %d; want transient, 200", pe.Class, pe.Status)
		}
	})

	t.Run("own timeout mid-stream is transient", func(t *testing.T) {
		t.Parallel()
		s := h.serveMidStream(t, "key-s5", 500*time.Millisecond, func(_ http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		})
		_, err := s.Stream(t.Context(), h.cred("key-s5"), request(), nil)
		if class, ok := llm.ClassOf(err); !ok || class != llm.ClassTransient {
			t.Fatalf("error %v: class %s, want transient", err, class)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("our own timeout must not look like the caller's deadline: %v", err)
		}
	})

	t.Run("caller cancel mid-stream is the context error", func(t *testing.T) {
		t.Parallel()
		s := h.serveMidStream(t, "key-s6", 0, func(_ http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		rec := newRecorder()
		rec.first = cancel
		_, err := s.Stream(ctx, h.cred("key-s6"), request(), rec.emit)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want context.Canceled", err)
		}
		if _, ok := llm.ClassOf(err); ok {
			t.Errorf("a cancellation must not be classified: %v", err)
		}
	})
}

// testStreamSuccess answers Complete with resp encoded and Stream with
// resp streamed, the stream's last event held back until the client has
// emitted a delta, and checks that both read the same answer.
func (h *Harness) testStreamSuccess(t *testing.T, resp *llm.Response) {
	body, err := h.Wire.EncodeResponse(resp, "")
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	s := h.serveStream(t, "key-s0", 0, func(w http.ResponseWriter, r *http.Request, info Info) {
		if r.Header.Get("Accept") != "text/event-stream" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body)
			return
		}
		info.Model = ""
		ew := h.streamOf(t, w, resp, info)
		ew.untilDelta(t, r, rec)
		ew.rest()
	})
	want, err := s.(llm.Client).Complete(t.Context(), h.cred("key-s0"), request())
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	got, err := s.Stream(t.Context(), h.cred("key-s0"), request(), rec.emit)
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if d := wiretest.Diff(want.Response, got.Response); d != "" {
		t.Errorf("Stream's answer differs from Complete's (-Complete +Stream):\n%s", d)
	}
	if d := wiretest.Diff(resp, got.Response); d != "" {
		t.Errorf("answer (-want +got):\n%s", d)
	}
	checkRateLimit(t, h.RateLimit, got.RateLimit, before, after)
	if got.Latency <= 0 {
		t.Errorf("latency %s", got.Latency)
	}
	CheckDeltas(t, rec.deltas, got.Response.Content)
}

// serveMidStream starts a provider that streams the text answer but for
// its last event, the end, and then does fault instead; it returns a
// client with timeout (0: the default) pointed at it.
func (h *Harness) serveMidStream(t *testing.T, key string, timeout time.Duration, fault func(w http.ResponseWriter, r *http.Request)) llm.Streamer {
	t.Helper()
	return h.serveStream(t, key, timeout, func(w http.ResponseWriter, r *http.Request, info Info) {
		info.Model = ""
		ew := h.streamOf(t, w, wiretest.Responses()[0].Value, info)
		for ew.next < len(ew.events)-1 {
			ew.write(ew.events[ew.next])
			ew.next++
		}
		fault(w, r)
	})
}
