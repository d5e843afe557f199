package azure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/mockprovider"
)

// okBody is a minimal chat completion answer.
const okBody = `{"id":"chatcmpl-1","object":"chat.completion","created":1767225600,"model":"gpt-4o-2024-08-06",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`

// seen is what a recording server received.
type seen struct {
	path    string // escaped
	query   map[string][]string
	header  http.Header
	model   string
	request int
}

// recorder starts a server that answers every request with status, header
// and body and sends what it received on the returned channel.
func recorder(t *testing.T, status int, header map[string]string, body string) (*httptest.Server, <-chan seen) {
	t.Helper()
	ch := make(chan seen, 8)
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var b struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(raw, &b)
		ch <- seen{path: r.URL.EscapedPath(), query: r.URL.Query(), header: r.Header.Clone(), model: b.Model, request: int(n.Add(1))}
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, ch
}

func request(model string) *llm.Request {
	return &llm.Request{Model: model, MaxTokens: 16,
		Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "hi"}}}}}
}

func providerError(t *testing.T, err error) *llm.Error {
	t.Helper()
	var pe *llm.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not an *llm.Error", err)
	}
	return pe
}

func TestAddressing(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		base       string // appended to the server's URL; "-" leaves Config.BaseURL empty
		apiVersion string
		cred       llm.Credential
		model      string
		wantPath   string
		wantAPI    string
	}{
		{name: "the tier's deployment", model: "gpt4o", wantPath: "/openai/deployments/gpt4o/chat/completions", wantAPI: APIVersionDefault},
		{name: "api-version of the config", apiVersion: "2025-04-01-preview", model: "gpt4o",
			wantPath: "/openai/deployments/gpt4o/chat/completions", wantAPI: "2025-04-01-preview"},
		{name: "the key's deployment", model: "gpt4o", cred: llm.Credential{Deployment: "gpt4o-ptu"},
			wantPath: "/openai/deployments/gpt4o-ptu/chat/completions", wantAPI: APIVersionDefault},
		{name: "a deployment name that needs escaping", model: "team a/b",
			wantPath: "/openai/deployments/team%20a%2Fb/chat/completions", wantAPI: APIVersionDefault},
		{name: "base URL ending in /openai", base: "/openai/", model: "d", wantPath: "/openai/deployments/d/chat/completions", wantAPI: APIVersionDefault},
		{name: "base URL ending in /openai/v1", base: "/openai/v1", model: "d", wantPath: "/openai/deployments/d/chat/completions", wantAPI: APIVersionDefault},
		{name: "a gateway's prefix", base: "/gw/aoai", model: "d", wantPath: "/gw/aoai/openai/deployments/d/chat/completions", wantAPI: APIVersionDefault},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, ch := recorder(t, http.StatusOK, nil, okBody)
			c := New(Config{BaseURL: srv.URL + tt.base, APIVersion: tt.apiVersion}, srv.Client())
			tt.cred.APIKey = secret.New("key-1")
			res, err := c.Complete(t.Context(), tt.cred, request(tt.model))
			if err != nil {
				t.Fatal(err)
			}
			got := <-ch
			if got.path != tt.wantPath || got.query["api-version"][0] != tt.wantAPI || len(got.query) != 1 {
				t.Errorf("request to %s?%v, want %s?api-version=%s", got.path, got.query, tt.wantPath, tt.wantAPI)
			}
			if got.model != tt.model {
				t.Errorf("body model %q, want the request's %q (Azure ignores it)", got.model, tt.model)
			}
			if got.header.Get("api-key") != "key-1" || got.header.Get("Authorization") != "" {
				t.Errorf("headers %v, want api-key only", got.header)
			}
			if res.Response.Text() != "hi" || res.Response.Model != "gpt-4o-2024-08-06" {
				t.Errorf("answer %+v", res.Response)
			}
		})
	}
}

func TestKeyEndpointReplacesBaseURL(t *testing.T) {
	t.Parallel()
	other, otherCh := recorder(t, http.StatusOK, nil, okBody)
	base, baseCh := recorder(t, http.StatusOK, nil, okBody)
	c := New(Config{BaseURL: base.URL}, nil)
	cred := llm.Credential{KeyID: "k-west", APIKey: secret.New("key-w"), Endpoint: other.URL + "/", Deployment: "dep-w"}
	if _, err := c.Complete(t.Context(), cred, request("gpt4o")); err != nil {
		t.Fatal(err)
	}
	if got := <-otherCh; got.path != "/openai/deployments/dep-w/chat/completions" {
		t.Errorf("the key's resource got %s", got.path)
	}
	// Without an endpoint of its own, the key calls the provider's.
	if _, err := c.Complete(t.Context(), llm.Credential{APIKey: secret.New("key-e")}, request("gpt4o")); err != nil {
		t.Fatal(err)
	}
	if got := <-baseCh; got.path != "/openai/deployments/gpt4o/chat/completions" || got.request != 1 {
		t.Errorf("the provider's resource got request %d to %s", got.request, got.path)
	}
}

// A call that cannot be addressed is a configuration error: it carries no
// class, and nothing is sent.
func TestUnaddressable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  Config
		cred llm.Credential
		req  *llm.Request
		want string
	}{
		{"no endpoint anywhere", Config{}, llm.Credential{KeyID: "k1"}, request("d"), `key "k1" has no endpoint`},
		{"no deployment anywhere", Config{BaseURL: "https://r.openai.azure.com"}, llm.Credential{KeyID: "k1"}, request(""), `key "k1" has no deployment`},
		{"a key endpoint that is no URL", Config{}, llm.Credential{KeyID: "k1", Endpoint: "ftp://r"}, request("d"), "endpoint of key k1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.cred.APIKey = secret.New("key")
			_, err := New(tt.cfg, nil).Complete(t.Context(), tt.cred, tt.req)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if _, ok := llm.ClassOf(err); ok {
				t.Errorf("a configuration error must not be classified: %v", err)
			}
		})
	}
}

// tokenSource is a TokenSource of tests.
type tokenSource struct {
	token       string
	err         error
	block       bool // wait for the caller's context to end
	invalidated atomic.Int32
}

func (s *tokenSource) Token(ctx context.Context) (string, error) {
	if s.block {
		<-ctx.Done()
		return "", errors.New("token service gave up")
	}
	return s.token, s.err
}

func (s *tokenSource) Invalidate() { s.invalidated.Add(1) }

func TestEntraBearer(t *testing.T) {
	t.Parallel()
	srv, ch := recorder(t, http.StatusOK, nil, okBody)
	c := New(Config{BaseURL: srv.URL, Auth: AuthEntra, Token: &tokenSource{token: "eyJ0eXAi.entra.token"}}, srv.Client())
	// An Entra key needs no api key; one it has is not sent.
	if _, err := c.Complete(t.Context(), llm.Credential{KeyID: "k", APIKey: secret.New("stray-key")}, request("gpt4o")); err != nil {
		t.Fatal(err)
	}
	got := <-ch
	if got.header.Get("Authorization") != "Bearer eyJ0eXAi.entra.token" || got.header.Get("api-key") != "" {
		t.Errorf("headers %v, want the bearer token only", got.header)
	}
}

func TestEntraTokenFailures(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		src   *tokenSource
		class llm.Class
	}{
		{"the identity platform is unreachable", &tokenSource{err: errors.New("dial tcp: i/o timeout")}, llm.ClassTransient},
		{"the credential is refused", &tokenSource{err: fmt.Errorf("%w: AADSTS7000215: invalid client secret", ErrCredentialRejected)}, llm.ClassAuth},
		{"an empty token", &tokenSource{}, llm.ClassAuth},
		{"a token no header can carry", &tokenSource{token: "abc\ndef"}, llm.ClassAuth},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				t.Error("a call was sent without a usable token")
			}))
			t.Cleanup(srv.Close)
			c := New(Config{BaseURL: srv.URL, Auth: AuthEntra, Token: tt.src}, srv.Client())
			_, err := c.Complete(t.Context(), llm.Credential{}, request("d"))
			if pe := providerError(t, err); pe.Class != tt.class || pe.Provider != ProviderDefault {
				t.Errorf("got %+v, want class %s", pe, tt.class)
			}
		})
	}

	t.Run("the caller gives up while the token is fetched", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		c := New(Config{BaseURL: "https://r.openai.azure.com", Auth: AuthEntra, Token: &tokenSource{block: true}}, nil)
		_, err := c.Complete(ctx, llm.Credential{}, request("d"))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want context.Canceled", err)
		}
		if _, ok := llm.ClassOf(err); ok {
			t.Errorf("a cancellation must not be classified: %v", err)
		}
	})
}

// A 401 to an Entra token drops the cached token; it is transient when the
// token expired (the next call carries a fresh one), auth otherwise. The
// token never reaches an error.
func TestEntra401(t *testing.T) {
	t.Parallel()
	const token = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2Vu.sig"
	for _, tt := range []struct {
		file  string
		class llm.Class
	}{
		{"token_expired.json", llm.ClassTransient},
		{"invalid_key.json", llm.ClassAuth},
	} {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			body := strings.Replace(string(fixture(t, tt.file)), `"}}`, ` Token: `+token+`"}}`, 1)
			srv, _ := recorder(t, http.StatusUnauthorized, nil, body)
			src := &tokenSource{token: token}
			_, err := New(Config{BaseURL: srv.URL, Auth: AuthEntra, Token: src}, srv.Client()).Complete(t.Context(), llm.Credential{}, request("d"))
			pe := providerError(t, err)
			if pe.Class != tt.class || src.invalidated.Load() != 1 {
				t.Errorf("class %s, %d invalidations; want %s and 1", pe.Class, src.invalidated.Load(), tt.class)
			}
			if s := fmt.Sprintf("%v %+v %#v", err, err, pe); strings.Contains(s, token) || strings.Contains(s, "c2VjcmV0LXRva2Vu") {
				t.Errorf("the token leaks: %s", s)
			}
		})
	}
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "errors", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A PTU key's 429 is "provisioned capacity full"; the same 429 on a
// standard key is a rate limit, and a PTU key's other failures keep their
// class and code.
func TestPTU(t *testing.T) {
	t.Parallel()
	quota := `{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
	for _, tt := range []struct {
		name   string
		keyID  string
		status int
		body   string
		class  llm.Class
		code   string
		full   bool
	}{
		{"PTU key, 429", "ptu-1", 429, string(fixture(t, "rate_limit_calls.json")), llm.ClassRateLimited, CodeCapacityFull, true},
		{"standard key, 429", "std-1", 429, string(fixture(t, "rate_limit_calls.json")), llm.ClassRateLimited, "", false},
		{"key without an id, 429", "", 429, string(fixture(t, "rate_limit_calls.json")), llm.ClassRateLimited, "", false},
		{"PTU key, billing 429", "ptu-1", 429, quota, llm.ClassQuota, "insufficient_quota", false},
		{"PTU key, 500", "ptu-1", 500, string(fixture(t, "server_error.json")), llm.ClassTransient, "server_error", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, _ := recorder(t, tt.status, map[string]string{"retry-after-ms": "250", "retry-after": "1"}, tt.body)
			c := New(Config{BaseURL: srv.URL, PTUKeys: map[string]bool{"ptu-1": true}}, srv.Client())
			_, err := c.Complete(t.Context(), llm.Credential{KeyID: tt.keyID, APIKey: secret.New("k")}, request("d"))
			pe := providerError(t, err)
			if pe.Class != tt.class || pe.Code != tt.code || IsCapacityFull(err) != tt.full || pe.RetryAfter != 250*time.Millisecond {
				t.Errorf("got class %s code %q retry %s (capacity full %t); want %s %q 250ms (%t)",
					pe.Class, pe.Code, pe.RetryAfter, IsCapacityFull(err), tt.class, tt.code, tt.full)
			}
		})
	}
}

// The wait of a 429 without retry headers: the message's, else
// x-rate-limit-reset-tokens; retry-after-ms before anything else.
func TestRetryAfterFallbacks(t *testing.T) {
	t.Parallel()
	msg := func(s string) string { return `{"error":{"code":"429","message":"` + s + `"}}` }
	for _, tt := range []struct {
		name   string
		header map[string]string
		body   string
		want   time.Duration
	}{
		{"one second", nil, msg("... Please retry after 1 second. ..."), time.Second},
		{"milliseconds", nil, msg("Please retry after 250 milliseconds."), 250 * time.Millisecond},
		{"retry-after-ms first", map[string]string{"retry-after-ms": "40"}, msg("Please retry after 9 seconds."), 40 * time.Millisecond},
		{"retry-after before the message", map[string]string{"retry-after": "3"}, msg("Please retry after 9 seconds."), 3 * time.Second},
		{"x-rate-limit-reset-tokens", map[string]string{"x-rate-limit-reset-tokens": "55"}, msg("exceeded token rate limit."), 55 * time.Second},
		{"the message before x-rate-limit-reset-tokens", map[string]string{"x-rate-limit-reset-tokens": "55"}, msg("Please retry after 2 seconds."), 2 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, _ := recorder(t, http.StatusTooManyRequests, tt.header, tt.body)
			_, err := New(Config{BaseURL: srv.URL}, srv.Client()).Complete(t.Context(), llm.Credential{APIKey: secret.New("k")}, request("d"))
			if pe := providerError(t, err); pe.Class != llm.ClassRateLimited || pe.RetryAfter != tt.want {
				t.Errorf("got %s after %s, want rate_limited after %s", pe.Class, pe.RetryAfter, tt.want)
			}
		})
	}
}

// x-rate-limit-reset-tokens stands in for x-ratelimit-reset-tokens.
func TestParseRateLimit(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	h := http.Header{}
	h.Set("x-ratelimit-remaining-requests", "79")
	h.Set("x-ratelimit-remaining-tokens", "61353")
	h.Set("x-rate-limit-reset-tokens", "55")
	got := ParseRateLimit(h, now)
	want := llm.RateLimit{RequestsRemaining: 79, TokensRemaining: 61353, TokensReset: now.Add(55 * time.Second), Known: true}
	if got != want {
		t.Errorf("ParseRateLimit = %+v, want %+v", got, want)
	}
	h.Set("x-ratelimit-reset-tokens", "6s")
	if got := ParseRateLimit(h, now); !got.TokensReset.Equal(now.Add(6 * time.Second)) {
		t.Errorf("x-ratelimit-reset-tokens not preferred: %+v", got)
	}
	h = http.Header{}
	h.Set(UtilizationHeader, "42.5%")
	if got := ParseRateLimit(h, now); got.Known {
		t.Errorf("a PTU's utilization alone is not a rate limit: %+v", got)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	src := &tokenSource{token: "t"}
	for _, tt := range []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{"zero", Config{}, ""},
		{"entra", Config{Auth: AuthEntra, Token: src}, ""},
		{"preview api-version", Config{APIVersion: "2025-04-01-preview"}, ""},
		{"named", Config{Name: "azure-eu"}, ""},
		{"entra without a token source", Config{Auth: AuthEntra}, "azure.Token"},
		{"unknown auth", Config{Auth: "basic"}, "azure.Auth"},
		{"api-version not a date", Config{APIVersion: "latest"}, "azure.APIVersion"},
		{"bad name", Config{Name: "Azure EU"}, "azure.Name"},
		{"base URL with a query", Config{BaseURL: "https://r.openai.azure.com/?api-version=1"}, "azure.BaseURL"},
	} {
		err := tt.cfg.Validate()
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: Validate = %v, want %q", tt.name, err, tt.want)
		}
	}
	if got := New(Config{Name: "azure-eu"}, nil).Provider(); got != "azure-eu" {
		t.Errorf("Provider() = %s, want the configured name", got)
	}
}

func TestChatURL(t *testing.T) {
	t.Parallel()
	for endpoint, want := range map[string]string{
		"https://r.openai.azure.com":            "https://r.openai.azure.com/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
		"https://r.openai.azure.com/":           "https://r.openai.azure.com/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
		"https://r.openai.azure.com/openai/v1/": "https://r.openai.azure.com/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
		"https://apim.example/aoai":             "https://apim.example/aoai/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
	} {
		if got := ChatURL(endpoint, "gpt-4o", APIVersionDefault); got != want {
			t.Errorf("ChatURL(%s) = %s, want %s", endpoint, got, want)
		}
	}
}

// mockNow is the mock's fixed clock: its buckets refill only when a test
// moves it, which these tests never do.
var mockNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func startMock(t *testing.T, cfg mockprovider.Config) *httptest.Server {
	t.Helper()
	cfg.Now = func() time.Time { return mockNow }
	m, err := mockprovider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(m)
	t.Cleanup(ts.Close)
	t.Cleanup(m.Close)
	return ts
}

// Against the mock: a PTU deployment's 429 is recognised by its headers
// alone, while the same key's standard deployment has buckets of its own
// and answers with Azure's rate-limit headers and 429.
func TestMockPTUAndStandardDeployments(t *testing.T) {
	t.Parallel()
	ts := startMock(t, mockprovider.Config{DefaultLimits: mockprovider.Limits{RPM: 60}, AzurePTUDeployments: []string{"gpt4o-ptu"}})
	c := New(Config{BaseURL: ts.URL}, ts.Client())
	key := secret.New("key-shared-by-both")
	ptu := llm.Credential{KeyID: "ptu", APIKey: key, Deployment: "gpt4o-ptu"}
	std := llm.Credential{KeyID: "std", APIKey: key}

	res, err := c.Complete(t.Context(), ptu, request("gpt4o"))
	if err != nil {
		t.Fatal(err)
	}
	if res.RateLimit.Known {
		t.Errorf("a PTU answer has no x-ratelimit headers, got %+v", res.RateLimit)
	}
	_, err = c.Complete(t.Context(), ptu, request("gpt4o"))
	if pe := providerError(t, err); !IsCapacityFull(err) || pe.RetryAfter != time.Second || pe.Status != 429 {
		t.Fatalf("second PTU call: %+v, want provisioned capacity full after 1s", pe)
	}

	res, err = c.Complete(t.Context(), std, request("gpt4o"))
	if err != nil {
		t.Fatalf("the standard deployment shares no bucket with the PTU one: %v", err)
	}
	if rl := res.RateLimit; rl.RequestsLimit != 60 || rl.RequestsRemaining != 59 || rl.RequestsReset.IsZero() {
		t.Errorf("standard deployment rate limit %+v, want 59 of 60 requests left", rl)
	}
	_, err = c.Complete(t.Context(), std, request("gpt4o"))
	if pe := providerError(t, err); IsCapacityFull(err) || pe.Class != llm.ClassRateLimited || pe.RetryAfter != time.Second ||
		!strings.Contains(pe.Message, "exceeded call rate limit") {
		t.Errorf("second standard call: %+v, want Azure's call rate limit 429 after 1s", pe)
	}
}

// Against the mock: Entra's bearer token is the key the mock meters.
func TestMockEntra(t *testing.T) {
	t.Parallel()
	ts := startMock(t, mockprovider.Config{})
	c := New(Config{BaseURL: ts.URL, Auth: AuthEntra, Token: &tokenSource{token: "entra-token-1"}}, ts.Client())
	res, err := c.Complete(t.Context(), llm.Credential{KeyID: "e1"}, request("gpt4o"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Response.Model != "gpt4o" || res.Response.Text() != mockprovider.Reply("hi") {
		t.Errorf("answer %+v", res.Response)
	}
}
