package httpapi_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// The tenants' endpoints want a tenant's token (Bearer or x-api-key): none,
// an unknown one or the admin token is a 401, in the format of the
// endpoint asked (the compat SDKs understand only their own).
func TestTenantAuth(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	body := submitBody("q")
	for _, tt := range []struct{ name, token string }{{"no token", ""}, {"unknown token", "tok-nobody"}, {"admin token", tokAdmin}} {
		r := s.do(t, "POST", "/v1/requests", tt.token, body)
		if typ, _ := r.errorOf(t); r.code != http.StatusUnauthorized || typ != "invalid_api_key" {
			t.Errorf("%s: %d %s", tt.name, r.code, r.body)
		}
		r = s.do(t, "GET", "/v1/requests/req_x", tt.token, "")
		if r.code != http.StatusUnauthorized {
			t.Errorf("%s: GET %d", tt.name, r.code)
		}
	}
	if ids := s.queue.ids(); len(ids) != 0 {
		t.Fatalf("unauthenticated requests enqueued: %v", ids)
	}

	// OpenAI's error shape, then Anthropic's.
	r := s.do(t, "POST", "/v1/chat/completions", "", `{}`)
	e, _ := r.json(t)["error"].(map[string]any)
	if r.code != http.StatusUnauthorized || e["code"] != "invalid_api_key" || e["message"] == "" {
		t.Fatalf("chat completions without a token: %d %s", r.code, r.body)
	}
	r = s.do(t, "POST", "/v1/messages", "", `{}`, "x-api-key", "tok-nobody")
	m := r.json(t)
	if e, _ := m["error"].(map[string]any); r.code != http.StatusUnauthorized || m["type"] != "error" || e["type"] != "authentication_error" {
		t.Fatalf("messages with a bad x-api-key: %d %s", r.code, r.body)
	}

	// Both ways of sending a good token work.
	s.submit(t, tokAcme, "bearer")
	if r := s.do(t, "POST", "/v1/requests", "", body, "x-api-key", tokAcme); r.code != http.StatusAccepted {
		t.Fatalf("x-api-key: %d %s", r.code, r.body)
	}
}

// The admin endpoints want the admin token (Bearer, or the Basic-auth
// password); a tenant's is a 401 with a Basic challenge. Writes from
// another site are refused (403), and writes without a JSON Content-Type
// are a 415 that calls nothing.
func TestAdminAuth(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	for _, tok := range []string{"", tokAcme, "tok-nobody"} {
		r := s.do(t, "GET", "/admin/breakers", tok, "")
		if typ, _ := r.errorOf(t); r.code != http.StatusUnauthorized || typ != "unauthorized" ||
			!strings.HasPrefix(r.hdr.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("token %q: %d %s %q", tok, r.code, r.body, r.hdr.Get("WWW-Authenticate"))
		}
	}
	if r := s.do(t, "GET", "/admin/breakers", tokAdmin, ""); r.code != http.StatusOK || !strings.Contains(string(r.body), `"name":"all"`) {
		t.Fatalf("admin Bearer: %d %s", r.code, r.body)
	}
	req, _ := http.NewRequest("GET", s.url+"/admin/keys", nil)
	req.SetBasicAuth("operator", tokAdmin)
	if r := send(t, req); r.code != http.StatusOK || !strings.Contains(string(r.body), `"id":"k1"`) {
		t.Fatalf("admin Basic auth: %d %s", r.code, r.body)
	}

	const reset = "/admin/breakers/claude%2Fsonnet/reset"
	for _, hdr := range [][]string{{"Origin", "https://evil.example"}, {"Sec-Fetch-Site", "cross-site"}} {
		r := s.do(t, "POST", reset, tokAdmin, "", "Content-Type", "application/json", hdr[0], hdr[1])
		if typ, _ := r.errorOf(t); r.code != http.StatusForbidden || typ != "cross_site" {
			t.Errorf("%s: %d %s", hdr[0], r.code, r.body)
		}
	}
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded"} {
		r := s.do(t, "POST", reset, tokAdmin, "", "Content-Type", ct)
		if typ, field := r.errorOf(t); r.code != http.StatusUnsupportedMediaType || typ != "json_required" || field != "Content-Type" {
			t.Errorf("Content-Type %q: %d %s", ct, r.code, r.body)
		}
	}
	if calls := s.admin.list(); len(calls) != 0 {
		t.Fatalf("refused writes reached the admin: %v", calls)
	}
	r := s.do(t, "POST", reset, tokAdmin, "", "Content-Type", "application/json; charset=utf-8", "Origin", s.url)
	if r.code != http.StatusOK || r.json(t)["state"] != "closed" {
		t.Fatalf("reset: %d %s", r.code, r.body)
	}
	r = s.do(t, "POST", "/admin/keys/k1/disable?reason=leaked", tokAdmin, "", "Content-Type", "application/json")
	if r.code != http.StatusOK || r.json(t)["disabled"] != true {
		t.Fatalf("disable: %d %s", r.code, r.body)
	}
	if calls := s.admin.list(); !slices.Equal(calls, []string{"reset claude/sonnet", "disable k1 leaked"}) {
		t.Fatalf("admin calls %v", calls)
	}
}

// Cache invalidation is JSON in, JSON out: by case, by namespace, or a 422
// naming what to give.
func TestAdminInvalidate(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	post := func(body string) reply {
		return s.do(t, "POST", "/admin/cache/invalidate", tokAdmin, body, "Content-Type", "application/json")
	}
	if r := post(`{"tenant":"acme","case_id":"c1"}`); r.code != http.StatusOK || r.json(t)["deleted"] != 3.0 {
		t.Fatalf("by case: %d %s", r.code, r.body)
	}
	if r := post(`{"layer":"agent"}`); r.code != http.StatusOK || r.json(t)["deleted"] != 7.0 {
		t.Fatalf("by layer: %d %s", r.code, r.body)
	}
	if r := post(`{}`); r.code != http.StatusUnprocessableEntity {
		t.Fatalf("nothing named: %d %s", r.code, r.body)
	} else if _, field := r.errorOf(t); field != "case_id" {
		t.Fatalf("nothing named: field %q", field)
	}
	if r := post(`{"case":"c1"}`); r.code != http.StatusBadRequest {
		t.Fatalf("unknown field: %d %s", r.code, r.body)
	}
	if calls := s.admin.list(); !slices.Equal(calls, []string{"case acme c1", "namespace  agent"}) {
		t.Fatalf("admin calls %v", calls)
	}
}
