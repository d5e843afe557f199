package bedrock

// The adapter's cases of the conformance suite (pkg/provider/providertest).
//
// providertest.Run is not used: it holds an adapter to what Bulwark's
// compat endpoints need, and Bedrock has none. Its Errors section reads
// back the adapter's own EncodeError bodies with a Bulwark code that must
// come back as the Code (a 404 "model_not_found" as model_unavailable, a
// bodyless 404 as permanent), which a Bedrock body cannot carry without a
// field Bedrock does not have; its Wire section wants a body that names
// its model and a stream writer; its client cases send an API key and no
// region. Run has no way to skip a section, so the cases that apply are
// here, in the same words: the request the client sends (path under any
// base URL, signed headers, body), the answers it reads, the statuses
// every provider classifies alike, no secret in any error, and the
// transport cases. The mock cases run against pkg/mockprovider's Bedrock
// endpoint in mock_test.go.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/provider/internal/wiretest"
)

// testClient is a Client signing with the test credentials against base.
func testClient(base string, hc *http.Client, creds *countingCreds) *Client {
	return New(Config{BaseURL: base, Credentials: creds}, hc)
}

// Every neutral request encodes to its golden InvokeModel body, which
// Bedrock's reading of it (decodeInvokeBody) turns back into the request.
func TestRequestGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Requests() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			body, err := EncodeRequest(tc.Value, "")
			if err != nil {
				t.Fatal(err)
			}
			wiretest.Golden(t, "request_"+tc.Name+".json", body)
			version, got, err := decodeInvokeBody(tc.Value.Model, body)
			if err != nil {
				t.Fatal(err)
			}
			if version != AnthropicVersionDefault {
				t.Errorf("anthropic_version %q", version)
			}
			if d := wiretest.Diff(tc.Value, got); d != "" {
				t.Errorf("decode(EncodeRequest(x)) != x (-want +got):\n%s", d)
			}
		})
	}

	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		if _, err := EncodeRequest(&llm.Request{MaxTokens: 1}, ""); err == nil {
			t.Error("a request without a model encoded")
		}
		if _, err := EncodeRequest(nil, ""); err == nil {
			t.Error("a nil request encoded")
		}
		body, err := EncodeRequest(textRequest(testModel), "bedrock-2099-01-01")
		if err != nil || !strings.Contains(string(body), `"anthropic_version":"bedrock-2099-01-01"`) {
			t.Errorf("version not sent: %s (%v)", body, err)
		}
	})
}

func TestProviderAndConfig(t *testing.T) {
	t.Parallel()
	if got := New(Config{}, nil).Provider(); got != "bedrock" {
		t.Errorf("Provider() = %s", got)
	}
	if got := New(Config{Provider: "bedrock-eu"}, nil).Provider(); got != "bedrock-eu" {
		t.Errorf("Provider() = %s", got)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config invalid: %v", err)
	}
	d := Config{}.WithDefaults()
	if d.Timeout != TimeoutDefault || d.AnthropicVersion != "bedrock-2023-05-31" || d.BaseURL != "" || d.Provider != "bedrock" {
		t.Errorf("defaults %+v", d)
	}
	for _, tt := range []struct {
		cfg   Config
		field string
	}{
		{Config{BaseURL: "ftp://x"}, "bedrock.BaseURL"},
		{Config{BaseURL: "http://h/p?x=1"}, "bedrock.BaseURL"},
		{Config{Timeout: -time.Second}, "bedrock.Timeout"},
		{Config{Provider: "Bed Rock"}, "bedrock.Provider"},
		{Config{AnthropicVersion: "v\n1"}, "bedrock.AnthropicVersion"},
	} {
		if err := tt.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("Validate(%+v) = %v, want one naming %s", tt.cfg, err, tt.field)
		}
		// An invalid config fails every call.
		_, err := New(tt.cfg, nil).Complete(t.Context(), cred(testRegion), textRequest(testModel))
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("Complete with %+v: %v", tt.cfg, err)
		}
	}
}

// The request the client sends: POST to /model/{escaped id}/invoke below
// the base URL (a gateway's prefix, a trailing slash), signed with SigV4
// for "bedrock" in the key's region over the headers and the body's hash,
// the session token sent and signed, the body Bedrock accepts.
func TestRequestShape(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ prefix, base, model string }{
		{"", "", testModel},
		{"/gw/bedrock", "/gw/bedrock", "us.anthropic.claude-sonnet-4-20250514-v1:0"},
		{"/gw/bedrock", "/gw/bedrock/", "arn:aws:bedrock:eu-central-1:123456789012:inference-profile/eu.anthropic.claude-3-7-sonnet-20250219-v1:0"},
	} {
		t.Run(tt.base+" "+tt.model, func(t *testing.T) {
			t.Parallel()
			want := wiretest.Requests()[3].Value // system, tools, tool use and results
			want.Model = tt.model
			resp, err := anthropic.EncodeResponse(wiretest.Responses()[0].Value, "")
			if err != nil {
				t.Fatal(err)
			}
			seen := make(chan received, 1)
			srv := fakeBedrock(t, tt.prefix, testSecret, answer{status: 200, body: resp}, func(r received) { seen <- r })
			creds := staticCreds(testAKID, testSecret, testToken)
			c := testClient(srv.URL+tt.base, srv.Client(), creds)
			if _, err := c.Complete(t.Context(), cred(testRegion), want); err != nil {
				t.Fatal(err)
			}
			got := <-seen
			_, req, _ := decodeInvokeBody(got.model, got.body)
			if d := wiretest.Diff(want, req); d != "" {
				t.Errorf("Bedrock received another request (-want +got):\n%s", d)
			}
			h := got.r.Header
			scope := "Credential=" + testAKID + "/" + h.Get("X-Amz-Date")[:8] + "/" + testRegion + "/bedrock/aws4_request"
			if !strings.Contains(h.Get("Authorization"), scope) || h.Get("X-Amz-Security-Token") != testToken ||
				!strings.Contains(h.Get("Authorization"), "x-amz-security-token") {
				t.Errorf("Authorization %q (token %q), want scope %s and the token signed", h.Get("Authorization"), h.Get("X-Amz-Security-Token"), scope)
			}
			if got.r.Header.Get("User-Agent") != provider.UserAgent || got.r.Header.Get("Accept") != "application/json" {
				t.Errorf("headers %v", got.r.Header)
			}
		})
	}
}

// Every request of a client is signed afresh, and credentials are fetched
// once and cached: two calls, two signatures, one Retrieve.
func TestSignedEveryTimeCredentialsCached(t *testing.T) {
	t.Parallel()
	resp, _ := anthropic.EncodeResponse(wiretest.Responses()[0].Value, "")
	var auths []string
	seen := make(chan received, 2)
	srv := fakeBedrock(t, "", testSecret, answer{status: 200, body: resp}, func(r received) { seen <- r })
	creds := staticCreds(testAKID, testSecret, "")
	c := testClient(srv.URL, srv.Client(), creds)
	for i := range 2 {
		req := textRequest(testModel)
		req.MaxTokens += i // another body, another signature
		if _, err := c.Complete(t.Context(), cred(testRegion), req); err != nil {
			t.Fatal(err)
		}
		r := <-seen
		if r.r.Header.Get("X-Amz-Security-Token") != "" {
			t.Error("a session token was sent for long-term credentials")
		}
		auths = append(auths, r.r.Header.Get("Authorization"))
	}
	if auths[0] == auths[1] {
		t.Error("two requests with one signature")
	}
	if n := creds.calls.Load(); n != 1 {
		t.Errorf("credentials retrieved %d times, want 1 (cached)", n)
	}
}

// The answers the client reads: every response case comes back as sent;
// Bedrock sends no rate-limit headers, so the rate limit is unknown.
func TestSuccess(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Responses() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			body, err := anthropic.EncodeResponse(tc.Value, "")
			if err != nil {
				t.Fatal(err)
			}
			// Anthropic's headers, were a proxy to pass them, are not
			// Bedrock's and are not read.
			srv := fakeBedrock(t, "", testSecret, answer{status: 200, body: body,
				header: map[string]string{"anthropic-ratelimit-requests-limit": "50", "x-amzn-RequestId": "8d9a0ad6-2b0e-4f9e-9b5e-0f6f3c1f2a11"}}, nil)
			res, err := testClient(srv.URL, srv.Client(), staticCreds(testAKID, testSecret, "")).Complete(t.Context(), cred(testRegion), textRequest(testModel))
			if err != nil {
				t.Fatal(err)
			}
			if d := wiretest.Diff(tc.Value, res.Response); d != "" {
				t.Errorf("response (-want +got):\n%s", d)
			}
			if res.RateLimit != (llm.RateLimit{}) || res.Latency <= 0 {
				t.Errorf("rate limit %+v, latency %s", res.RateLimit, res.Latency)
			}
		})
	}
}

// Statuses without a Bedrock error type classify as every provider's do.
func TestSharedStatuses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status int
		class  llm.Class
		body   string
		retry  map[string]string
		after  time.Duration
		msg    string
	}{
		{302, llm.ClassTransient, "", nil, 0, ""},
		{400, llm.ClassPermanent, "", nil, 0, ""},
		{401, llm.ClassAuth, "", nil, 0, ""},
		{402, llm.ClassQuota, "", nil, 0, ""},
		{403, llm.ClassAuth, "", nil, 0, ""},
		{404, llm.ClassPermanent, "", nil, 0, ""},
		{408, llm.ClassTransient, "", nil, 0, ""},
		{409, llm.ClassPermanent, "", nil, 0, ""},
		{413, llm.ClassPermanent, "", nil, 0, ""},
		{422, llm.ClassPermanent, "", nil, 0, ""},
		{429, llm.ClassRateLimited, "", nil, 0, ""},
		{500, llm.ClassTransient, "upstream connect error", nil, 0, "upstream connect error"},
		{502, llm.ClassTransient, "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>",
			map[string]string{"retry-after": "garbage"}, 0, "502 Bad Gateway"},
		{503, llm.ClassTransient, "", nil, 0, ""},
		{504, llm.ClassTransient, "", nil, 0, ""},
		{529, llm.ClassOverloaded, "", nil, 0, ""},
		{429, llm.ClassRateLimited, "", map[string]string{"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0, ""},
		{429, llm.ClassRateLimited, "", map[string]string{"retry-after": "1.5"}, 1500 * time.Millisecond, ""},
		{429, llm.ClassRateLimited, "", map[string]string{"retry-after": "86400"}, provider.MaxRetryAfter, ""},
	} {
		t.Run(fmt.Sprintf("%d %s %v", tt.status, tt.body, tt.retry), func(t *testing.T) {
			t.Parallel()
			srv := fakeBedrock(t, "", testSecret, answer{status: tt.status, body: []byte(tt.body), header: tt.retry}, nil)
			pe := failure(t, testClient(srv.URL, srv.Client(), staticCreds(testAKID, testSecret, "")), cred(testRegion), textRequest(testModel))
			if pe.Class != tt.class || pe.Status != tt.status || pe.Code != "" || pe.Provider != "bedrock" ||
				pe.RetryAfter != tt.after || !strings.Contains(pe.Message, tt.msg) || pe.RateLimit != (llm.RateLimit{}) {
				t.Errorf("got %+v, want class %s, retry after %s, message %q", pe, tt.class, tt.after, tt.msg)
			}
		})
	}
}

// The transport cases every adapter shares.
func TestTransport(t *testing.T) {
	t.Parallel()
	creds := func() *countingCreds { return staticCreds(testAKID, testSecret, "") }

	t.Run("own timeout is transient", func(t *testing.T) {
		t.Parallel()
		srv := wiretest.Hang(t)
		c := New(Config{BaseURL: srv.URL, Timeout: 50 * time.Millisecond, Credentials: creds()}, srv.Client())
		_, err := c.Complete(t.Context(), cred(testRegion), textRequest(testModel))
		if class, ok := llm.ClassOf(err); !ok || class != llm.ClassTransient || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v: class %s, want transient and not the caller's deadline", err, class)
		}
	})

	t.Run("caller cancel is the context error", func(t *testing.T) {
		t.Parallel()
		srv, ctx := wiretest.CancelWhenIn(t, nil)
		_, err := testClient(srv.URL, srv.Client(), creds()).Complete(ctx, cred(testRegion), textRequest(testModel))
		if _, ok := llm.ClassOf(err); !errors.Is(err, context.Canceled) || ok {
			t.Fatalf("error %v, want an unclassified context.Canceled", err)
		}
	})

	t.Run("connection refused is transient", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		_, err := testClient(url, nil, creds()).Complete(t.Context(), cred(testRegion), textRequest(testModel))
		if class, ok := llm.ClassOf(err); !ok || class != llm.ClassTransient {
			t.Fatalf("error %v: class %s, want transient", err, class)
		}
	})

	t.Run("redirects are not followed, so the signature stays home", func(t *testing.T) {
		t.Parallel()
		elsewhere := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			t.Errorf("redirect followed; the other host got %v", r.Header)
		}))
		t.Cleanup(elsewhere.Close)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
		}))
		t.Cleanup(srv.Close)
		pe := failure(t, testClient(srv.URL, srv.Client(), creds()), cred(testRegion), textRequest(testModel))
		if pe.Status != http.StatusTemporaryRedirect || pe.Class != llm.ClassTransient {
			t.Fatalf("error %v, want a transient *llm.Error with status 307", pe)
		}
	})

	t.Run("unreadable 200 is transient", func(t *testing.T) {
		t.Parallel()
		srv := fakeBedrock(t, "", testSecret, answer{status: 200, body: []byte("<html>maintenance " + testAKID + "</html>")}, nil)
		pe := failure(t, testClient(srv.URL, srv.Client(), creds()), cred(testRegion), textRequest(testModel))
		if pe.Class != llm.ClassTransient || strings.Contains(pe.Error(), testAKID) {
			t.Fatalf("error %v, want transient and no access key id", pe)
		}
	})

	t.Run("credentials no header can carry are an auth failure", func(t *testing.T) {
		t.Parallel()
		for _, cr := range []*countingCreds{staticCreds("AKID\n", testSecret, ""), staticCreds(testAKID, testSecret, "tok\r\nen")} {
			pe := failure(t, New(Config{Credentials: cr}, nil), cred(testRegion), textRequest(testModel))
			if pe.Class != llm.ClassAuth || strings.Contains(pe.Error(), "tok") {
				t.Errorf("error %v, want auth", pe)
			}
		}
	})

	t.Run("a request the adapter cannot encode is permanent", func(t *testing.T) {
		t.Parallel()
		pe := failure(t, New(Config{Credentials: creds()}, nil), cred(testRegion), &llm.Request{MaxTokens: 1})
		if pe.Class != llm.ClassPermanent {
			t.Errorf("error %v, want permanent", pe)
		}
	})
}
