package mockprovider

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is a settable Config.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// bundle is one mock served over real HTTP.
type bundle struct {
	srv    *Server
	url    string
	clock  *fakeClock
	client *http.Client // closed with the server, so no transport goroutine outlives a test
}

// setup starts a mock for cfg on a fake clock (unless cfg.Now is set).
func setup(t *testing.T, cfg Config) *bundle {
	t.Helper()
	clock := newFakeClock()
	if cfg.Now == nil {
		cfg.Now = clock.Now
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	t.Cleanup(srv.Close) // runs first: releases any request hanging on a timeout fault
	return &bundle{srv: srv, url: ts.URL, clock: clock, client: ts.Client()}
}

// reply is one HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
	return m
}

func (r reply) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

func (r reply) headerInt(t *testing.T, name string) int {
	t.Helper()
	v := r.header.Get(name)
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("header %s = %q: %v", name, v, err)
	}
	return n
}

func (b *bundle) do(t *testing.T, method, path string, header map[string]string, body any) reply {
	t.Helper()
	return b.doCtx(t, context.Background(), method, path, header, body)
}

func (b *bundle) doCtx(t *testing.T, ctx context.Context, method, path string, header map[string]string, body any) reply {
	t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(v)
	default:
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("encoding body: %v", err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.url+path, rd)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: raw}
}

func claudeHeaders(key string) map[string]string {
	h := map[string]string{"anthropic-version": "2023-06-01"}
	if key != "" {
		h["x-api-key"] = key
	}
	return h
}

func openAIHeaders(key string) map[string]string {
	if key == "" {
		return nil
	}
	return map[string]string{"Authorization": "Bearer " + key}
}

func (b *bundle) claude(t *testing.T, key string, body any) reply {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/messages", claudeHeaders(key), body)
}

func (b *bundle) chat(t *testing.T, key string, body any) reply {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/chat/completions", openAIHeaders(key), body)
}

func (b *bundle) embed(t *testing.T, key string, body any) reply {
	t.Helper()
	return b.do(t, http.MethodPost, "/v1/embeddings", openAIHeaders(key), body)
}

// claudeText is a minimal Messages request.
func claudeText(prompt string, maxTokens int) map[string]any {
	return map[string]any{
		"model":      "claude-test",
		"max_tokens": maxTokens,
		"messages":   []any{map[string]any{"role": "user", "content": prompt}},
	}
}

// chatText is a minimal Chat Completions request.
func chatText(prompt string, maxTokens int) map[string]any {
	return map[string]any{
		"model":      "gpt-test",
		"max_tokens": maxTokens,
		"messages":   []any{map[string]any{"role": "user", "content": prompt}},
	}
}

func wantStatus(t *testing.T, r reply, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
}
