package service_test

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"bulwark/pkg/config"
	"bulwark/pkg/service"
)

// A Last-Event-ID that is not one the stream sent (malformed, or from the
// future, which would silently drop every live event) is refused; the
// stream of a request that has ended, reconnected after its terminal
// event, repeats that event and closes instead of keeping alive forever.
func TestEventStreamEdges(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	id := api.submit(t, ask("stream edges"))
	api.waitStatus(t, id, 20*time.Second, "completed")
	url := api.ts.URL + "/v1/requests/" + id + "/events"

	future := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10) + "-0"
	for _, bad := range []string{"garbage", "12-x", future} {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+devToken)
		req.Header.Set("Last-Event-ID", bad)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("Last-Event-ID %q: %d %s, want 400", bad, resp.StatusCode, body)
		}
	}

	ch, _ := stream(t, url, devToken, "")
	done := next(t, ch, 5*time.Second, "completed")
	again, _ := stream(t, url, devToken, done.ID)
	if ev := next(t, again, 5*time.Second, "completed"); ev.Data["result"] == nil {
		t.Fatalf("reconnected after the end: %v", ev.Data)
	}
	select {
	case _, open := <-again:
		if open {
			t.Fatal("the stream went on after the terminal event")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream of an ended request stayed open")
	}
}

// A client that sends half a request header is cut after
// server.read_header_timeout instead of holding a connection forever.
func TestListenerCutsSlowHeaders(t *testing.T) {
	t.Parallel()
	cfg := &config.Config{Server: config.Server{ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: time.Second,
		IdleTimeout: time.Second, MaxHeaderBytes: 4096}}
	b := &service.Base{Cfg: cfg, Logger: slog.New(slog.DiscardHandler)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := b.HTTPServer(ln.Addr().String(), http.NotFoundHandler())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	_, err = io.ReadAll(conn) // returns once the server closes the connection
	if err != nil || time.Since(start) > 3*time.Second {
		t.Fatalf("half a header held the connection for %s (err %v)", time.Since(start), err)
	}
}

// A retry with the Idempotency-Key of a request already accepted gets that
// request back, even when the tenant's rate limit would refuse a new one.
func TestIdempotentRetryBeforeRateLimit(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}",
		tenantYML: `{name: slow, token: "slow-token", max_priority: critical, rate_limit_rpm: 1}`})
	api := s.startAPI()
	code, first, _ := call(t, "POST", api.ts.URL+"/v1/requests", "slow-token", ask("retry me"), "Idempotency-Key", "r-1")
	if code != http.StatusAccepted {
		t.Fatalf("first: %d %v", code, first)
	}
	if code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", "slow-token", ask("another"), "Idempotency-Key", "r-2"); code != http.StatusTooManyRequests {
		t.Fatalf("a new request past the limit: %d %v, want 429", code, out)
	}
	code, again, _ := call(t, "POST", api.ts.URL+"/v1/requests", "slow-token", ask("retry me"), "Idempotency-Key", "r-1")
	if code/100 != 2 || again["id"] != first["id"] {
		t.Fatalf("the retry: %d %v, want the first request %v", code, again, first["id"])
	}
}

// Input that PostgreSQL or the worker could not take later is refused at
// the door with 422 and a field: a NUL character (history and cache rows
// would fail to be written), an unknown content block type.
func TestRefusedAtTheDoor(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	nulText := map[string]any{"provider": "claude", "model_tier": "sonnet",
		"messages": []map[string]any{{"role": "user", "content": "a\x00b"}}}
	badBlock := map[string]any{"provider": "claude", "model_tier": "sonnet",
		"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image", "text": "x"}}}}}
	nulSystem := ask("fine")
	nulSystem["system"] = "sys\x00"
	for name, body := range map[string]map[string]any{"nul in text": nulText, "unknown block": badBlock, "nul in system": nulSystem} {
		code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, body)
		e, _ := out["error"].(map[string]any)
		if code != http.StatusUnprocessableEntity || e["field"] == "" || e["field"] == nil {
			t.Errorf("%s: %d %v, want 422 naming the field", name, code, out)
		}
	}
}

// A state-changing admin request a browser sends for another site is
// refused, even with the admin credentials the browser resends; the same
// request from a script (no Origin, no Sec-Fetch-Site) passes.
func TestAdminRefusesCrossSite(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	url := api.ts.URL + "/admin/breakers/all/reset"
	for name, hdr := range map[string][]string{
		"cross-site fetch": {"Sec-Fetch-Site", "cross-site"},
		"other origin":     {"Origin", "https://evil.example"},
	} {
		code, out, _ := call(t, "POST", url, adminToken, nil, hdr...)
		if code != http.StatusForbidden {
			t.Errorf("%s: %d %v, want 403", name, code, out)
		}
	}
	if code, out, _ := call(t, "POST", url, adminToken, nil); code/100 != 2 {
		t.Fatalf("from a script: %d %v", code, out)
	}
	if code, _, _ := call(t, "GET", api.ts.URL+"/admin/breakers", adminToken, nil, "Sec-Fetch-Site", "cross-site"); code != http.StatusOK {
		t.Fatalf("a cross-site read: %d, want 200 (reads change nothing)", code)
	}
}
