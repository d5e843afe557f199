package service_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/config"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/testkit/mockprovider"
)

const otherTenantToken = "other-token"

func tokenHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// submitWith submits body with token and returns the id and the answer.
func (p *apiProc) submitWith(t testing.TB, token string, body map[string]any) (string, map[string]any) {
	t.Helper()
	code, out, _ := call(t, "POST", p.ts.URL+"/v1/requests", token, body)
	if code != http.StatusAccepted && code != http.StatusOK {
		t.Fatalf("submit: %d %v", code, out)
	}
	return out["id"].(string), out
}

// waitStatusWith is waitStatus with another tenant's token.
func (p *apiProc) waitStatusWith(t testing.TB, token, id string, timeout time.Duration, want ...string) map[string]any {
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

// sseRefusal opens an event stream and returns its status and body (the
// body only when the stream is refused, so the call never blocks).
func sseRefusal(t testing.TB, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// sameAsUnknown checks that an answer about a foreign request is the same
// 404 as the one about a request that does not exist: nothing tells the
// caller the id is real.
func sameAsUnknown(t testing.TB, what string, code int, body, unknownBody, id, unknownID string) {
	t.Helper()
	if code != http.StatusNotFound {
		t.Fatalf("%s: status %d, want 404: %s", what, code, body)
	}
	if got, want := strings.ReplaceAll(body, id, "ID"), strings.ReplaceAll(unknownBody, unknownID, "ID"); got != want {
		t.Fatalf("%s: the 404 differs from an unknown id's:\n got  %s\n want %s", what, got, want)
	}
}

func plainCall(t testing.TB, method, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// Tenant "other" can neither read, stream nor cancel a request of tenant
// "demo" (live or only in the history), and never gets demo's cached answers.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	insp := s.inspector()
	normal := queue.Name(priority.Normal)
	if err := insp.PauseQueue(normal); err != nil {
		t.Fatal(err)
	}
	s.startWorker()

	const prompt = "Car 31 reports P0A7F after OTA 4.1; is the HV battery at risk?"
	id, _ := api.submitWith(t, devToken, ask(prompt))
	u := api.ts.URL + "/v1/requests/"
	const unknown = "req_doesnotexist0000000000"

	// While queued.
	_, unknownGet := plainCall(t, "GET", u+unknown, otherTenantToken)
	code, body := plainCall(t, "GET", u+id, otherTenantToken)
	sameAsUnknown(t, "GET by another tenant", code, body, unknownGet, id, unknown)
	_, unknownSSE := sseRefusal(t, u+unknown+"/events", otherTenantToken)
	code, body = sseRefusal(t, u+id+"/events", otherTenantToken)
	sameAsUnknown(t, "SSE by another tenant", code, body, unknownSSE, id, unknown)
	_, unknownDel := plainCall(t, "DELETE", u+unknown, otherTenantToken)
	code, body = plainCall(t, "DELETE", u+id, otherTenantToken)
	sameAsUnknown(t, "DELETE by another tenant", code, body, unknownDel, id, unknown)

	// The foreign DELETE changed nothing: still queued, still on the queue.
	if out := api.waitStatus(t, id, time.Second, "queued"); out["error"] != nil {
		t.Fatalf("after a foreign DELETE: %v", out)
	}
	if info, err := insp.GetQueueInfo(normal); err != nil || info.Size != 1 {
		t.Fatalf("queue after a foreign DELETE: %+v %v", info, err)
	}
	if err := insp.UnpauseQueue(normal); err != nil {
		t.Fatal(err)
	}
	out := api.waitStatus(t, id, 15*time.Second, "completed", "failed", "cancelled")
	if out["status"] != "completed" {
		t.Fatalf("demo's request ended %v after another tenant tried to cancel it", out)
	}

	// Finished: still invisible.
	code, body = plainCall(t, "GET", u+id, otherTenantToken)
	sameAsUnknown(t, "GET of a finished request by another tenant", code, body, unknownGet, id, unknown)

	// Demo's second ask is an exact hit; other's identical ask is not.
	waitFor(t, 10*time.Second, "demo's answer to be cached", func() bool {
		var n int
		err := api.base.PG.QueryRow(t.Context(), "SELECT count(*) FROM semantic_cache WHERE tenant = 'demo'").Scan(&n)
		return err == nil && n == 1
	})
	if got := s.mock.Stats().Total().OK; got != 1 {
		t.Fatalf("provider calls after demo's first ask: %d", got)
	}
	_, hit := api.submitWith(t, devToken, ask(prompt))
	if res, _ := hit["result"].(map[string]any); hit["status"] != "completed" || res["cached"] != "exact" {
		t.Fatalf("demo's second ask: %v", hit)
	}
	oid, oout := api.submitWith(t, otherTenantToken, ask(prompt))
	if oout["status"] == "completed" {
		t.Fatalf("other got demo's cached answer at once: %v", oout)
	}
	out = api.waitStatusWith(t, otherTenantToken, oid, 15*time.Second, "completed", "failed")
	if res, _ := out["result"].(map[string]any); out["status"] != "completed" || res["cached"] != "none" {
		t.Fatalf("other's ask: %v", out)
	}
	if got := s.mock.Stats().Total().OK; got != 2 {
		t.Fatalf("provider calls after other's ask: %d, want 2 (other must not share demo's cache)", got)
	}
	// And demo cannot read other's request either.
	code, body = plainCall(t, "GET", u+oid, devToken)
	_, unknownGetDemo := plainCall(t, "GET", u+unknown, devToken)
	sameAsUnknown(t, "GET of other's request by demo", code, body, unknownGetDemo, oid, unknown)

	// Once the live record is gone, the history answers: to its owner only.
	if err := api.base.Redis.Del(t.Context(), api.base.Jobs.RecordKey(id)).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the history row to be final", func() bool {
		c, out, _ := call(t, "GET", u+id, devToken, nil)
		return c == http.StatusOK && out["status"] == "completed"
	})
	code, body = plainCall(t, "GET", u+id, otherTenantToken)
	sameAsUnknown(t, "GET of a history row by another tenant", code, body, unknownGet, id, unknown)
	code, body = plainCall(t, "DELETE", u+id, otherTenantToken)
	sameAsUnknown(t, "DELETE of a history row by another tenant", code, body, unknownDel, id, unknown)
}

// Tokens are kept only as SHA-256 hashes, and a tenant configured with
// token_sha256 alone authenticates with the token.
func TestTenantTokensStoredHashed(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	for _, tn := range s.cfg.Tenants {
		if !tn.Token.IsZero() {
			t.Fatalf("tenant %s: the clear token is kept after loading", tn.Name)
		}
	}
	if s.cfg.Tenants[0].TokenSHA256 != tokenHash(devToken) {
		t.Fatalf("demo's hash %q", s.cfg.Tenants[0].TokenSHA256)
	}
	if dump := fmt.Sprintf("%v %+v %#v", s.cfg, s.cfg, s.cfg); strings.Contains(dump, devToken) || strings.Contains(dump, otherTenantToken) {
		t.Fatal("a client token prints with the configuration")
	}

	// A configuration file that names the hash only (upper case, as
	// `sha256sum | tr a-f A-F` would give it) is accepted too.
	const hashedToken = "token-known-only-by-its-hash"
	doc := fmt.Sprintf(`
server: {admin_token: "x"}
postgres: {dsn: "postgres://x@127.0.0.1:1/x"}
providers:
  claude: {base_url: "http://127.0.0.1:1", tiers: {sonnet: claude-sonnet-4-5}}
keys:
  - {id: k, provider: claude, model_tier: sonnet, api_key: "k", rpm_limit: 1, tpm_limit: 1}
tenants:
  - {name: hashed, token_sha256: %q, max_priority: critical}
`, strings.ToUpper(tokenHash(hashedToken)))
	hc, err := config.Parse([]byte(doc), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config with token_sha256: %v", err)
	}
	s.cfg.Tenants = append(s.cfg.Tenants, hc.Tenants...)
	api := s.startAPI()
	s.startWorker()

	id, _ := api.submitWith(t, hashedToken, ask("hashed tenant asks"))
	out := api.waitStatusWith(t, hashedToken, id, 15*time.Second, "completed", "failed")
	if res, _ := out["result"].(map[string]any); out["status"] != "completed" || res["content"] != mockprovider.Reply("hashed tenant asks") {
		t.Fatalf("hashed tenant's request: %v", out)
	}
	// The hash itself is not a token.
	if code, _, _ := call(t, "POST", api.ts.URL+"/v1/requests", tokenHash(hashedToken), ask("x")); code != http.StatusUnauthorized {
		t.Fatalf("the hash used as a token: %d, want 401", code)
	}
	// Neither tenant reads the other's request.
	if code, _, _ := call(t, "GET", api.ts.URL+"/v1/requests/"+id, devToken, nil); code != http.StatusNotFound {
		t.Fatalf("demo read the hashed tenant's request: %d", code)
	}
}

// A tenant's default priority applies when a request names none; a more
// urgent one than its max_priority runs at max_priority; rate_limit_rpm
// refuses the submission over the limit with 429 and Retry-After.
func TestTenantPriorityAndRateLimit(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	const cappedToken, limitedToken = "capped-token", "limited-token"
	s.cfg.Tenants = append(s.cfg.Tenants,
		config.Tenant{Name: "capped", TokenSHA256: tokenHash(cappedToken), DefaultPriority: priority.Low, MaxPriority: priority.High},
		config.Tenant{Name: "limited", TokenSHA256: tokenHash(limitedToken), DefaultPriority: priority.Normal,
			MaxPriority: priority.High, RateLimitRPM: 2})
	api := s.startAPI() // no worker: everything stays queued where it was put
	insp := s.inspector()

	withPriority := func(p any, prompt string) map[string]any {
		b := ask(prompt)
		if p != nil {
			b["priority"] = p
		}
		return b
	}
	tests := []struct {
		name  string
		asked any
		want  priority.Priority
	}{
		{"default", nil, priority.Low},
		{"capped critical", "critical", priority.High},
		{"capped number", 1, priority.High},
		{"allowed high", "high", priority.High},
		{"less urgent than the default", "normal", priority.Normal},
	}
	wantSizes := map[priority.Priority]int{}
	for i, tt := range tests {
		id, _ := api.submitWith(t, cappedToken, withPriority(tt.asked, fmt.Sprintf("priority case %d", i)))
		_, out, _ := call(t, "GET", api.ts.URL+"/v1/requests/"+id, cappedToken, nil)
		if out["priority"] != tt.want.String() {
			t.Errorf("%s: priority %v, want %s", tt.name, out["priority"], tt.want)
		}
		wantSizes[tt.want]++
	}
	// The demo tenant (max_priority critical) keeps critical.
	id := api.submit(t, withPriority("critical", "demo is allowed critical"))
	if _, out, _ := call(t, "GET", api.ts.URL+"/v1/requests/"+id, devToken, nil); out["priority"] != "critical" {
		t.Fatalf("demo's critical request runs as %v", out["priority"])
	}
	wantSizes[priority.Critical]++
	// The request sits on the queue of its effective priority.
	for _, p := range priority.All {
		info, err := insp.GetQueueInfo(queue.Name(p))
		size := 0
		if err == nil {
			size = info.Size
		}
		if size != wantSizes[p] {
			t.Errorf("queue %s holds %d, want %d", p, size, wantSizes[p])
		}
	}

	// Rate limit: two a minute.
	for i := range 2 {
		if code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", limitedToken, ask(fmt.Sprintf("limited %d", i))); code != http.StatusAccepted {
			t.Fatalf("limited submission %d: %d %v", i, code, out)
		}
	}
	code, out, hdr := call(t, "POST", api.ts.URL+"/v1/requests", limitedToken, ask("limited 2"))
	e, _ := out["error"].(map[string]any)
	ra, err := strconv.Atoi(hdr.Get("Retry-After"))
	if code != http.StatusTooManyRequests || e["type"] != "tenant_rate_limited" || err != nil || ra < 1 || ra > 60 {
		t.Fatalf("third submission in a minute: %d %v, Retry-After %q", code, out, hdr.Get("Retry-After"))
	}
	if msg, _ := e["message"].(string); !strings.Contains(msg, "rate limit") {
		t.Fatalf("message %q does not say what is wrong", msg)
	}
	// The compat endpoint is limited the same way, in its own format.
	code, out, hdr = call(t, "POST", api.ts.URL+"/v1/chat/completions", limitedToken,
		map[string]any{"model": "gpt-4o", "messages": []map[string]any{{"role": "user", "content": "limited 3"}}})
	if e, _ := out["error"].(map[string]any); code != http.StatusTooManyRequests || e["code"] != "tenant_rate_limited" || hdr.Get("Retry-After") == "" {
		t.Fatalf("compat over the tenant limit: %d %v, Retry-After %q", code, out, hdr.Get("Retry-After"))
	}
	// Another tenant is not limited by it.
	if code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("demo is not limited")); code != http.StatusAccepted {
		t.Fatalf("demo after limited hit its limit: %d %v", code, out)
	}
	// History rows are written in batches, off the request path.
	var n int
	waitFor(t, 10*time.Second, "the limited tenant's 2 history rows", func() bool {
		err := api.base.PG.QueryRow(t.Context(), "SELECT count(*) FROM requests WHERE tenant = 'limited'").Scan(&n)
		return err == nil && n >= 2
	})
	if n != 2 {
		t.Fatalf("limited tenant's stored requests: %d, want 2", n)
	}
}

// compatCall posts body to a compat endpoint. chunked sends it without a
// Content-Length, so only reading it finds it too large.
func compatCall(t testing.TB, url string, body string, chunked bool, hdr ...string) (int, map[string]any, string) {
	t.Helper()
	var rd io.Reader = strings.NewReader(body)
	if chunked {
		rd = io.MultiReader(rd) // hides the length from net/http
	}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", url, rd)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out, resp.Header.Get("Content-Type")
}

// Bad input on both compat endpoints gets a 4xx in that API's own error
// format, with a message that says what is wrong, and changes nothing.
func TestCompatBadInput(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	s.cfg.Server.MaxBodyBytes = 16 << 10
	s.cfg.Server.MaxPromptChars = 2000
	api := s.startAPI()
	s.startWorker()

	type dialectCase struct {
		name, path, model, authHeader, authPrefix string
		// body builds a request of this dialect around raw messages JSON.
		body func(model, messages string) string
		// check verifies the error shape and returns the message.
		check func(t *testing.T, out map[string]any) string
	}
	dialects := []dialectCase{
		{
			name: "openai", path: "/v1/chat/completions", model: "gpt-4o", authHeader: "Authorization", authPrefix: "Bearer ",
			body: func(model, msgs string) string { return fmt.Sprintf(`{"model":%q,"messages":%s}`, model, msgs) },
			check: func(t *testing.T, out map[string]any) string {
				e, ok := out["error"].(map[string]any)
				if !ok {
					t.Fatalf("not an OpenAI error: %v", out)
				}
				msg, _ := e["message"].(string)
				typ, _ := e["type"].(string)
				code, _ := e["code"].(string)
				if msg == "" || typ == "" || code == "" {
					t.Fatalf("OpenAI error without message, type or code: %v", out)
				}
				return msg
			},
		},
		{
			name: "anthropic", path: "/v1/messages", model: "claude-sonnet", authHeader: "x-api-key",
			body: func(model, msgs string) string {
				return fmt.Sprintf(`{"model":%q,"max_tokens":100,"messages":%s}`, model, msgs)
			},
			check: func(t *testing.T, out map[string]any) string {
				e, ok := out["error"].(map[string]any)
				if out["type"] != "error" || !ok {
					t.Fatalf("not an Anthropic error: %v", out)
				}
				msg, _ := e["message"].(string)
				typ, _ := e["type"].(string)
				if msg == "" || typ == "" {
					t.Fatalf("Anthropic error without type or message: %v", out)
				}
				return msg
			},
		},
	}
	user := func(text string) string { return fmt.Sprintf(`[{"role":"user","content":%q}]`, text) }
	for _, d := range dialects {
		auth := []string{d.authHeader, d.authPrefix + devToken}
		tests := []struct {
			name    string
			body    string
			chunked bool
			hdr     []string
			status  int
			says    string // the message names what is wrong
		}{
			{"malformed json", `{"model": "` + d.model + `", "messages": [`, false, auth, 400, ""},
			{"empty body", ``, false, auth, 400, ""},
			{"messages not a list", d.body(d.model, `"hello"`), false, auth, 400, "messages"},
			{"model not a string", strings.Replace(d.body(d.model, user("x")), `"`+d.model+`"`, `42`, 1), false, auth, 400, "model"},
			{"content not text", d.body(d.model, `[{"role":"user","content":7}]`), false, auth, 400, "content"},
			{"unknown model", d.body("gpt-9-ultra", user("x")), false, auth, 404, "gpt-9-ultra"},
			{"no model", d.body("", user("x")), false, auth, 400, "model"},
			{"empty messages", d.body(d.model, `[]`), false, auth, 400, "messages"},
			{"bad role", d.body(d.model, `[{"role":"robot","content":"x"}]`), false, auth, 400, "role"},
			{"prompt too long", d.body(d.model, user(strings.Repeat("p", 3000))), false, auth, 413, "2000"},
			{"body too large", d.body(d.model, user(strings.Repeat("b", 20<<10))), false, auth, 413, "limit"},
			{"body too large, chunked", d.body(d.model, user(strings.Repeat("b", 20<<10))), true, auth, 413, "limit"},
			{"invalid priority header", d.body(d.model, user("x")), false, append([]string{"X-Bulwark-Priority", "urgent"}, auth...), 400, "X-Bulwark-Priority"},
			{"invalid cache header", d.body(d.model, user("x")), false, append([]string{"X-Bulwark-Cache", "sometimes"}, auth...), 400, "X-Bulwark-Cache"},
			{"no token", d.body(d.model, user("x")), false, nil, 401, "token"},
			{"invalid token", d.body(d.model, user("x")), false, []string{d.authHeader, d.authPrefix + "not-a-tenant"}, 401, "invalid"},
			{"admin token", d.body(d.model, user("x")), false, []string{d.authHeader, d.authPrefix + adminToken}, 401, "invalid"},
		}
		for _, tt := range tests {
			t.Run(d.name+"/"+tt.name, func(t *testing.T) {
				code, out, ctype := compatCall(t, api.ts.URL+d.path, tt.body, tt.chunked, tt.hdr...)
				if code != tt.status {
					t.Fatalf("status %d, want %d: %v", code, tt.status, out)
				}
				if !strings.HasPrefix(ctype, "application/json") {
					t.Fatalf("Content-Type %q", ctype)
				}
				msg := d.check(t, out)
				if !strings.Contains(strings.ToLower(msg), strings.ToLower(tt.says)) {
					t.Fatalf("message %q does not mention %q", msg, tt.says)
				}
				if strings.Contains(msg, devToken) || strings.Contains(msg, "not-a-tenant") || strings.Contains(msg, adminToken) {
					t.Fatalf("message %q echoes the token", msg)
				}
			})
		}
	}

	// Nothing was enqueued, stored, or sent to a provider.
	insp := s.inspector()
	for _, p := range priority.All {
		if info, err := insp.GetQueueInfo(queue.Name(p)); err == nil && info.Size+info.Completed+info.Processed > 0 {
			t.Fatalf("queue %s saw tasks after bad input: %+v", p, info)
		}
	}
	var n int
	if err := api.base.PG.QueryRow(t.Context(), "SELECT count(*) FROM requests").Scan(&n); err != nil || n != 0 {
		t.Fatalf("history rows after bad input: %d %v", n, err)
	}
	if keys, err := api.base.Redis.Keys(t.Context(), api.base.Jobs.RecordKey("*")).Result(); err != nil || len(keys) != 0 {
		t.Fatalf("live records after bad input: %v %v", keys, err)
	}
	if got := s.mock.Stats().Total().Requests; got != 0 {
		t.Fatalf("%d provider calls after bad input", got)
	}
}
