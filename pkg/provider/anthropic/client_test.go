package anthropic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/internal/wiretest"
	"bulwark/pkg/secret"
)

// answer is what the fake provider replies.
type answer struct {
	status int
	header map[string]string
	body   []byte
}

// setup starts a provider that checks each request the way the Messages API
// would and replies with a; it returns a Client pointed at it through a path
// prefix, as behind a gateway.
func setup(t *testing.T, key string, a answer) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.Method != http.MethodPost || r.URL.Path != "/gw/anthropic/v1/messages":
			http.Error(w, "wrong endpoint "+r.Method+" "+r.URL.Path, http.StatusTeapot)
			return
		case r.Header.Get("x-api-key") != key:
			http.Error(w, "wrong key header", http.StatusTeapot)
			return
		case r.Header.Get("anthropic-version") != VersionDefault || r.Header.Get("Content-Type") != "application/json":
			http.Error(w, "wrong version or content type", http.StatusTeapot)
			return
		}
		if _, _, err := DecodeRequest(body); err != nil {
			http.Error(w, "bad body: "+err.Error(), http.StatusTeapot)
			return
		}
		for k, v := range a.header {
			w.Header().Set(k, strings.ReplaceAll(v, "KEY_PLACEHOLDER", key))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(strings.ReplaceAll(string(a.body), "KEY_PLACEHOLDER", key)))
	}))
	t.Cleanup(srv.Close)
	return New(Config{BaseURL: srv.URL + "/gw/anthropic/"}, srv.Client())
}

func request() *llm.Request {
	return wiretest.Requests()[0].Value
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCompleteSuccess(t *testing.T) {
	t.Parallel()
	want := wiretest.Responses()[1].Value
	body, err := EncodeResponse(want, "")
	if err != nil {
		t.Fatal(err)
	}
	c := setup(t, "key-1", answer{status: 200, body: body, header: map[string]string{
		"anthropic-ratelimit-requests-limit":         "50",
		"anthropic-ratelimit-requests-remaining":     "49",
		"anthropic-ratelimit-requests-reset":         "2026-05-01T12:00:01Z",
		"anthropic-ratelimit-tokens-limit":           "90000",
		"anthropic-ratelimit-tokens-remaining":       "80000",
		"anthropic-ratelimit-tokens-reset":           "2026-05-01T12:00:02Z",
		"anthropic-ratelimit-input-tokens-limit":     "40000",
		"anthropic-ratelimit-input-tokens-remaining": "5000",
		"anthropic-ratelimit-input-tokens-reset":     "2026-05-01T12:00:03.5Z",
		"anthropic-ratelimit-output-tokens-limit":    "8000",
	}})
	res, err := c.Complete(t.Context(), secret.New("key-1"), request())
	if err != nil {
		t.Fatal(err)
	}
	if d := wiretest.Diff(want, res.Response); d != "" {
		t.Errorf("response (-want +got):\n%s", d)
	}
	wantRL := llm.RateLimit{
		RequestsLimit: 50, RequestsRemaining: 49, RequestsReset: time.Date(2026, 5, 1, 12, 0, 1, 0, time.UTC),
		// input-tokens is tighter than tokens here, so it wins.
		TokensLimit: 40000, TokensRemaining: 5000, TokensReset: time.Date(2026, 5, 1, 12, 0, 3, 5e8, time.UTC),
		Known: true,
	}
	if d := wiretest.Diff(wantRL, res.RateLimit); d != "" {
		t.Errorf("rate limit (-want +got):\n%s", d)
	}
	if res.Latency <= 0 {
		t.Errorf("latency %s", res.Latency)
	}
	if c.Provider() != llm.ProviderClaude {
		t.Errorf("provider %s", c.Provider())
	}
}

func TestCompleteErrors(t *testing.T) {
	t.Parallel()
	limits := map[string]string{
		"anthropic-ratelimit-requests-limit":     "50",
		"anthropic-ratelimit-requests-remaining": "0",
		"anthropic-ratelimit-requests-reset":     "2026-05-01T12:00:30Z",
		"anthropic-ratelimit-tokens-limit":       "-1",
		"anthropic-ratelimit-tokens-remaining":   "lots",
	}
	tests := []struct {
		name       string
		status     int
		file       string
		header     map[string]string
		wantClass  llm.Class
		wantCode   string
		wantMsg    string
		wantRetry  time.Duration
		wantLimits bool
	}{
		{"429 rate_limit_error", 429, "rate_limit.json", merge(limits, map[string]string{"retry-after": "17"}),
			llm.ClassRateLimited, "rate_limit_error", "would exceed the rate limit", 17 * time.Second, true},
		{"429 tier spend cap", 429, "spend_cap_tier.json", limits,
			llm.ClassQuota, "enforced_spend_limit_reached", "monthly API usage threshold", 0, true},
		{"400 spend limit set", 400, "spend_limit_set.json", nil,
			llm.ClassQuota, "invalid_request_error", "specified API usage limits", 0, false},
		{"400 credit balance", 400, "credit_balance.json", nil,
			llm.ClassQuota, "invalid_request_error", "credit balance is too low", 0, false},
		{"402 billing_error", 402, "billing.json", nil,
			llm.ClassQuota, "billing_error", "billing", 0, false},
		{"529 overloaded_error", 529, "overloaded.json", map[string]string{"retry-after": "3"},
			llm.ClassOverloaded, "overloaded_error", "Overloaded", 3 * time.Second, false},
		{"overloaded_error under 500 still overloaded", 500, "overloaded.json", nil,
			llm.ClassOverloaded, "overloaded_error", "Overloaded", 0, false},
		{"401 authentication_error", 401, "authentication.json", nil,
			llm.ClassAuth, "authentication_error", "invalid x-api-key", 0, false},
		{"403 permission_error", 403, "permission.json", nil,
			llm.ClassAuth, "permission_error", "permission", 0, false},
		{"500 api_error", 500, "api_error.json", nil,
			llm.ClassTransient, "api_error", "Internal server error", 0, false},
		{"504 timeout_error", 504, "timeout.json", nil,
			llm.ClassTransient, "timeout_error", "Request timeout", 0, false},
		{"400 invalid_request_error", 400, "invalid_request.json", nil,
			llm.ClassPermanent, "invalid_request_error", "max_tokens: 100000 > 64000", 0, false},
		{"404 not_found_error", 404, "not_found.json", nil,
			llm.ClassModelUnavailable, "not_found_error", "claude-nope-1", 0, false},
		{"413 request_too_large", 413, "request_too_large.json", nil,
			llm.ClassPermanent, "request_too_large", "maximum allowed number of bytes", 0, false},
		{"502 HTML from a proxy", 502, "bad_gateway.html", map[string]string{"retry-after": "garbage"},
			llm.ClassTransient, "", "502 Bad Gateway", 0, false},
		{"429 without a body", 429, "", map[string]string{"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"},
			llm.ClassRateLimited, "", "", 0, false},
		{"503 without a body", 503, "", nil, llm.ClassTransient, "", "", 0, false},
		{"retry-after clamped to 10 min", 429, "rate_limit.json", map[string]string{"retry-after": "86400"},
			llm.ClassRateLimited, "rate_limit_error", "", provider.MaxRetryAfter, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var body []byte
			if tt.file != "" {
				body = readFile(t, filepath.Join("errors", tt.file))
			}
			c := setup(t, "key-2", answer{status: tt.status, header: tt.header, body: body})
			_, err := c.Complete(t.Context(), secret.New("key-2"), request())
			var pe *llm.Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not an *llm.Error", err)
			}
			if pe.Class != tt.wantClass || pe.Code != tt.wantCode || pe.Status != tt.status || pe.Provider != llm.ProviderClaude {
				t.Errorf("got class %s code %q status %d provider %s; want %s %q %d", pe.Class, pe.Code, pe.Status, pe.Provider, tt.wantClass, tt.wantCode, tt.status)
			}
			if !strings.Contains(pe.Message, tt.wantMsg) {
				t.Errorf("message %q does not contain %q", pe.Message, tt.wantMsg)
			}
			if pe.RetryAfter != tt.wantRetry {
				t.Errorf("RetryAfter %s, want %s", pe.RetryAfter, tt.wantRetry)
			}
			if tt.wantLimits {
				// -1 and "lots" leave the token fields zero; the request
				// fields parse.
				want := llm.RateLimit{RequestsLimit: 50, RequestsReset: time.Date(2026, 5, 1, 12, 0, 30, 0, time.UTC), Known: true}
				if d := wiretest.Diff(want, pe.RateLimit); d != "" {
					t.Errorf("rate limit (-want +got):\n%s", d)
				}
			} else if pe.RateLimit.Known {
				t.Errorf("rate limit known without headers: %+v", pe.RateLimit)
			}
		})
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func TestCompleteNeverLeaksTheKey(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"gw-7f3a9c2e1b5d4e6f", "sk-ant-api03-Zx9_Qw8-Er7Ty6Ui5Op4As3Df2Gh1Jk0"} {
		c := setup(t, key, answer{status: 401, body: readFile(t, "errors/echoes_key.json"),
			header: map[string]string{"x-echo": "KEY_PLACEHOLDER"}})
		_, err := c.Complete(t.Context(), secret.New(key), request())
		var pe *llm.Error
		if !errors.As(err, &pe) || pe.Class != llm.ClassAuth {
			t.Fatalf("error %v, want an auth *llm.Error", err)
		}
		for _, s := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", pe), pe.Message, pe.Code} {
			for _, secretText := range []string{key, "sk-ant-api03-AAAA", "hunter2"} {
				if strings.Contains(s, secretText) {
					t.Errorf("error text leaks %q: %s", secretText, s)
				}
			}
		}
		if !strings.Contains(pe.Message, "invalid x-api-key") {
			t.Errorf("message lost its meaning: %q", pe.Message)
		}
	}
}

func TestCompleteTransport(t *testing.T) {
	t.Parallel()

	t.Run("own timeout is transient", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Read the body first: only then does the server notice the
			// client hanging up and cancel r.Context().
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done() // never answer; the client gives up
		}))
		t.Cleanup(srv.Close)
		c := New(Config{BaseURL: srv.URL, Timeout: 50 * time.Millisecond}, srv.Client())
		_, err := c.Complete(t.Context(), secret.New("k"), request())
		if class, ok := llm.ClassOf(err); !ok || class != llm.ClassTransient {
			t.Fatalf("error %v: class %s, want transient", err, class)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("our own timeout must not look like the caller's deadline: %v", err)
		}
	})

	t.Run("caller cancel is the context error", func(t *testing.T) {
		t.Parallel()
		arrived := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			close(arrived)
			<-r.Context().Done()
		}))
		t.Cleanup(srv.Close)
		c := New(Config{BaseURL: srv.URL}, srv.Client())
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			<-arrived
			cancel()
		}()
		_, err := c.Complete(ctx, secret.New("k"), request())
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want context.Canceled", err)
		}
		if _, ok := llm.ClassOf(err); ok {
			t.Errorf("a cancellation must not be classified: %v", err)
		}
	})

	t.Run("connection refused is transient", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		_, err := New(Config{BaseURL: url}, nil).Complete(t.Context(), secret.New("k"), request())
		if class, ok := llm.ClassOf(err); !ok || class != llm.ClassTransient {
			t.Fatalf("error %v: class %s, want transient", err, class)
		}
	})

	t.Run("redirects are not followed, so the key stays home", func(t *testing.T) {
		t.Parallel()
		elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t.Errorf("redirect followed; the other host got x-api-key %q", r.Header.Get("x-api-key"))
		}))
		t.Cleanup(elsewhere.Close)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+"/v1/messages", http.StatusTemporaryRedirect)
		}))
		t.Cleanup(srv.Close)
		_, err := New(Config{BaseURL: srv.URL}, srv.Client()).Complete(t.Context(), secret.New("k"), request())
		var pe *llm.Error
		if !errors.As(err, &pe) || pe.Status != http.StatusTemporaryRedirect || pe.Class != llm.ClassTransient {
			t.Fatalf("error %v, want a transient *llm.Error with status 307", err)
		}
	})

	t.Run("unreadable 200 is transient", func(t *testing.T) {
		t.Parallel()
		c := setup(t, "k", answer{status: 200, body: []byte("<html>maintenance</html>")})
		_, err := c.Complete(t.Context(), secret.New("k"), request())
		if class, _ := llm.ClassOf(err); class != llm.ClassTransient {
			t.Fatalf("error %v: class %s, want transient", err, class)
		}
	})

	t.Run("a key with a newline is an auth failure, not a connection error", func(t *testing.T) {
		t.Parallel()
		_, err := New(Config{}, nil).Complete(t.Context(), secret.New("abc\n"), request())
		if class, _ := llm.ClassOf(err); class != llm.ClassAuth {
			t.Fatalf("error %v: class %s, want auth", err, class)
		}
	})

	t.Run("invalid config fails every call", func(t *testing.T) {
		t.Parallel()
		_, err := New(Config{BaseURL: "ftp://x", Timeout: -1}, nil).Complete(t.Context(), secret.New("k"), request())
		if err == nil || !strings.Contains(err.Error(), "anthropic.BaseURL") {
			t.Fatalf("error %v, want one naming anthropic.BaseURL", err)
		}
		if err := (Config{Timeout: -time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "anthropic.Timeout") {
			t.Errorf("Validate = %v, want one naming anthropic.Timeout", err)
		}
		if err := (Config{}).Validate(); err != nil {
			t.Errorf("zero Config invalid: %v", err)
		}
	})
}

func TestClassifyTable(t *testing.T) {
	t.Parallel()
	// Provider codes are read before the status.
	tests := []struct {
		status             int
		errType, code, msg string
		body               string
		want               llm.Class
	}{
		{429, "rate_limit_error", "", "", "", llm.ClassRateLimited},
		{429, "rate_limit_error", "enforced_spend_limit_reached", "", "", llm.ClassQuota},
		{429, "", "", "", `{"weird":"enforced_spend_limit_reached"}`, llm.ClassQuota},
		{400, "rate_limit_error", "", "", "", llm.ClassRateLimited},
		{529, "", "", "", "", llm.ClassOverloaded},
		{503, "overloaded_error", "", "", "", llm.ClassOverloaded},
		{401, "", "", "", "", llm.ClassAuth},
		{403, "", "", "", "", llm.ClassAuth},
		{500, "", "", "", "", llm.ClassTransient},
		{502, "", "", "", "", llm.ClassTransient},
		{408, "", "", "", "", llm.ClassTransient},
		{409, "", "", "", "", llm.ClassPermanent},
		{422, "", "", "", "", llm.ClassPermanent},
		{400, "invalid_request_error", "", "prompt is too long", "", llm.ClassPermanent},
		{400, "invalid_request_error", "", "Your credit balance is too low", "", llm.ClassQuota},
		{302, "", "", "", "", llm.ClassTransient},
	}
	for _, tt := range tests {
		if got := Classify(tt.status, tt.errType, tt.code, tt.msg, []byte(tt.body)); got != tt.want {
			t.Errorf("Classify(%d, %q, %q, %q) = %s, want %s", tt.status, tt.errType, tt.code, tt.msg, got, tt.want)
		}
	}
}
