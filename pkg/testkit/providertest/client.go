package providertest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/wiretest"
)

// keyPlaceholder in an answer's header values and body stands for the key
// the request was sent with.
const keyPlaceholder = "KEY_PLACEHOLDER"

// answer is what the replaying provider sends back.
type answer struct {
	status int
	header map[string]string
	body   []byte
}

// serve starts a provider that checks each request the way the real API
// would (see checkRequest) and replies with a; it returns a client pointed
// at it through a gateway's path prefix.
func (h *Harness) serve(t *testing.T, key string, a answer) llm.Client {
	t.Helper()
	return h.serveAt(t, key, "/gw/"+string(h.Provider)+"/v1/", a, nil)
}

// serveAt is serve with the base URL's path (a prefix, then maybe "/v1" and
// a slash) and a function that receives each request's body.
func (h *Harness) serveAt(t *testing.T, key, base string, a answer, seen func(*http.Request, []byte)) llm.Client {
	t.Helper()
	endpoint := strings.TrimSuffix(base, "/")
	if !h.VersionlessPath {
		endpoint = strings.TrimSuffix(endpoint, "/v1")
	}
	endpoint += h.Path
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := h.checkRequest(r, body, endpoint, key); err != nil {
			t.Error(err)
			http.Error(w, err.Error(), http.StatusTeapot)
			return
		}
		if seen != nil {
			seen(r, body)
		}
		for k, v := range a.header {
			w.Header().Set(k, strings.ReplaceAll(v, keyPlaceholder, key))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(strings.ReplaceAll(string(a.body), keyPlaceholder, key)))
	}))
	t.Cleanup(srv.Close)
	return h.New(Config{BaseURL: srv.URL + base}, srv.Client())
}

// checkRequest reports how r differs from a request the provider accepts:
// POST to endpoint, the key headers, a JSON body the adapter's own
// DecodeRequest reads, and whatever Harness.CheckRequest checks (a
// signature).
func (h *Harness) checkRequest(r *http.Request, body []byte, endpoint, key string) error {
	if r.Method != http.MethodPost || r.URL.Path != endpoint {
		return fmt.Errorf("request %s %s, want POST %s", r.Method, r.URL.Path, endpoint)
	}
	if h.KeyHeaders != nil {
		for name, want := range h.KeyHeaders(key) {
			if got := r.Header.Values(name); !slices.Equal(got, want) {
				return fmt.Errorf("header %s: %q, want %q", name, got, want)
			}
		}
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return fmt.Errorf("Content-Type %q, want application/json", ct)
	}
	if _, _, err := h.Wire.DecodeRequest(body); err != nil {
		return fmt.Errorf("body the provider would refuse: %w", err)
	}
	if h.CheckRequest != nil {
		if err := h.CheckRequest(r, body); err != nil {
			return fmt.Errorf("request the provider would refuse: %w", err)
		}
	}
	return nil
}

// request is the request the client cases send.
func request() *llm.Request {
	return wiretest.Requests()[0].Value
}

// checkRateLimit compares got, read from the headers of an answer received
// between before and after, with what c wants.
func checkRateLimit(t *testing.T, c RateLimitCase, got llm.RateLimit, before, after time.Time) {
	t.Helper()
	within := func(name string, reset *time.Time, in time.Duration) {
		if in == 0 {
			return
		}
		if reset.Before(before.Add(in)) || reset.After(after.Add(in)) {
			t.Errorf("%s reset %s, want now+%s", name, reset, in)
		}
		*reset = time.Time{}
	}
	within("requests", &got.RequestsReset, c.RequestsResetIn)
	within("tokens", &got.TokensReset, c.TokensResetIn)
	if d := wiretest.Diff(c.Want, got); d != "" {
		t.Errorf("rate limit (-want +got):\n%s", d)
	}
}

func (h *Harness) testClient(t *testing.T) {
	t.Run("Provider", func(t *testing.T) {
		t.Parallel()
		if got := h.New(Config{}, nil).Provider(); got != h.Provider {
			t.Errorf("Provider() = %s, want %s", got, h.Provider)
		}
	})

	// The base URL may carry a gateway's prefix, a trailing slash and a
	// trailing /v1, which is not repeated (unless the API's paths have no
	// version: then it is a prefix like any other).
	for _, base := range []string{"/gw/p", "/gw/p/", "/gw/p/v1", "/gw/p/v1/"} {
		t.Run("RequestShape "+base, func(t *testing.T) {
			t.Parallel()
			want := wiretest.Requests()[3].Value // system, tools, tool use and results
			resp, err := h.Wire.EncodeResponse(wiretest.Responses()[0].Value, "")
			if err != nil {
				t.Fatal(err)
			}
			type received struct {
				agent string
				req   *llm.Request
			}
			seen := make(chan received, 1)
			c := h.serveAt(t, "key-0", base, answer{status: http.StatusOK, body: resp}, func(r *http.Request, body []byte) {
				_, req, _ := h.Wire.DecodeRequest(body)
				seen <- received{r.Header.Get("User-Agent"), req}
			})
			if _, err := c.Complete(t.Context(), h.cred("key-0"), want); err != nil {
				t.Fatal(err)
			}
			got := <-seen
			if h.Wire.NoModelInBody {
				// The endpoint, which names the model, was checked.
				want = h.Wire.withoutModel(want)
			}
			if d := wiretest.Diff(want, got.req); d != "" {
				t.Errorf("the provider received another request (-want +got):\n%s", d)
			}
			if got.agent != provider.UserAgent {
				t.Errorf("User-Agent %q, want %q", got.agent, provider.UserAgent)
			}
		})
	}

	for _, tc := range wiretest.Responses() {
		t.Run("Success "+tc.Name, func(t *testing.T) {
			t.Parallel()
			body, err := h.Wire.EncodeResponse(tc.Value, "")
			if err != nil {
				t.Fatal(err)
			}
			c := h.serve(t, "key-1", answer{status: http.StatusOK, body: body, header: h.RateLimit.Header})
			before := time.Now()
			res, err := c.Complete(t.Context(), h.cred("key-1"), request())
			if err != nil {
				t.Fatal(err)
			}
			after := time.Now()
			if d := wiretest.Diff(tc.Value, res.Response); d != "" {
				t.Errorf("response (-want +got):\n%s", d)
			}
			checkRateLimit(t, h.RateLimit, res.RateLimit, before, after)
			if res.Latency <= 0 {
				t.Errorf("latency %s", res.Latency)
			}
		})
	}
}

// sharedErrors are answers any provider may get from a proxy or a
// compatible host in front of it, bodyless or not its shape: they classify
// by the status alone, the same for every provider.
func sharedErrors() []ErrorCase {
	cases := []ErrorCase{
		{Name: "502 HTML from a proxy, garbage retry-after", Status: 502,
			body:   []byte("<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"),
			Header: map[string]string{"retry-after": "garbage"}, Class: llm.ClassTransient, Message: "502 Bad Gateway"},
		{Name: "429 retry-after an HTTP date in the past", Status: 429,
			Header: map[string]string{"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, Class: llm.ClassRateLimited},
		{Name: "429 retry-after fractional seconds", Status: 429,
			Header: map[string]string{"retry-after": "1.5"}, Class: llm.ClassRateLimited, RetryAfter: 1500 * time.Millisecond},
		{Name: "429 retry-after clamped to MaxRetryAfter", Status: 429,
			Header: map[string]string{"retry-after": "86400"}, Class: llm.ClassRateLimited, RetryAfter: provider.MaxRetryAfter},
		{Name: "500 text/plain body", Status: 500, body: []byte("upstream connect error"),
			Class: llm.ClassTransient, Message: "upstream connect error"},
	}
	for _, s := range []struct {
		status int
		class  llm.Class
	}{
		{302, llm.ClassTransient},
		{400, llm.ClassPermanent},
		{401, llm.ClassAuth},
		{402, llm.ClassQuota},
		{403, llm.ClassAuth},
		{404, llm.ClassPermanent},
		{408, llm.ClassTransient},
		{409, llm.ClassPermanent},
		{413, llm.ClassPermanent},
		{422, llm.ClassPermanent},
		{429, llm.ClassRateLimited},
		{500, llm.ClassTransient},
		{502, llm.ClassTransient},
		{503, llm.ClassTransient},
		{504, llm.ClassTransient},
		{529, llm.ClassOverloaded},
	} {
		cases = append(cases, ErrorCase{Name: fmt.Sprintf("%d without a body", s.status), Status: s.status, Class: s.class})
	}
	return cases
}

// ownErrors are the errors Bulwark's compat endpoints send (see
// pkg/httpapi), in the adapter's own EncodeError shape: read back, as by a
// Bulwark in front of a Bulwark, each must mean what it was sent for.
var ownErrors = []struct {
	status int
	code   string
	class  llm.Class
}{
	{400, "", llm.ClassPermanent},
	{401, "", llm.ClassAuth},
	{403, "", llm.ClassAuth},
	{404, "model_not_found", llm.ClassModelUnavailable},
	{413, "", llm.ClassPermanent},
	{422, "", llm.ClassPermanent},
	{429, "queue_full", llm.ClassRateLimited},
	{500, "", llm.ClassTransient},
	{503, "unavailable", llm.ClassOverloaded},
}

func (h *Harness) testErrors(t *testing.T) {
	for _, tt := range append(sharedErrors(), h.Errors...) {
		t.Run(tt.Name, func(t *testing.T) {
			t.Parallel()
			body := tt.body
			if tt.File != "" {
				body = fixture(t, tt.File)
			}
			header := tt.Header
			want := llm.RateLimit{}
			if tt.Limits {
				header = merge(h.ErrorRateLimit.Header, tt.Header)
				want = h.ErrorRateLimit.Want
			}
			pe := h.failure(t, h.serve(t, "key-2", answer{status: tt.Status, header: header, body: body}), "key-2")
			if pe.Class != tt.Class || pe.Code != tt.Code || pe.Status != tt.Status || pe.Provider != h.Provider {
				t.Errorf("got class %s code %q status %d provider %s; want %s %q %d %s",
					pe.Class, pe.Code, pe.Status, pe.Provider, tt.Class, tt.Code, tt.Status, h.Provider)
			}
			if !strings.Contains(pe.Message, tt.Message) {
				t.Errorf("message %q does not contain %q", pe.Message, tt.Message)
			}
			if pe.RetryAfter != tt.RetryAfter {
				t.Errorf("RetryAfter %s, want %s", pe.RetryAfter, tt.RetryAfter)
			}
			if d := wiretest.Diff(want, pe.RateLimit); d != "" {
				t.Errorf("rate limit (-want +got):\n%s", d)
			}
		})
	}

	if h.Wire.EncodeError == nil {
		t.Run("own EncodeError", func(t *testing.T) {
			t.Skip("no own error encoder (Wire.EncodeError): the adapter writes no error answers of Bulwark's to read back")
		})
		h.testLeaks(t)
		return
	}
	// ownError reads back what the adapter's EncodeError wrote.
	ownError := func(t *testing.T, status int, code string) *llm.Error {
		t.Helper()
		pe := h.failure(t, h.serve(t, "key-3", answer{status: status, body: h.Wire.EncodeError(status, code, "what happened")}), "key-3")
		if pe.Status != status || pe.Message != "what happened" {
			t.Errorf("read back as %+v; want status %d and the message", pe, status)
		}
		return pe
	}
	for _, tt := range ownErrors {
		t.Run(fmt.Sprintf("own EncodeError %d %s", tt.status, tt.code), func(t *testing.T) {
			t.Parallel()
			if pe := ownError(t, tt.status, tt.code); pe.Class != tt.class || (tt.code != "" && pe.Code != tt.code) {
				t.Errorf("read back as %+v; want class %s, code %q", pe, tt.class, tt.code)
			}
		})
	}
	for status, typ := range h.ErrorTypes {
		for _, code := range []string{"", "queue_full"} {
			t.Run(fmt.Sprintf("own EncodeError type %d %s", status, code), func(t *testing.T) {
				t.Parallel()
				// A code of Bulwark's own is the most specific; without
				// one the type is.
				if pe := ownError(t, status, code); pe.Code != cmp.Or(code, typ) {
					t.Errorf("read back with code %q, want %q", pe.Code, cmp.Or(code, typ))
				}
			})
		}
	}
	h.testLeaks(t)
}

// testLeaks checks that no error ever carries the key or Leak's secrets.
func (h *Harness) testLeaks(t *testing.T) {
	t.Run("never leaks the key", func(t *testing.T) {
		t.Parallel()
		for _, key := range []string{"gw-7f3a9c2e1b5d4e6f", h.Leak.Key} {
			c := h.serve(t, key, answer{status: 401, body: fixture(t, h.Leak.File),
				header: map[string]string{"x-echo": keyPlaceholder}})
			h.checkNoLeak(t, c, key, h.Leak.Secrets, h.Leak.Message)
		}
	})

	t.Run("never leaks the key from a page that is not the provider's", func(t *testing.T) {
		t.Parallel()
		const key = "gw-0a1b2c3d4e5f6a7b"
		c := h.serve(t, key, answer{status: 401, body: []byte("<html>key " + keyPlaceholder + " refused by the gateway</html>")})
		h.checkNoLeak(t, c, key, nil, "refused by the gateway")
	})
}

// cred is the credential of a call sent with key: Harness.Credential's,
// else the key as the API key.
func (h *Harness) cred(key string) llm.Credential {
	if h.Credential != nil {
		return h.Credential(key)
	}
	return llm.Credential{APIKey: secret.New(key)}
}

// failure calls c with key and returns the *llm.Error it must fail with.
func (h *Harness) failure(t *testing.T, c llm.Client, key string) *llm.Error {
	t.Helper()
	_, err := c.Complete(t.Context(), h.cred(key), request())
	var pe *llm.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not an *llm.Error", err)
	}
	return pe
}

// checkNoLeak calls c with key, expects an auth failure, and checks that no
// rendering of the error holds key or any of secrets, while the message
// still holds meaning.
func (h *Harness) checkNoLeak(t *testing.T, c llm.Client, key string, secrets []string, meaning string) {
	t.Helper()
	_, err := c.Complete(t.Context(), h.cred(key), request())
	var pe *llm.Error
	if !errors.As(err, &pe) || pe.Class != llm.ClassAuth {
		t.Fatalf("error %v, want an auth *llm.Error", err)
	}
	for _, s := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", pe), pe.Message, pe.Code} {
		for _, secretText := range append([]string{key}, secrets...) {
			if strings.Contains(s, secretText) {
				t.Errorf("error text leaks %q: %s", secretText, s)
			}
		}
	}
	if !strings.Contains(pe.Message, meaning) {
		t.Errorf("message lost its meaning: %q", pe.Message)
	}
}

func (h *Harness) testTransport(t *testing.T) {
	t.Run("own timeout is transient", func(t *testing.T) {
		t.Parallel()
		srv := wiretest.Hang(t)
		c := h.New(Config{BaseURL: srv.URL, Timeout: 50 * time.Millisecond}, srv.Client())
		_, err := c.Complete(t.Context(), h.cred("k"), request())
		if class, ok := llm.ClassOf(err); !ok || class != llm.ClassTransient {
			t.Fatalf("error %v: class %s, want transient", err, class)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("our own timeout must not look like the caller's deadline: %v", err)
		}
	})

	t.Run("caller cancel is the context error", func(t *testing.T) {
		t.Parallel()
		srv, ctx := wiretest.CancelWhenIn(t, nil)
		_, err := h.New(Config{BaseURL: srv.URL}, srv.Client()).Complete(ctx, h.cred("k"), request())
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
		_, err := h.New(Config{BaseURL: url}, nil).Complete(t.Context(), h.cred("k"), request())
		if class, ok := llm.ClassOf(err); !ok || class != llm.ClassTransient {
			t.Fatalf("error %v: class %s, want transient", err, class)
		}
	})

	t.Run("redirects are not followed, so the key stays home", func(t *testing.T) {
		t.Parallel()
		elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t.Errorf("redirect followed; the other host got %v", r.Header)
		}))
		t.Cleanup(elsewhere.Close)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+h.Path, http.StatusTemporaryRedirect)
		}))
		t.Cleanup(srv.Close)
		_, err := h.New(Config{BaseURL: srv.URL}, srv.Client()).Complete(t.Context(), h.cred("k"), request())
		var pe *llm.Error
		if !errors.As(err, &pe) || pe.Status != http.StatusTemporaryRedirect || pe.Class != llm.ClassTransient {
			t.Fatalf("error %v, want a transient *llm.Error with status 307", err)
		}
	})

	t.Run("unreadable 200 is transient", func(t *testing.T) {
		t.Parallel()
		page := strings.Join(append([]string{"<html>maintenance"}, h.Secrets...), " ") + "</html>"
		c := h.serve(t, "k", answer{status: 200, body: []byte(page)})
		_, err := c.Complete(t.Context(), h.cred("k"), request())
		if class, _ := llm.ClassOf(err); class != llm.ClassTransient {
			t.Fatalf("error %v: class %s, want transient", err, class)
		}
		for _, s := range h.Secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("error leaks %q: %v", s, err)
			}
		}
	})

	t.Run("a key with a newline is an auth failure, not a connection error", func(t *testing.T) {
		t.Parallel()
		if h.Credential != nil {
			t.Skip("no key header (Harness.Credential): the credential is not a key string; the adapter's own tests send credentials no header can carry")
		}
		_, err := h.New(Config{}, nil).Complete(t.Context(), h.cred("abc\n"), request())
		if class, _ := llm.ClassOf(err); class != llm.ClassAuth {
			t.Fatalf("error %v: class %s, want auth", err, class)
		}
	})

	t.Run("invalid config fails every call", func(t *testing.T) {
		t.Parallel()
		_, err := h.New(Config{BaseURL: "ftp://x", Timeout: -1}, nil).Complete(t.Context(), h.cred("k"), request())
		if field := h.ConfigName + ".BaseURL"; err == nil || !strings.Contains(err.Error(), field) {
			t.Fatalf("error %v, want one naming %s", err, field)
		}
		if err, field := h.Validate(Config{Timeout: -time.Second}), h.ConfigName+".Timeout"; err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate = %v, want one naming %s", err, field)
		}
		if err := h.Validate(Config{}); err != nil {
			t.Errorf("zero Config invalid: %v", err)
		}
	})
}
