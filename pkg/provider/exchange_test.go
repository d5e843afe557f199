package provider

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"bulwark/pkg/llm"
	"bulwark/pkg/secret"
)

// lineWire is a Wire for a format of one-line events: "data: <text>" is a
// piece of block 0, "data: end" ends the answer, "data: bad <why>" is a
// malformed event and "event: error" an error event. Failure turns a reply
// into an *llm.Error that quotes its status and body.
func lineWire(key secret.String) Wire {
	return Wire{
		Failure: func(r *Reply, _ time.Time) error {
			return &llm.Error{Class: ClassifyStatus(r.Status), Provider: "test", Status: r.Status,
				Message: Redact(string(r.Body), key), RetryAfter: ParseRetryAfter(r.Header, time.Now())}
		},
		RateLimit: func(h http.Header, _ time.Time) llm.RateLimit {
			n, ok := HeaderInt(h, "x-remaining")
			return llm.RateLimit{RequestsRemaining: n, Known: ok}
		},
		ReadStream: func(body io.Reader, emit func(llm.Delta)) (*llm.Response, error) {
			events := NewEventReader(body)
			var text strings.Builder
			for {
				ev, err := events.Next()
				if err != nil {
					return nil, fmt.Errorf("read: %w", err)
				}
				data := string(ev.Data)
				switch {
				case ev.Name == "error":
					return nil, &ErrorEvent{Body: ev.Data}
				case data == "end":
					return &llm.Response{Content: []llm.Block{{Type: llm.BlockText, Text: text.String()}}}, nil
				case strings.HasPrefix(data, "bad "):
					return nil, errors.New(data)
				}
				d := llm.Delta{Index: 0, Text: data}
				if text.Len() == 0 {
					d.Type = llm.BlockText
				}
				text.WriteString(data)
				emit(d)
			}
		},
		Redact: func(msg string) string { return Redact(msg, key) },
	}
}

// streamServer answers every request with status, the x-remaining header
// and body, after checking what DoStream sends.
func streamServer(t *testing.T, status int, body string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "text/event-stream" || r.Header.Get("Content-Type") != "application/json" ||
			r.Header.Get("X-Signed") != "yes" {
			t.Errorf("request headers %v", r.Header)
		}
		w.Header().Set("x-remaining", "7")
		w.Header().Set("retry-after", "3")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestDoStream(t *testing.T) {
	t.Parallel()
	key := secret.New("sk-test-0123456789abcdefghij")
	sign := func(r *http.Request) error { r.Header.Set("X-Signed", "yes"); return nil }
	stream := func(t *testing.T, status int, body string, limit int) (*llm.Result, []llm.Delta, error) {
		srv := streamServer(t, status, body)
		var deltas []llm.Delta
		res, err := DoStream(t.Context(), srv.Client(), Call{Provider: "test", URL: srv.URL, Body: []byte(`{}`),
			Sign: sign, MaxResponseBytes: limit}, lineWire(key), func(d llm.Delta) { deltas = append(deltas, d) })
		return res, deltas, err
	}

	t.Run("an answer", func(t *testing.T) {
		t.Parallel()
		res, deltas, err := stream(t, 200, "data: Hel\n\ndata: lo\n\ndata: end\n\n", 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.Response.Text() != "Hello" || res.RateLimit.RequestsRemaining != 7 || res.Latency <= 0 {
			t.Errorf("result %+v", res)
		}
		want := []llm.Delta{{Type: llm.BlockText, Text: "Hel"}, {Text: "lo"}}
		if d := cmp.Diff(want, deltas); d != "" {
			t.Errorf("deltas (-want +got):\n%s", d)
		}
	})

	// A status outside 2xx is read whole and classified, as Do does; the
	// stream reader never sees it.
	t.Run("an error answer", func(t *testing.T) {
		t.Parallel()
		_, deltas, err := stream(t, 429, "data: slow down\n\ndata: end\n\n", 0)
		want := &llm.Error{Class: llm.ClassRateLimited, Provider: "test", Status: 429,
			Message: "data: slow down\n\ndata: end\n\n", RetryAfter: 3 * time.Second}
		var pe *llm.Error
		if !errors.As(err, &pe) {
			t.Fatalf("error %v, want an *llm.Error", err)
		}
		if d := cmp.Diff(want, pe); d != "" || len(deltas) != 0 {
			t.Errorf("error (-want +got):\n%s\ndeltas %v", d, deltas)
		}
	})

	// An error event is classified as a reply of the stream's status and
	// headers whose body is the event's data.
	t.Run("an error event", func(t *testing.T) {
		t.Parallel()
		_, deltas, err := stream(t, 200, "data: Hel\n\nevent: error\ndata: overloaded\n\n", 0)
		want := &llm.Error{Class: llm.ClassTransient, Provider: "test", Status: 200, Message: "overloaded", RetryAfter: 3 * time.Second}
		var pe *llm.Error
		if !errors.As(err, &pe) {
			t.Fatalf("error %v, want an *llm.Error", err)
		}
		if d := cmp.Diff(want, pe); d != "" || len(deltas) != 1 {
			t.Errorf("error (-want +got):\n%s\ndeltas %v", d, deltas)
		}
	})

	// A malformed stream is transient, as an unreadable 2xx is for Do,
	// with the rate limit read and the message redacted.
	t.Run("a malformed stream", func(t *testing.T) {
		t.Parallel()
		_, _, err := stream(t, 200, "data: Hel\n\ndata: bad chunk sk-test-0123456789abcdefghij\n\n", 0)
		var pe *llm.Error
		if !errors.As(err, &pe) || pe.Class != llm.ClassTransient || pe.Status != 200 || pe.RateLimit.RequestsRemaining != 7 {
			t.Fatalf("error %#v, want a transient *llm.Error with status and rate limit", err)
		}
		if strings.Contains(pe.Error(), key.Reveal()) || !strings.Contains(pe.Message, "bad chunk") {
			t.Errorf("message %q", pe.Message)
		}
	})

	t.Run("a stream longer than the limit", func(t *testing.T) {
		t.Parallel()
		_, _, err := stream(t, 200, "data: Hel\n\ndata: "+strings.Repeat("o", 100)+"\n\ndata: end\n\n", 64)
		var pe *llm.Error
		if !errors.As(err, &pe) || pe.Class != llm.ClassTransient || !strings.Contains(pe.Message, "exceeds 64 bytes") {
			t.Fatalf("error %v, want a transient *llm.Error naming the limit", err)
		}
	})

	t.Run("a stream of exactly the limit", func(t *testing.T) {
		t.Parallel()
		body := "data: Hel\n\ndata: end\n\n"
		if _, _, err := stream(t, 200, body, len(body)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("an adapter that does not stream", func(t *testing.T) {
		t.Parallel()
		w := lineWire(key)
		w.ReadStream = nil
		_, err := DoStream(t.Context(), nil, Call{Provider: "test", URL: "http://127.0.0.1:1"}, w, nil)
		if err == nil {
			t.Fatal("no error")
		}
		if _, ok := llm.ClassOf(err); ok {
			t.Errorf("a missing stream reader is a bug, not a provider failure: %v", err)
		}
	})
}
