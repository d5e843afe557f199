package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/wiretest"
)

func TestPost(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Content-Type") != "application/json" || r.Header.Get("X-Test") != "1" || string(body) != `{"a":1}` {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		w.Header().Set("x-ratelimit-limit-requests", "10")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte("slow down"))
	}))
	t.Cleanup(srv.Close)
	reply, err := Post(t.Context(), srv.Client(), Call{
		Provider: llm.ProviderOpenAI,
		URL:      srv.URL,
		Header:   http.Header{"X-Test": {"1"}},
		Body:     []byte(`{"a":1}`),
		Timeout:  time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Any status is a reply: classifying it is the adapter's job.
	if reply.Status != 429 || string(reply.Body) != "slow down" || reply.Header.Get("x-ratelimit-limit-requests") != "10" || reply.Latency <= 0 {
		t.Errorf("reply %+v", reply)
	}
}

// Call.MaxResponseBytes raises (or lowers) the body limit for one call; zero
// keeps MaxResponseBytes.
func TestPostMaxResponseBytes(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("x", MaxResponseBytes+1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	for _, tt := range []struct {
		limit   int
		wantErr bool
	}{
		{0, true},
		{-1, true},
		{10, true},
		{MaxResponseBytes + 1, false},
	} {
		reply, err := Post(t.Context(), srv.Client(), Call{Provider: llm.ProviderOpenAI, URL: srv.URL, MaxResponseBytes: tt.limit})
		if !tt.wantErr {
			if err != nil || len(reply.Body) != len(body) {
				t.Errorf("limit %d: error %v", tt.limit, err)
			}
			continue
		}
		want := MaxResponseBytes
		if tt.limit > 0 {
			want = tt.limit
		}
		var pe *llm.Error
		if !errors.As(err, &pe) || pe.Class != llm.ClassTransient || pe.Status != http.StatusOK ||
			!strings.Contains(pe.Message, fmt.Sprintf("exceeds %d bytes", want)) {
			t.Errorf("limit %d: error %v, want a transient *llm.Error naming %d bytes", tt.limit, err, want)
		}
	}
}

func TestPostFailures(t *testing.T) {
	t.Parallel()

	t.Run("own timeout", func(t *testing.T) {
		t.Parallel()
		srv := wiretest.Hang(t)
		_, err := Post(t.Context(), srv.Client(), Call{Provider: llm.ProviderClaude, URL: srv.URL, Timeout: 30 * time.Millisecond})
		var pe *llm.Error
		if !errors.As(err, &pe) || pe.Class != llm.ClassTransient || pe.Provider != llm.ProviderClaude {
			t.Fatalf("error %v, want a transient *llm.Error", err)
		}
		if errors.Is(err, context.DeadlineExceeded) || !strings.Contains(pe.Message, "no answer within 30ms") {
			t.Errorf("error %v", err)
		}
	})

	t.Run("caller deadline is the caller's", func(t *testing.T) {
		t.Parallel()
		srv := wiretest.Hang(t)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
		defer cancel()
		_, err := Post(ctx, srv.Client(), Call{Provider: llm.ProviderClaude, URL: srv.URL, Timeout: time.Minute})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v, want context.DeadlineExceeded", err)
		}
		if _, ok := llm.ClassOf(err); ok {
			t.Errorf("caller's deadline classified: %v", err)
		}
	})

	t.Run("caller cancel with a cause", func(t *testing.T) {
		t.Parallel()
		srv, ctx := wiretest.CancelWhenIn(t, errors.New("client went away"))
		_, err := Post(ctx, srv.Client(), Call{Provider: llm.ProviderClaude, URL: srv.URL, Timeout: time.Minute})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want context.Canceled", err)
		}
	})

	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL + "/v1/x?key=secret-in-query"
		srv.Close()
		_, err := Post(t.Context(), nil, Call{Provider: llm.ProviderOpenAI, URL: url})
		var pe *llm.Error
		if !errors.As(err, &pe) || pe.Class != llm.ClassTransient || pe.Err == nil {
			t.Fatalf("error %v, want a transient *llm.Error with a cause", err)
		}
		if strings.Contains(err.Error(), "secret-in-query") {
			t.Errorf("error leaks the URL: %v", err)
		}
	})

	t.Run("malformed URL is not a provider failure", func(t *testing.T) {
		t.Parallel()
		_, err := Post(t.Context(), nil, Call{Provider: llm.ProviderOpenAI, URL: "http://[::1"})
		if _, ok := llm.ClassOf(err); err == nil || ok {
			t.Fatalf("error %v, want an unclassified error", err)
		}
	})
}

// Call.Sign sees the request as it will be sent (every header, the body
// still readable), and what it adds reaches the provider; when it fails
// nothing is sent. Without Sign the request goes as built.
func TestPostSign(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen-Signature", r.Header.Get("X-Signature"))
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	call := func(sign func(*http.Request) error) (*Reply, error) {
		return Post(t.Context(), srv.Client(), Call{Provider: "bedrock", URL: srv.URL,
			Header: http.Header{"X-Test": {"1"}}, Body: []byte(`{"a":1}`), Sign: sign})
	}

	reply, err := call(func(r *http.Request) error {
		if r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Accept") != "application/json" ||
			r.Header.Get("X-Test") != "1" || r.ContentLength != int64(len(`{"a":1}`)) || r.Method != http.MethodPost {
			return fmt.Errorf("Sign saw an unfinished request: %v", r.Header)
		}
		r.Header.Set("X-Signature", r.Header.Get("X-Test")+"-signed")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if reply.Header.Get("X-Seen-Signature") != "1-signed" || string(reply.Body) != `{"a":1}` {
		t.Errorf("reply %+v, want the signature header and the body echoed", reply)
	}

	if reply, err := call(nil); err != nil || reply.Header.Get("X-Seen-Signature") != "" {
		t.Errorf("without Sign: reply %+v, error %v", reply, err)
	}

	before := hits.Load()
	_, err = call(func(*http.Request) error {
		return &llm.Error{Class: llm.ClassAuth, Provider: "bedrock", Message: "no credentials"}
	})
	var pe *llm.Error
	if !errors.As(err, &pe) || pe.Class != llm.ClassAuth || err != error(pe) {
		t.Errorf("error %v, want Sign's *llm.Error as it is", err)
	}
	plain := errors.New("signer broke")
	_, err = call(func(*http.Request) error { return plain })
	if _, ok := llm.ClassOf(err); !errors.Is(err, plain) || ok || !strings.Contains(err.Error(), "bedrock: sign request") {
		t.Errorf("error %v, want Sign's error wrapped without a class", err)
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("%d requests sent after Sign failed", n)
	}
}

func TestEndpoint(t *testing.T) {
	t.Parallel()
	tests := []struct{ base, path, want string }{
		{"https://api.anthropic.com", "/v1/messages", "https://api.anthropic.com/v1/messages"},
		{"https://api.anthropic.com/", "/v1/messages", "https://api.anthropic.com/v1/messages"},
		{"https://api.openai.com/v1", "/v1/chat/completions", "https://api.openai.com/v1/chat/completions"},
		{"https://api.openai.com/v1/", "/v1/chat/completions", "https://api.openai.com/v1/chat/completions"},
		{"https://gw.internal/openai", "/v1/chat/completions", "https://gw.internal/openai/v1/chat/completions"},
		{"http://127.0.0.1:8080/anthropic/v1", "/v1/messages", "http://127.0.0.1:8080/anthropic/v1/messages"},
	}
	for _, tt := range tests {
		if got := Endpoint(tt.base, tt.path); got != tt.want {
			t.Errorf("Endpoint(%q, %q) = %q, want %q", tt.base, tt.path, got, tt.want)
		}
	}
}

func TestValidateBaseURL(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"https://api.openai.com", "http://127.0.0.1:9/x"} {
		if err := ValidateBaseURL("f", ok); err != nil {
			t.Errorf("ValidateBaseURL(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "api.openai.com", "ftp://x", "https://x/?key=1", "http://[::1"} {
		if err := ValidateBaseURL("cfg.BaseURL", bad); err == nil || !strings.HasPrefix(err.Error(), "cfg.BaseURL") {
			t.Errorf("ValidateBaseURL(%q) = %v, want an error naming the field", bad, err)
		}
	}
}

func TestClassifyStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status int
		want   llm.Class
	}{
		{400, llm.ClassPermanent}, {401, llm.ClassAuth}, {402, llm.ClassQuota}, {403, llm.ClassAuth},
		{404, llm.ClassPermanent}, {408, llm.ClassTransient}, {409, llm.ClassPermanent}, {413, llm.ClassPermanent},
		{422, llm.ClassPermanent}, {429, llm.ClassRateLimited}, {500, llm.ClassTransient}, {502, llm.ClassTransient},
		{503, llm.ClassTransient}, {504, llm.ClassTransient}, {529, llm.ClassOverloaded}, {302, llm.ClassTransient},
	}
	for _, tt := range tests {
		if got := ClassifyStatus(tt.status); got != tt.want {
			t.Errorf("ClassifyStatus(%d) = %s, want %s", tt.status, got, tt.want)
		}
	}
}

func TestBadHeaderValue(t *testing.T) {
	t.Parallel()
	if BadHeaderValue("sk-ant-api03-abc\t") || !BadHeaderValue("abc\n") || !BadHeaderValue("a\x7f") {
		t.Error("BadHeaderValue misjudged")
	}
}

func TestSplitText(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "short", strings.Repeat("ab", 9), strings.Repeat("日本語テキスト", 40), strings.Repeat("x", 10_000)} {
		pieces := SplitText(s)
		if strings.Join(pieces, "") != s {
			t.Errorf("SplitText(%d bytes) does not concatenate back", len(s))
		}
		if len(pieces) > StreamChunks || (s != "" && len(pieces) == 0) {
			t.Errorf("SplitText(%d bytes) = %d pieces", len(s), len(pieces))
		}
		for _, p := range pieces {
			if !utf8.ValidString(p) || p == "" {
				t.Errorf("SplitText(%d bytes) made piece %q", len(s), p)
			}
		}
	}
	if n := len(SplitText(strings.Repeat("x", 400))); n < 2 {
		t.Errorf("a long text went out in %d piece(s)", n)
	}
}

func TestWriteEventAndNewID(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	if err := WriteEvent(&b, "ping", map[string]string{"type": "ping", "html": "<b>"}); err != nil {
		t.Fatal(err)
	}
	if want := "event: ping\ndata: {\"html\":\"<b>\",\"type\":\"ping\"}\n\n"; b.String() != want {
		t.Errorf("WriteEvent = %q, want %q", b.String(), want)
	}
	a, c := NewID("msg_"), NewID("msg_")
	if a == c || !strings.HasPrefix(a, "msg_") || len(a) != len("msg_")+24 {
		t.Errorf("NewID = %q, %q", a, c)
	}
}
