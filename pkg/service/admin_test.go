package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"bulwark/pkg/breaker"
	"bulwark/pkg/testkit/mockprovider"
)

// mockKeyValues are the api_key values of defaultKeys.
var mockKeyValues = []string{"mock-claude-key-1", "mock-claude-key-2", "mock-claude-key-3", "mock-openai-key-a", "mock-openai-key-b"}

// adminFetch fetches an admin URL with token and returns the status, the raw
// body and its Content-Type.
func adminFetch(t testing.TB, url, token string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), resp.Header.Get("Content-Type")
}

// keyListing lists the key pool by id.
func keyListing(t testing.TB, api *apiProc) (map[string]map[string]any, string) {
	t.Helper()
	code, raw, _ := adminFetch(t, api.ts.URL+"/admin/keys", adminToken)
	if code != http.StatusOK {
		t.Fatalf("/admin/keys: %d %s", code, raw)
	}
	var out struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		t.Fatalf("/admin/keys: %v: %s", err, raw)
	}
	byID := map[string]map[string]any{}
	for _, k := range out.Keys {
		byID[k["id"].(string)] = k
	}
	return byID, raw
}

// Every admin endpoint refuses a request without the admin token, and a
// tenant's token is not the admin token.
func TestAdminAuth(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	endpoints := []struct{ method, path string }{
		{"GET", "/admin/keys"},
		{"POST", "/admin/keys/claude-sonnet-1/disable"},
		{"POST", "/admin/keys/claude-sonnet-1/enable"},
		{"GET", "/admin/breakers"},
		{"POST", "/admin/breakers/all/reset"},
		{"POST", "/admin/cache/invalidate"},
		{"GET", "/admin/report"},
		{"GET", "/admin/queues"},
		{"GET", "/admin/queues/api/queues"},
	}
	for _, ep := range endpoints {
		for _, tok := range []string{"", devToken, otherTenantToken, adminToken + "x", strings.ToUpper(adminToken)} {
			code, out, _ := call(t, ep.method, api.ts.URL+ep.path, tok, `{"all": true}`)
			if code != http.StatusUnauthorized {
				t.Errorf("%s %s with token %q: %d, want 401 (%v)", ep.method, ep.path, tok, code, out)
			}
		}
	}
	// The refused disable changed nothing.
	keys, _ := keyListing(t, api)
	if keys["claude-sonnet-1"]["disabled"] != false {
		t.Fatalf("an unauthorised disable took effect: %v", keys["claude-sonnet-1"])
	}
}

// /admin/keys lists every key's state and never a key's value; disable
// and enable round-trip and steer traffic.
func TestAdminKeys(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()

	// One 429 on a Claude key: it cools, and the request moves to the other key.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultRateLimit, Count: 1, RetryAfter: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	id := api.submit(t, ask("cool one key"))
	if out := api.waitStatus(t, id, 15*time.Second, "completed", "failed"); out["status"] != "completed" {
		t.Fatalf("request with one 429: %v", out)
	}

	keys, raw := keyListing(t, api)
	for _, v := range mockKeyValues {
		if strings.Contains(raw, v) {
			t.Fatalf("/admin/keys shows the value of a key: %s", raw)
		}
	}
	if strings.Contains(raw, "api_key") {
		t.Fatalf("/admin/keys has an api_key field: %s", raw)
	}
	want := map[string][2]string{
		"claude-sonnet-1": {"claude", "sonnet"}, "claude-sonnet-2": {"claude", "sonnet"}, "claude-haiku-1": {"claude", "haiku"},
		"openai-gpt4o-1": {"openai", "gpt4o"}, "openai-gpt4o-mini-1": {"openai", "gpt4o-mini"},
	}
	if len(keys) != len(want) {
		t.Fatalf("%d keys listed, want %d: %s", len(keys), len(want), raw)
	}
	cooling := 0
	for id, pt := range want {
		k, ok := keys[id]
		if !ok {
			t.Fatalf("key %s not listed: %s", id, raw)
		}
		if k["provider"] != pt[0] || k["model_tier"] != pt[1] {
			t.Errorf("key %s: %v/%v, want %s/%s", id, k["provider"], k["model_tier"], pt[0], pt[1])
		}
		for _, f := range []string{"rpm_utilisation", "tpm_utilisation", "consecutive_429s", "disabled", "in_flight"} {
			if _, ok := k[f]; !ok {
				t.Errorf("key %s has no %s: %v", id, f, k)
			}
		}
		if u, _ := k["rpm_utilisation"].(float64); u < 0 || u > 1 {
			t.Errorf("key %s: rpm_utilisation %v outside [0,1]", id, k["rpm_utilisation"])
		}
		if cu, ok := k["cooling_until"].(string); ok {
			until, err := time.Parse(time.RFC3339Nano, cu)
			if err != nil || time.Until(until) < 20*time.Second {
				t.Errorf("key %s: cooling_until %q, want about 30 s ahead (Retry-After)", id, cu)
			}
			if k["consecutive_429s"] != 1.0 || pt[0] != "claude" {
				t.Errorf("cooling key %s: %v", id, k)
			}
			cooling++
		}
	}
	if cooling != 1 {
		t.Fatalf("%d keys cooling after one 429, want 1: %s", cooling, raw)
	}

	// Disable both Sonnet keys: Claude Sonnet requests are served by the
	// fallback; enable them: Claude answers again.
	for _, k := range []string{"claude-sonnet-1", "claude-sonnet-2"} {
		code, out, _ := call(t, "POST", api.ts.URL+"/admin/keys/"+k+"/disable?reason=rotating", adminToken, nil)
		if code != http.StatusOK || out["disabled"] != true {
			t.Fatalf("disable %s: %d %v", k, code, out)
		}
	}
	keys, _ = keyListing(t, api)
	for _, k := range []string{"claude-sonnet-1", "claude-sonnet-2"} {
		if keys[k]["disabled"] != true || keys[k]["disabled_reason"] != "rotating" {
			t.Fatalf("after disable: %v", keys[k])
		}
	}
	if keys["claude-haiku-1"]["disabled"] != false {
		t.Fatalf("disable touched another key: %v", keys["claude-haiku-1"])
	}
	id = api.submit(t, ask("served while sonnet keys are disabled"))
	out := api.waitStatus(t, id, 15*time.Second, "completed", "failed")
	if res, _ := out["result"].(map[string]any); out["status"] != "completed" || res["provider"] != "openai" {
		t.Fatalf("with both Sonnet keys disabled: %v", out)
	}
	for _, k := range []string{"claude-sonnet-1", "claude-sonnet-2"} {
		code, out, _ := call(t, "POST", api.ts.URL+"/admin/keys/"+k+"/enable", adminToken, nil)
		if code != http.StatusOK || out["disabled"] != false {
			t.Fatalf("enable %s: %d %v", k, code, out)
		}
	}
	keys, _ = keyListing(t, api)
	for _, k := range []string{"claude-sonnet-1", "claude-sonnet-2"} {
		if keys[k]["disabled"] != false {
			t.Fatalf("after enable: %v", keys[k])
		}
	}
	id = api.submit(t, ask("served after the keys are enabled"))
	out = api.waitStatus(t, id, 15*time.Second, "completed", "failed")
	if res, _ := out["result"].(map[string]any); out["status"] != "completed" || res["provider"] != "claude" {
		t.Fatalf("after enabling the Sonnet keys: %v", out)
	}

	// Unknown keys are 404, and the error does not echo anything secret.
	for _, action := range []string{"disable", "enable"} {
		code, out, _ := call(t, "POST", api.ts.URL+"/admin/keys/no-such-key/"+action, adminToken, nil)
		if code != http.StatusNotFound {
			t.Fatalf("%s an unknown key: %d %v", action, code, out)
		}
	}
}

var snakeCaseField = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// /admin/breakers lists the breakers with snake_case fields; /admin/queues
// serves asynqmon; /admin/report sums the history.
func TestAdminBreakersQueuesReport(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	start := time.Now().Add(-time.Minute)
	const n = 3
	for i := range n {
		id := api.submit(t, ask(fmt.Sprintf("report request %d", i)))
		if out := api.waitStatus(t, id, 15*time.Second, "completed", "failed"); out["status"] != "completed" {
			t.Fatalf("request %d: %v", i, out)
		}
	}

	code, raw, _ := adminFetch(t, api.ts.URL+"/admin/breakers", adminToken)
	if code != http.StatusOK {
		t.Fatalf("/admin/breakers: %d %s", code, raw)
	}
	var br struct {
		Breakers []map[string]any `json:"breakers"`
	}
	if err := json.Unmarshal([]byte(raw), &br); err != nil || len(br.Breakers) == 0 {
		t.Fatalf("/admin/breakers: %v: %s", err, raw)
	}
	names := map[string]bool{}
	for _, b := range br.Breakers {
		for f := range b {
			if !snakeCaseField.MatchString(f) {
				t.Errorf("breaker field %q is not snake_case", f)
			}
		}
		name, _ := b["name"].(string)
		names[name] = true
		if b["state"] != "closed" {
			t.Errorf("breaker %s: state %v after successful calls", name, b["state"])
		}
		if _, ok := b["consecutive_failures"]; !ok {
			t.Errorf("breaker %s: no consecutive_failures: %v", name, b)
		}
	}
	if !names["claude/sonnet"] {
		t.Fatalf("the route that served the requests has no breaker listed: %s", raw)
	}

	// asynqmon: its page and its API, with the admin token only.
	code, raw, ctype := adminFetch(t, api.ts.URL+"/admin/queues", adminToken)
	if code != http.StatusOK || !strings.HasPrefix(ctype, "text/html") || !strings.Contains(strings.ToLower(raw), "<html") {
		t.Fatalf("/admin/queues: %d %q %.200s", code, ctype, raw)
	}
	code, raw, _ = adminFetch(t, api.ts.URL+"/admin/queues/api/queues", adminToken)
	if code != http.StatusOK || !strings.Contains(raw, "normal") {
		t.Fatalf("/admin/queues/api/queues: %d %.300s", code, raw)
	}
	if code, _, _ := adminFetch(t, api.ts.URL+"/admin/queues", ""); code != http.StatusUnauthorized {
		t.Fatalf("/admin/queues without a token: %d", code)
	}

	// The report counts the requests once their history rows are final.
	var rep map[string]any
	waitFor(t, 10*time.Second, "the report to count the requests", func() bool {
		code, raw, _ := adminFetch(t, api.ts.URL+"/admin/report", adminToken)
		if code != http.StatusOK {
			t.Fatalf("/admin/report: %d %s", code, raw)
		}
		rep = nil
		if err := json.Unmarshal([]byte(raw), &rep); err != nil {
			t.Fatalf("/admin/report: %v: %s", err, raw)
		}
		bs, _ := rep["by_status"].(map[string]any)
		return rep["total"] == float64(n) && bs["completed"] == float64(n)
	})
	for _, f := range []string{"from", "to", "cache", "usage", "latency"} {
		if _, ok := rep[f]; !ok {
			t.Errorf("report has no %s: %v", f, rep)
		}
	}
	u := fmt.Sprintf("%s/admin/report?from=%s&to=%s", api.ts.URL, start.UTC().Format(time.RFC3339), time.Now().Add(time.Minute).UTC().Format(time.RFC3339))
	if code, raw, _ := adminFetch(t, u, adminToken); code != http.StatusOK || !strings.Contains(raw, `"total":3`) {
		t.Fatalf("report over an explicit range: %d %.300s", code, raw)
	}
	for _, q := range []string{"from=yesterday", "to=2020-13-01", "from=2030-01-01T00:00:00Z&to=2020-01-01T00:00:00Z"} {
		code, out, _ := call(t, "GET", api.ts.URL+"/admin/report?"+q, adminToken, nil)
		if e, _ := out["error"].(map[string]any); code != http.StatusBadRequest || e["message"] == "" {
			t.Errorf("report?%s: %d %v, want 400 with a message", q, code, out)
		}
	}
}

// A cached answer of case c1 stops hitting once case c1 is invalidated;
// another case's answer keeps hitting. A second API process, whose memo
// of exact hits holds c1's answer, hears of the invalidation made through
// the first and drops it (its memo's TTL is a minute here: only the
// notice can empty it within the test's wait).
func TestAdminCacheInvalidate(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {memo: {ttl: 1m}}"})
	api := s.startAPI()
	other := s.startAPI()
	s.startWorker()
	withCase := func(prompt, caseID string) map[string]any {
		b := ask(prompt)
		b["case_id"] = caseID
		return b
	}
	cachedRows := func(caseID string) int {
		var n int
		if err := api.base.PG.QueryRow(t.Context(), "SELECT count(*) FROM semantic_cache WHERE case_id = $1", caseID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// runsOn submits through api and returns how it was answered.
	runsOn := func(api *apiProc, body map[string]any) string {
		t.Helper()
		id, out := api.submitWith(t, devToken, body)
		if out["status"] != "completed" {
			out = api.waitStatus(t, id, 15*time.Second, "completed", "failed")
		}
		res, _ := out["result"].(map[string]any)
		if out["status"] != "completed" || res == nil {
			t.Fatalf("request: %v", out)
		}
		return res["cached"].(string)
	}
	runs := func(body map[string]any) string { t.Helper(); return runsOn(api, body) }
	c1 := withCase("Case c1: VIN 123 shows U0100 after OTA 3.2.1; which ECU lost comms?", "c1")
	c2 := withCase("Completely unrelated: summarise the weekly charging statistics of depot B.", "c2")
	for _, b := range []map[string]any{c1, c2} {
		if got := runs(b); got != "none" {
			t.Fatalf("first ask answered %q", got)
		}
	}
	waitFor(t, 10*time.Second, "both answers to be cached", func() bool { return cachedRows("c1") == 1 && cachedRows("c2") == 1 })
	if got := runs(c1); got != "exact" {
		t.Fatalf("second ask of c1 answered %q, want exact", got)
	}
	for range 2 { // the second from the other process's memo
		if got := runsOn(other, c1); got != "exact" {
			t.Fatalf("c1 through the other API process answered %q, want exact", got)
		}
	}
	if st := other.base.Cache.Stats(); st.MemoHits != 1 || st.MemoEntries != 1 {
		t.Fatalf("the other process's memo: %d hits, %d entries; want 1, 1", st.MemoHits, st.MemoEntries)
	}
	calls := s.mock.Stats().Total().OK

	code, out, _ := call(t, "POST", api.ts.URL+"/admin/cache/invalidate", adminToken, map[string]any{"tenant": "demo", "case_id": "c1"})
	if code != http.StatusOK || out["deleted"] != 1.0 {
		t.Fatalf("invalidate c1: %d %v", code, out)
	}
	waitFor(t, 5*time.Second, "the other process's memo to empty on the notice", func() bool {
		return other.base.Cache.Stats().MemoEntries == 0
	})
	if got := runsOn(other, c1); got != "none" {
		t.Fatalf("c1 after invalidation answered %q by the other process, want a miss", got)
	}
	if got := s.mock.Stats().Total().OK; got != calls+1 {
		t.Fatalf("provider calls %d after the invalidated ask, want %d", got, calls+1)
	}
	if got := runs(c2); got != "exact" {
		t.Fatalf("c2 after invalidating c1 answered %q, want exact", got)
	}
	// Another tenant's invalidation does not reach demo's entries.
	code, out, _ = call(t, "POST", api.ts.URL+"/admin/cache/invalidate", adminToken, map[string]any{"tenant": "other", "case_id": "c2"})
	if code != http.StatusOK || out["deleted"] != 0.0 || cachedRows("c2") != 1 {
		t.Fatalf("invalidating other's c2: %d %v (rows %d)", code, out, cachedRows("c2"))
	}

	bad := []struct {
		name   string
		body   any
		status int
	}{
		{"malformed", `{"tenant": "demo",`, http.StatusBadRequest},
		{"empty body", "", http.StatusBadRequest},
		{"not an object", `["c1"]`, http.StatusBadRequest},
		{"wrong type", `{"case_id": 1}`, http.StatusBadRequest},
		{"unknown field", `{"case": "c1"}`, http.StatusBadRequest},
		{"nothing to invalidate", `{}`, http.StatusUnprocessableEntity},
	}
	for _, tt := range bad {
		code, out, _ := call(t, "POST", api.ts.URL+"/admin/cache/invalidate", adminToken, tt.body)
		e, _ := out["error"].(map[string]any)
		if code != tt.status || e == nil || e["message"] == "" {
			t.Errorf("%s: %d %v, want %d with a message", tt.name, code, out, tt.status)
		}
	}
	if cachedRows("c2") != 1 {
		t.Fatal("a refused invalidation deleted entries")
	}
}

// A browser reaches asynqmon with the admin token as the Basic auth
// password, and is asked for it (WWW-Authenticate) without.
func TestAdminQueuesInABrowser(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	req, _ := http.NewRequest("GET", api.ts.URL+"/admin/queues", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("without credentials: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	req.SetBasicAuth("ops", adminToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("with Basic auth: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	req.SetBasicAuth("ops", devToken)
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("tenant token as password: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
}

// Admin writes must say they send JSON: a form (what a cross-site page can
// post without a preflight) is refused with 415 and changes nothing.
func TestAdminWritesRequireJSON(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x", ""} {
		req, _ := http.NewRequest("POST", api.ts.URL+"/admin/keys/claude-sonnet-1/disable", strings.NewReader("reason=x"))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType {
			t.Errorf("disable with Content-Type %q: %d, want 415", ct, resp.StatusCode)
		}
	}
	if keys, _ := keyListing(t, api); keys["claude-sonnet-1"]["disabled"] != false {
		t.Fatalf("a refused disable took effect: %v", keys["claude-sonnet-1"])
	}
	if code, out, _ := call(t, "POST", api.ts.URL+"/admin/keys/claude-sonnet-1/disable", adminToken, nil); code != http.StatusOK {
		t.Fatalf("disable with application/json: %d %v", code, out)
	}
}

// With server.admin_listen the admin endpoints leave the tenants' listener
// (404 there, like any unknown path) for a listener of their own.
func TestAdminListenerApart(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	s.cfg.Server.AdminListen = "127.0.0.1:0" // the harness serves both handlers itself
	api := s.startAPI()
	if api.admin == nil {
		t.Fatal("no admin handler with server.admin_listen set")
	}
	if code, out, _ := call(t, "GET", api.ts.URL+"/admin/keys", adminToken, nil); code != http.StatusNotFound {
		t.Errorf("/admin/keys on the tenants' listener: %d %v, want 404", code, out)
	}
	if code, out, _ := call(t, "GET", api.admin.URL+"/admin/keys", adminToken, nil); code != http.StatusOK {
		t.Errorf("/admin/keys on the admin listener: %d %v, want 200", code, out)
	}
	if code, _, _ := call(t, "POST", api.admin.URL+"/v1/requests", devToken, ask("wrong door")); code != http.StatusNotFound {
		t.Errorf("/v1/requests on the admin listener: %d, want 404", code)
	}
	// /metrics moves to the admin listener, still behind the token.
	if code, _, _ := adminFetch(t, api.ts.URL+"/metrics", adminToken); code != http.StatusNotFound {
		t.Errorf("/metrics on the tenants' listener: %d, want 404", code)
	}
	if code, _, _ := adminFetch(t, api.admin.URL+"/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics on the admin listener without a token: %d, want 401", code)
	}
	if code, body, _ := adminFetch(t, api.admin.URL+"/metrics", adminToken); code != http.StatusOK || !strings.Contains(body, "bulwark_queue_depth") {
		t.Errorf("/metrics on the admin listener with the token: %d %.200s", code, body)
	}
}

// /metrics on the tenants' listener wants the admin token: without it a
// scrape is a 401 that reads nothing from Redis; with it, the metrics.
func TestMetricsWantAdminToken(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	for _, tok := range []string{"", devToken} {
		code, body, _ := adminFetch(t, api.ts.URL+"/metrics", tok)
		if code != http.StatusUnauthorized || !strings.Contains(body, "admin token required") || strings.Contains(body, "bulwark_") {
			t.Errorf("/metrics with token %q: %d %.200s; want 401", tok, code, body)
		}
	}
	if code, body, _ := adminFetch(t, api.ts.URL+"/metrics", adminToken); code != http.StatusOK || !strings.Contains(body, "bulwark_queue_depth") {
		t.Fatalf("/metrics with the admin token: %d %.200s", code, body)
	}
}

// A flood of /readyz from load balancers costs PostgreSQL about one pool
// acquisition a second, not one a probe: 200 concurrent probes take at
// most two (the cache's second may turn during the flood). Each gets the
// status alone.
func TestReadyzFloodSparesPostgres(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	before := api.base.PG.Stat().AcquireCount()
	const n = 200
	var wg sync.WaitGroup
	bad := make(chan string, n)
	for range n {
		wg.Go(func() {
			if code, body, _ := adminFetch(t, api.ts.URL+"/readyz", ""); code != http.StatusOK || body != `{"status":"ok"}` {
				bad <- fmt.Sprintf("%d %.200s", code, body)
			}
		})
	}
	wg.Wait()
	close(bad)
	for b := range bad {
		t.Fatalf("a probe got %s; want 200 {\"status\":\"ok\"}", b)
	}
	if got := api.base.PG.Stat().AcquireCount() - before; got > 2 {
		t.Fatalf("%d probes took %d PostgreSQL pool connections; want at most 2", n, got)
	}
}

// The worker's metrics listener serves /metrics without a token (a
// private Prometheus scrapes it) and its profiles only with the admin
// token, wherever it is bound.
func TestWorkerDebugListener(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	s.startWorker()
	ts := httptest.NewServer(s.workers[0].DebugHandler())
	t.Cleanup(ts.Close)
	if code, body, _ := adminFetch(t, ts.URL+"/metrics", ""); code != http.StatusOK || !strings.Contains(body, "bulwark_") {
		t.Errorf("worker /metrics: %d %.200s", code, body)
	}
	for _, tok := range []string{"", devToken} {
		if code, body, _ := adminFetch(t, ts.URL+"/debug/pprof/goroutine?debug=1", tok); code != http.StatusUnauthorized ||
			!strings.Contains(body, "admin token required") {
			t.Errorf("worker pprof with token %q: %d %.200s; want 401", tok, code, body)
		}
	}
	if code, body, _ := adminFetch(t, ts.URL+"/debug/pprof/goroutine?debug=1", adminToken); code != http.StatusOK ||
		!strings.Contains(body, "goroutine profile:") {
		t.Errorf("worker pprof with the admin token: %d %.200s", code, body)
	}
}

// A route's breaker ("provider/tier") is reset through its escaped name,
// and a key that is not configured is a 404 while the pool itself is up.
func TestAdminResetRouteBreakerAndUnknownKey(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	ctx := context.Background()
	if err := api.base.Breakers.Trip(ctx, "claude/sonnet", "test"); err != nil {
		t.Fatal(err)
	}
	if st, _ := api.base.Breakers.Status(ctx, "claude/sonnet"); st.State != breaker.StateOpen {
		t.Fatalf("tripped breaker is %s", st.State)
	}
	code, out, _ := call(t, "POST", api.ts.URL+"/admin/breakers/claude%2Fsonnet/reset", adminToken, "{}")
	if code != http.StatusOK || out["name"] != "claude/sonnet" {
		t.Fatalf("reset claude%%2Fsonnet: %d %v", code, out)
	}
	if st, _ := api.base.Breakers.Status(ctx, "claude/sonnet"); st.State != breaker.StateClosed {
		t.Fatalf("after the reset the breaker is %s", st.State)
	}
	if code, out, _ := call(t, "POST", api.ts.URL+"/admin/keys/no-such-key/enable", adminToken, "{}"); code != http.StatusNotFound {
		t.Fatalf("enable an unknown key: %d %v", code, out)
	}
}

// The API's runtime profiles are behind the admin token: a tenant gets
// 401, an operator gets the goroutine profile (what `go tool pprof`
// fetches).
func TestAdminProfiles(t *testing.T) {
	s := newSystem(t, opts{})
	api := s.startAPI()
	u := api.ts.URL + "/admin/debug/pprof/goroutine?debug=1"
	if code, _, _ := adminFetch(t, u, devToken); code != http.StatusUnauthorized {
		t.Fatalf("tenant token: %d, want 401", code)
	}
	code, body, _ := adminFetch(t, u, adminToken)
	if code != http.StatusOK || !strings.Contains(body, "goroutine profile:") {
		t.Fatalf("admin token: %d %.200s", code, body)
	}
}
