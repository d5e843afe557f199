package service_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/config"
	"bulwark/pkg/service"
	"bulwark/pkg/testkit/mockprovider"
	"bulwark/pkg/testkit/testenv"
)

const (
	devToken   = "test-dev-token"
	adminToken = "test-admin-token"
)

// system is a whole Bulwark: the mock provider, API processes and worker
// processes, each with its own Redis and PostgreSQL clients, on one test
// Redis database and one test PostgreSQL database.
type system struct {
	t       testing.TB
	mock    *mockprovider.Server
	mockTS  *httptest.Server
	cfg     *config.Config
	doc     string // the configuration file's text, for worker subprocesses
	redis   *redis.Options
	pgDSN   string
	logs    *testenv.LogBuffer
	apis    []*apiProc
	workers []*service.Base
	quiet   bool // opts.quiet
}

type apiProc struct {
	base  *service.Base
	ts    *httptest.Server
	admin *httptest.Server // nil unless server.admin_listen is set
	stop  func()
}

// opts tune a system.
type opts struct {
	mock     mockprovider.Config
	extraYML string // appended to the generated config
	keysYML  string // replaces the default keys section
	// providersYML are more provider lines (indented two spaces); the
	// mock's URL is available as {mock}.
	providersYML string
	// fallbackYML, when set, replaces the fallback section.
	fallbackYML string
	// tenantYML is one more tenant entry (a YAML flow mapping).
	tenantYML string
	// pgDSN, when set, rewrites the DSN the processes get from that of
	// the test's database (e.g. to a proxy in front of it).
	pgDSN func(string) string
	// quiet logs warnings and errors only (benchmarks: the debug log of
	// every request would be measured too).
	quiet bool
	// redisYML, when set, replaces the redis section: a Redis of the
	// test's own (a cluster, a sentinel setup); s.redis is then nil.
	redisYML string
}

const defaultFallback = `fallback:
  claude/haiku: openai/gpt4o-mini
  claude/sonnet: openai/gpt4o
  openai/gpt4o-mini: claude/haiku
  openai/gpt4o: claude/sonnet`

const defaultKeys = `
keys:
  - {id: claude-sonnet-1, provider: claude, model_tier: sonnet, api_key: "mock-claude-key-1", rpm_limit: 600, tpm_limit: 400000}
  - {id: claude-sonnet-2, provider: claude, model_tier: sonnet, api_key: "mock-claude-key-2", rpm_limit: 600, tpm_limit: 400000}
  - {id: claude-haiku-1, provider: claude, model_tier: haiku, api_key: "mock-claude-key-3", rpm_limit: 600, tpm_limit: 400000}
  - {id: openai-gpt4o-1, provider: openai, model_tier: gpt4o, api_key: "mock-openai-key-a", rpm_limit: 600, tpm_limit: 400000}
  - {id: openai-gpt4o-mini-1, provider: openai, model_tier: gpt4o-mini, api_key: "mock-openai-key-b", rpm_limit: 600, tpm_limit: 400000}
`

// newSystem builds a system's config. Its demo tenant (devToken) has no
// queue share and no stream or wait limits: the tests of those use a tenant
// of their own (tenantYML).
func newSystem(t testing.TB, o opts) *system {
	t.Helper()
	s := &system{t: t, pgDSN: testenv.Postgres(t), logs: &testenv.LogBuffer{}, quiet: o.quiet}
	redisYML := o.redisYML
	if redisYML == "" {
		s.redis = testenv.RedisOptions(t)
		redisYML = fmt.Sprintf("redis: {addr: %q, db: %d}", s.redis.Addr, s.redis.DB)
	}
	var err error
	s.mock, err = mockprovider.New(o.mock)
	if err != nil {
		t.Fatal(err)
	}
	s.mockTS = httptest.NewServer(s.mock)
	t.Cleanup(func() { s.mock.Close(); s.mockTS.Close() })

	dsn := s.pgDSN
	if o.pgDSN != nil {
		dsn = o.pgDSN(dsn)
	}
	keys := defaultKeys
	if o.keysYML != "" {
		keys = o.keysYML
	}
	doc := fmt.Sprintf(`
server: {admin_token: %q, sync_timeout: 20s}
%s
postgres: {dsn: %q, max_conns: 8}
worker: {concurrency: 16, metrics_listen: "off"}
log: {format: json, level: debug}
providers:
  claude: {base_url: %q, timeout: 10s, tiers: {haiku: claude-haiku-4-5, sonnet: claude-sonnet-4-5}}
  openai: {base_url: %q, timeout: 10s, tiers: {gpt4o-mini: gpt-4o-mini, gpt4o: gpt-4o}}
%s
%s
models: {gpt-4o: openai/gpt4o, claude-sonnet: claude/sonnet}
tenants:
  - {name: demo, token: %q, max_priority: critical, rate_limit_rpm: -1, max_queued: -1, max_streams: -1, max_sync_waits: -1, max_reads_per_second: -1}
  - {name: other, token: "other-token", max_priority: critical}
%s
%s
%s`, adminToken, redisYML, dsn, s.mockTS.URL, s.mockTS.URL,
		strings.ReplaceAll(o.providersYML, "{mock}", s.mockTS.URL), cmp.Or(o.fallbackYML, defaultFallback),
		devToken, tenantLine(o.tenantYML), keys, o.extraYML)
	s.doc = doc
	s.cfg, err = config.Parse([]byte(doc), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return s
}

func (s *system) logger() *slog.Logger {
	level := slog.LevelDebug
	if s.quiet {
		level = slog.LevelWarn
	}
	return slog.New(slog.NewJSONHandler(s.logs, &slog.HandlerOptions{Level: level}))
}

func (s *system) open() *service.Base {
	s.t.Helper()
	b, err := service.Open(context.Background(), s.cfg, s.logger())
	if err != nil {
		s.t.Fatalf("open: %v", err)
	}
	return b
}

// startAPI starts one API process and returns its base URL.
func (s *system) startAPI() *apiProc { return s.startAPIWith(nil) }

// startAPIWith starts an API process after tune adjusts its Base.
func (s *system) startAPIWith(tune func(*service.Base)) *apiProc {
	s.t.Helper()
	b := s.open()
	if tune != nil {
		tune(b)
	}
	h, admin, hub := b.API()
	var adminTS *httptest.Server
	if admin != nil { // server.admin_listen set: the admin endpoints are on their own server
		adminTS = httptest.NewServer(admin)
		s.t.Cleanup(adminTS.Close)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = hub.Run(ctx) })
	ts := httptest.NewServer(h)
	var once sync.Once
	p := &apiProc{base: b, ts: ts, admin: adminTS, stop: func() {
		once.Do(func() {
			cancel()
			ts.CloseClientConnections()
			ts.Close()
			wg.Wait()
			b.Close()
		})
	}}
	s.t.Cleanup(p.stop)
	s.apis = append(s.apis, p)
	return p
}

// startWorker starts one worker process; the returned func stops it.
func (s *system) startWorker() func() {
	s.t.Helper()
	b := s.open()
	srv, mux := b.Worker(b.Clients())
	if b.Cache != nil {
		_ = b.Cache.Start(context.Background()) // as worker/main.go: hit counts and answers in the background
	}
	if err := srv.Start(mux); err != nil {
		s.t.Fatalf("worker: %v", err)
	}
	sweeper := b.Sweeper()
	sweeper.Start(context.Background())
	stopWatch := b.WatchBreakers() // as worker/main.go
	s.workers = append(s.workers, b)
	var once sync.Once
	stop := func() { once.Do(func() { sweeper.Stop(); srv.Shutdown(); stopWatch(); b.Close() }) }
	s.t.Cleanup(stop)
	return stop
}

func (s *system) inspector() *asynq.Inspector {
	c := redis.NewClient(s.redis)
	i := asynq.NewInspectorFromRedisClient(c)
	s.t.Cleanup(func() { i.Close(); c.Close() })
	return i
}

// call sends a JSON request with the dev token and decodes the answer.
func call(t testing.TB, method, url, token string, body any, hdr ...string) (int, map[string]any, http.Header) {
	t.Helper()
	if token != "" {
		hdr = append([]string{"Authorization", "Bearer " + token}, hdr...)
	}
	resp, raw := send(t, method, url, body, hdr...)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	if out == nil {
		out = map[string]any{"_raw": string(raw)}
	}
	return resp.StatusCode, out, resp.Header
}

// encodeBody is body as send sends it.
func encodeBody(t testing.TB, body any) []byte {
	t.Helper()
	switch b := body.(type) {
	case nil:
		return nil
	case string:
		return []byte(b)
	case []byte:
		return b
	}
	js, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// send sends a request and reads the whole answer (its body is closed).
// body is nil, a string or []byte sent as is, or a value sent as JSON;
// hdr are header name/value pairs (Content-Type is application/json
// unless one says otherwise). It gives up after 30 s.
func send(t testing.TB, method, url string, body any, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	sent := encodeBody(t, body)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(sent))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, url, err)
	}
	return resp, raw
}

// resendOn503 submits body with Idempotency-Key key and sends it again
// after each 503 (which must carry Retry-After), 200 ms apart, as a
// client would, until another answer or ctx's end; it returns the last
// answer and how many 503s came.
func resendOn503(ctx context.Context, t testing.TB, api *apiProc, body map[string]any, key string) (int, map[string]any, int) {
	for n503 := 0; ; n503++ {
		code, out, hdr := call(t, "POST", api.ts.URL+"/v1/requests", devToken, body, "Idempotency-Key", key)
		if code != http.StatusServiceUnavailable {
			return code, out, n503
		}
		if hdr.Get("Retry-After") == "" {
			t.Errorf("Idempotency-Key %s: 503 without Retry-After: %v", key, out)
		}
		select {
		case <-ctx.Done():
			return code, out, n503 + 1
		case <-time.After(200 * time.Millisecond): // the client's back-off: a retry policy, not a wait for an event
		}
	}
}

func ask(prompt string) map[string]any {
	return map[string]any{"provider": "claude", "model_tier": "sonnet",
		"messages": []map[string]any{{"role": "user", "content": prompt}}}
}

func (p *apiProc) submit(t testing.TB, body map[string]any, hdr ...string) string {
	t.Helper()
	code, out, _ := call(t, "POST", p.ts.URL+"/v1/requests", devToken, body, hdr...)
	if code != http.StatusAccepted && code != http.StatusOK {
		t.Fatalf("submit: %d %v", code, out)
	}
	return out["id"].(string)
}

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	ID, Type string
	Data     map[string]any
}

// stream opens an SSE stream and delivers its events on a channel that is
// closed when the stream ends.
func stream(t testing.TB, url, token, lastID string) (<-chan sseEvent, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("stream: %v", err)
	}
	if resp.StatusCode != 200 {
		cancel()
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	ch := make(chan sseEvent, 256)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.Type != "" {
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.ID = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.Type = line[7:]
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(line[6:]), &ev.Data)
			}
		}
	}()
	t.Cleanup(cancel)
	return ch, cancel
}

// next waits for the next event of one of the given types.
func next(t testing.TB, ch <-chan sseEvent, timeout time.Duration, types ...string) sseEvent {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("stream ended while waiting for %v", types)
			}
			for _, ty := range types {
				if ev.Type == ty {
					return ev
				}
			}
		case <-deadline:
			t.Fatalf("no %v event within %s", types, timeout)
		}
	}
}

// waitStatus polls GET until the request reaches status (bounded).
func (p *apiProc) waitStatus(t testing.TB, id string, timeout time.Duration, want ...string) map[string]any {
	t.Helper()
	return p.waitStatusAs(t, devToken, id, timeout, want...)
}

// waitStatusAs is waitStatus as the tenant of token.
func (p *apiProc) waitStatusAs(t testing.TB, token, id string, timeout time.Duration, want ...string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		_, out, _ := call(t, "GET", p.ts.URL+"/v1/requests/"+id, token, nil)
		for _, w := range want {
			if out["status"] == w {
				return out
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %s: status %v, want %v", id, out["status"], want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func stringsContains(s, sub string) bool { return strings.Contains(s, sub) }

func tenantLine(yml string) string {
	if yml == "" {
		return ""
	}
	return "  - " + yml
}
