package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"bulwark/pkg/httpapi"
	"bulwark/pkg/secret"
)

// /healthz always answers. /readyz is 503 while a required dependency is
// down and 200 while only a degradable one is; without a token it says
// only "ok" or "unavailable", with the admin token it names each
// dependency and the degraded ones, and with another token it is a 401.
func TestHealth(t *testing.T) {
	t.Parallel()
	down := errors.New("down")
	ok := func(context.Context) error { return nil }
	fail := func(context.Context) error { return down }
	for _, tt := range []struct {
		name             string
		ready, degraded  httpapi.Pinger
		code             int
		status           string
		isReady          bool
		degradedReported bool
	}{
		{"all up", ok, ok, http.StatusOK, "ok", true, false},
		{"postgres down", ok, fail, http.StatusOK, "ok", true, true},
		{"redis down", fail, ok, http.StatusServiceUnavailable, "unavailable", false, false},
	} {
		s := newServer(t, func(su *setup) {
			su.deps.Ready = map[string]httpapi.Pinger{"redis": tt.ready}
			su.deps.Degradable = map[string]httpapi.Pinger{"postgres": tt.degraded}
		})
		if r := s.do(t, "GET", "/healthz", "", ""); r.code != http.StatusOK || string(r.body) != `{"status":"ok"}` {
			t.Errorf("%s: healthz %d %s", tt.name, r.code, r.body)
		}
		if r := s.do(t, "GET", "/readyz", "", ""); r.code != tt.code || string(r.body) != `{"status":"`+tt.status+`"}` {
			t.Errorf("%s: readyz without a token %d %s; want %d and the status alone", tt.name, r.code, r.body, tt.code)
		}
		for _, tok := range []string{tokAcme, "tok-nobody"} {
			if r := s.do(t, "GET", "/readyz", tok, ""); r.code != http.StatusUnauthorized || strings.Contains(string(r.body), "redis") {
				t.Errorf("%s: readyz with token %q: %d %s; want 401", tt.name, tok, r.code, r.body)
			}
		}
		r := s.do(t, "GET", "/readyz", tokAdmin, "")
		m := r.json(t)
		checks, _ := m["checks"].(map[string]any)
		_, hasDegraded := m["degraded"]
		if r.code != tt.code || m["status"] != tt.status || m["ready"] != tt.isReady || hasDegraded != tt.degradedReported ||
			checks["redis"] == nil || checks["postgres"] == nil {
			t.Errorf("%s: readyz with the admin token %d %s", tt.name, r.code, r.body)
		}
		if tt.degradedReported && (checks["postgres"] != "down" || !strings.Contains(string(r.body), `"degraded":["postgres"]`)) {
			t.Errorf("%s: readyz %s", tt.name, r.body)
		}
		if !tt.isReady && checks["redis"] != "down" {
			t.Errorf("%s: readyz %s", tt.name, r.body)
		}
	}
}

// A flood of /readyz probes checks the dependencies about once a second,
// not once a probe: 200 concurrent probes cost at most two checks of
// each (one, or two if the flood straddles the cache's second).
func TestReadyzFlood(t *testing.T) {
	t.Parallel()
	var redisPings, pgPings atomic.Int64
	s := newServer(t, func(su *setup) {
		su.deps.Ready = map[string]httpapi.Pinger{"redis": func(context.Context) error { redisPings.Add(1); return nil }}
		su.deps.Degradable = map[string]httpapi.Pinger{"postgres": func(context.Context) error { pgPings.Add(1); return nil }}
	})
	const n = 200
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { codes <- s.do(t, "GET", "/readyz", "", "").code })
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Fatalf("a probe got %d", c)
		}
	}
	if r, p := redisPings.Load(), pgPings.Load(); r < 1 || r > 2 || p < 1 || p > 2 {
		t.Fatalf("%d probes checked Redis %d and PostgreSQL %d times; want 1 or 2 each", n, r, p)
	}
}

// /metrics is an operator surface: on the tenants' listener it wants the
// admin token (Prometheus's bearer token) and a tenant's token is a 401;
// with an admin listener it is served there alone, still behind the
// token, and the tenants' listener answers 404. The API's profiles want
// the token too.
func TestOperatorSurfaces(t *testing.T) {
	t.Parallel()
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("bulwark_queue_depth{priority=\"normal\"} 0\n"))
	})
	profiles := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("profile")) })
	wantRefused := func(t *testing.T, what string, r reply) {
		t.Helper()
		msg := ""
		if e, _ := r.json(t)["error"].(map[string]any); e != nil {
			msg, _ = e["message"].(string)
		}
		if r.code != http.StatusUnauthorized || !strings.Contains(msg, "admin token required") || strings.Contains(string(r.body), tokAdmin) {
			t.Errorf("%s: %d %s; want 401 asking for the admin token", what, r.code, r.body)
		}
	}
	for _, apart := range []bool{false, true} {
		s := newServer(t, func(su *setup) {
			su.cfg.AdminApart = apart
			su.deps.Metrics, su.deps.Profiles = metrics, profiles
		})
		ops := s
		if apart {
			ops = &server{url: s.adminURL}
			if r := s.do(t, "GET", "/metrics", tokAdmin, ""); r.code != http.StatusNotFound {
				t.Errorf("admin apart: /metrics on the tenants' listener %d %s; want 404", r.code, r.body)
			}
		}
		for _, tok := range []string{"", tokAcme, "tok-nobody"} {
			wantRefused(t, "/metrics with token "+tok, ops.do(t, "GET", "/metrics", tok, ""))
			wantRefused(t, "pprof with token "+tok, ops.do(t, "GET", "/admin/debug/pprof/heap", tok, ""))
		}
		if r := ops.do(t, "GET", "/metrics", tokAdmin, ""); r.code != http.StatusOK || !strings.Contains(string(r.body), "bulwark_queue_depth") {
			t.Errorf("apart=%v: /metrics with the admin token %d %s", apart, r.code, r.body)
		}
		if r := ops.do(t, "GET", "/admin/debug/pprof/heap", tokAdmin, ""); r.code != http.StatusOK {
			t.Errorf("apart=%v: pprof with the admin token %d %s", apart, r.code, r.body)
		}
		for _, u := range []string{s.url, ops.url} {
			if r := (&server{url: u}).do(t, "GET", "/readyz", "", ""); r.code != http.StatusOK || string(r.body) != `{"status":"ok"}` {
				t.Errorf("apart=%v: /readyz on %s: %d %s", apart, u, r.code, r.body)
			}
		}
	}
}

// AdminOnly, the guard of the worker's profiles, lets the admin token
// through (Bearer, x-api-key, Basic password) and nothing else; without a
// configured token nothing passes.
func TestAdminOnly(t *testing.T) {
	t.Parallel()
	inner := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	for _, tt := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"none", func(*http.Request) {}, http.StatusUnauthorized},
		{"wrong bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, http.StatusUnauthorized},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tokAdmin) }, http.StatusTeapot},
		{"x-api-key", func(r *http.Request) { r.Header.Set("x-api-key", tokAdmin) }, http.StatusTeapot},
		{"basic", func(r *http.Request) { r.SetBasicAuth("op", tokAdmin) }, http.StatusTeapot},
	} {
		req, _ := http.NewRequest("GET", "/debug/pprof/", nil)
		tt.set(req)
		rec := httptest.NewRecorder()
		httpapi.AdminOnly(secret.New(tokAdmin), inner).ServeHTTP(rec, req)
		if rec.Code != tt.want {
			t.Errorf("%s: %d %s; want %d", tt.name, rec.Code, rec.Body, tt.want)
		}
		rec = httptest.NewRecorder()
		httpapi.AdminOnly(secret.String{}, inner).ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("%s without a configured token: %d", tt.name, rec.Code)
		}
	}
}
