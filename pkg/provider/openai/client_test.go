package openai

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

// reply is what the fake provider replies.
type reply struct {
	status int
	header map[string]string
	body   []byte
}

// setup starts a provider that checks each request the way the Messages API
// would and replies with a; it returns a Client pointed at it through a path
// prefix, as behind a gateway.
func setup(t *testing.T, key string, a reply) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.Method != http.MethodPost || r.URL.Path != "/gw/openai/v1/chat/completions":
			http.Error(w, "wrong endpoint "+r.Method+" "+r.URL.Path, http.StatusTeapot)
			return
		case r.Header.Get("Authorization") != "Bearer "+key:
			http.Error(w, "wrong key header", http.StatusTeapot)
			return
		case r.Header.Get("Content-Type") != "application/json":
			http.Error(w, "wrong content type", http.StatusTeapot)
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
	return New(Config{BaseURL: srv.URL + "/gw/openai/v1"}, srv.Client())
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
	c := setup(t, "key-1", reply{status: 200, body: body, header: map[string]string{
		"x-ratelimit-limit-requests":     "5000",
		"x-ratelimit-remaining-requests": "4999",
		"x-ratelimit-reset-requests":     "12ms",
		"x-ratelimit-limit-tokens":       "160000",
		"x-ratelimit-remaining-tokens":   "159976",
		"x-ratelimit-reset-tokens":       "6m0s",
	}})
	before := time.Now()
	res, err := c.Complete(t.Context(), secret.New("key-1"), request())
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if d := wiretest.Diff(want, res.Response); d != "" {
		t.Errorf("response (-want +got):\n%s", d)
	}
	rl := res.RateLimit
	if rl.RequestsLimit != 5000 || rl.RequestsRemaining != 4999 || rl.TokensLimit != 160000 || rl.TokensRemaining != 159976 || !rl.Known {
		t.Errorf("rate limit %+v", rl)
	}
	within := func(name string, got time.Time, d time.Duration) {
		if got.Before(before.Add(d)) || got.After(after.Add(d)) {
			t.Errorf("%s reset %s, want now+%s", name, got, d)
		}
	}
	within("requests", rl.RequestsReset, 12*time.Millisecond)
	within("tokens", rl.TokensReset, 6*time.Minute)
	if c.Provider() != llm.ProviderOpenAI {
		t.Errorf("provider %s", c.Provider())
	}
}

func TestCompleteErrors(t *testing.T) {
	t.Parallel()
	limits := map[string]string{
		"x-ratelimit-limit-requests":     "500",
		"x-ratelimit-remaining-requests": "0",
		"x-ratelimit-reset-requests":     "-1",
		"x-ratelimit-limit-tokens":       "-1",
		"x-ratelimit-remaining-tokens":   "n/a",
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
		{"429 rate_limit_exceeded (RPM), retry-after-ms first", 429, "rate_limit_requests.json", merge(limits, map[string]string{"retry-after-ms": "120", "retry-after": "1"}),
			llm.ClassRateLimited, "rate_limit_exceeded", "requests per min (RPM)", 120 * time.Millisecond, true},
		{"429 rate_limit_exceeded (TPM)", 429, "rate_limit_tokens.json", merge(limits, map[string]string{"retry-after": "2"}),
			llm.ClassRateLimited, "rate_limit_exceeded", "tokens per min (TPM)", 2 * time.Second, true},
		{"429 insufficient_quota", 429, "insufficient_quota.json", limits,
			llm.ClassQuota, "insufficient_quota", "exceeded your current quota", 0, true},
		{"429 credit_balance_exhausted", 429, "credit_balance_exhausted.json", nil,
			llm.ClassQuota, "credit_balance_exhausted", "no prepaid credits", 0, false},
		{"429 slow_down", 429, "slow_down_429.json", nil,
			llm.ClassRateLimited, "slow_down", "reduce your rate", 0, false},
		{"503 slow_down", 503, "slow_down_503.json", nil,
			llm.ClassOverloaded, "slow_down", "reduce your rate", 0, false},
		{"503 server_is_overloaded", 503, "server_is_overloaded.json", map[string]string{"retry-after": "5"},
			llm.ClassOverloaded, "server_is_overloaded", "overloaded", 5 * time.Second, false},
		{"503 engine overloaded message", 503, "engine_overloaded.json", nil,
			llm.ClassOverloaded, "server_error", "currently overloaded", 0, false},
		{"500 server_error", 500, "server_error.json", nil,
			llm.ClassTransient, "server_error", "error while processing", 0, false},
		{"401 invalid_api_key", 401, "invalid_api_key.json", nil,
			llm.ClassAuth, "invalid_api_key", "Incorrect API key provided: [redacted]", 0, false},
		{"401 missing key (invalid_request_error)", 401, "missing_key.json", nil,
			llm.ClassAuth, "invalid_request_error", "didn't provide an API key", 0, false},
		{"403 unsupported country", 403, "unsupported_country.json", nil,
			llm.ClassAuth, "unsupported_country_region_territory", "not supported", 0, false},
		{"400 context_length_exceeded", 400, "context_length.json", nil,
			llm.ClassPermanent, "context_length_exceeded", "maximum context length", 0, false},
		{"404 model_not_found", 404, "model_not_found.json", nil,
			llm.ClassModelUnavailable, "model_not_found", "gpt-nope", 0, false},
		{"compatible host: string error", 503, "compat_string_error.json", nil,
			llm.ClassOverloaded, "", "upstream overloaded", 0, false},
		{"compatible host: numeric code, -1 ms, seconds fallback", 429, "compat_numeric_code.json", map[string]string{"retry-after-ms": "-1", "retry-after": "3"},
			llm.ClassRateLimited, "", "Too many requests", 3 * time.Second, false},
		{"503 without a body", 503, "", nil, llm.ClassTransient, "", "", 0, false},
		{"529 from a compatible host", 529, "", nil, llm.ClassOverloaded, "", "", 0, false},
		{"retry-after clamped to 10 min", 429, "rate_limit_requests.json", map[string]string{"retry-after-ms": "3600000"},
			llm.ClassRateLimited, "rate_limit_exceeded", "", provider.MaxRetryAfter, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var body []byte
			if tt.file != "" {
				body = readFile(t, filepath.Join("errors", tt.file))
			}
			c := setup(t, "key-2", reply{status: tt.status, header: tt.header, body: body})
			_, err := c.Complete(t.Context(), secret.New("key-2"), request())
			var pe *llm.Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not an *llm.Error", err)
			}
			if pe.Class != tt.wantClass || pe.Code != tt.wantCode || pe.Status != tt.status || pe.Provider != llm.ProviderOpenAI {
				t.Errorf("got class %s code %q status %d provider %s; want %s %q %d", pe.Class, pe.Code, pe.Status, pe.Provider, tt.wantClass, tt.wantCode, tt.status)
			}
			if !strings.Contains(pe.Message, tt.wantMsg) {
				t.Errorf("message %q does not contain %q", pe.Message, tt.wantMsg)
			}
			if pe.RetryAfter != tt.wantRetry {
				t.Errorf("RetryAfter %s, want %s", pe.RetryAfter, tt.wantRetry)
			}
			if tt.wantLimits {
				// -1 and "n/a" leave their fields zero.
				want := llm.RateLimit{RequestsLimit: 500, Known: true}
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
	for _, key := range []string{"gw-7f3a9c2e1b5d4e6f", "sk-proj-Zx9_Qw8-Er7Ty6Ui5Op4As3Df2Gh1Jk0"} {
		c := setup(t, key, reply{status: 401, body: readFile(t, "errors/echoes_key.json"),
			header: map[string]string{"x-echo": "KEY_PLACEHOLDER"}})
		_, err := c.Complete(t.Context(), secret.New(key), request())
		var pe *llm.Error
		if !errors.As(err, &pe) || pe.Class != llm.ClassAuth {
			t.Fatalf("error %v, want an auth *llm.Error", err)
		}
		for _, s := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", pe), pe.Message, pe.Code} {
			for _, secretText := range []string{key, "sk-proj-****AAAA", "AAAA", "hunter2"} {
				if strings.Contains(s, secretText) {
					t.Errorf("error text leaks %q: %s", secretText, s)
				}
			}
		}
		if !strings.Contains(pe.Message, "Incorrect API key provided") {
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

	t.Run("unreadable 200 is transient", func(t *testing.T) {
		t.Parallel()
		c := setup(t, "k", reply{status: 200, body: []byte("<html>maintenance</html>")})
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
		if err == nil || !strings.Contains(err.Error(), "openai.BaseURL") {
			t.Fatalf("error %v, want one naming openai.BaseURL", err)
		}
		if err := (Config{Timeout: -time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "openai.Timeout") {
			t.Errorf("Validate = %v, want one naming openai.Timeout", err)
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
		want               llm.Class
	}{
		{429, "requests", "rate_limit_exceeded", "", llm.ClassRateLimited},
		{429, "insufficient_quota", "", "", llm.ClassQuota},
		{429, "insufficient_quota", "project_spend_limit_exceeded", "", llm.ClassQuota},
		{429, "", "organization_usage_limit_exceeded", "", llm.ClassQuota},
		{429, "", "", "", llm.ClassRateLimited},
		{400, "", "rate_limit_exceeded", "", llm.ClassRateLimited},
		{401, "invalid_request_error", "", "", llm.ClassAuth},
		{400, "invalid_request_error", "invalid_api_key", "", llm.ClassAuth},
		{403, "", "", "", llm.ClassAuth},
		{503, "", "", "", llm.ClassTransient},
		{503, "", "", "Service Unavailable: back-end overloaded", llm.ClassOverloaded},
		{400, "", "", "model overloaded with options", llm.ClassPermanent},
		{503, "service_unavailable_error", "server_is_overloaded", "", llm.ClassOverloaded},
		{429, "rate_limit_error", "slow_down", "", llm.ClassRateLimited},
		{503, "", "slow_down", "", llm.ClassOverloaded},
		{529, "", "", "", llm.ClassOverloaded},
		{500, "", "", "", llm.ClassTransient},
		{504, "", "", "", llm.ClassTransient},
		{408, "", "", "", llm.ClassTransient},
		{400, "invalid_request_error", "context_length_exceeded", "", llm.ClassPermanent},
		{422, "", "", "", llm.ClassPermanent},
		{402, "", "", "", llm.ClassQuota},
	}
	for _, tt := range tests {
		if got := Classify(tt.status, tt.errType, tt.code, tt.msg); got != tt.want {
			t.Errorf("Classify(%d, %q, %q, %q) = %s, want %s", tt.status, tt.errType, tt.code, tt.msg, got, tt.want)
		}
	}
}
