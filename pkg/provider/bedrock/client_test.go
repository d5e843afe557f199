package bedrock

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/wiretest"
)

// testClient is a Client signing with the test credentials against base.
func testClient(base string, hc *http.Client, creds *countingCreds) *Client {
	return New(Config{BaseURL: base, Credentials: creds}, hc)
}

// suiteModel is the model of every request the conformance suite's client
// cases send, which Bedrock's path names.
const suiteModel = "test-model"

// TestConformance holds the adapter to what every provider adapter must
// do; the rest of this package's tests cover what only Bedrock does. The
// suite's fake provider verifies each request's SigV4 signature
// (checkSigned), and every call is a key of testRegion signed with the test
// credentials. Bedrock lacks what a compat endpoint needs, so the suite
// skips: the own-error read-back (no EncodeError: Bulwark has no Bedrock
// endpoint), the stream golden file and the Stream cases (the suite streams
// server-sent events on the Complete path; InvokeModelWithResponseStream
// has its own path and binary framing: stream_test.go covers it), the SDK cases, and the cases of a key string (a key no
// header can carry, a missing key), which TestCredentialsNoHeaderCanCarry
// and TestCredentials* cover in Bedrock's terms. The body carries no model
// (the path does), so requests are compared without it.
func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, providertest.Harness{
		Provider:   ProviderDefault,
		ConfigName: "bedrock",
		Constructor: providertest.ConstructorOf(func(c providertest.Config) Config {
			return Config{BaseURL: c.BaseURL, Timeout: c.Timeout, Credentials: staticCreds(testAKID, testSecret, testToken)}
		}, New),
		Path:            InvokePath(suiteModel),
		VersionlessPath: true,
		CheckRequest:    checkSigned,
		Credential:      func(string) llm.Credential { return cred(testRegion) },
		Secrets:         []string{testAKID, testToken, "123456789012"},
		Model:           testModel,
		Wire: providertest.Wire{
			EncodeRequest: func(r *llm.Request) ([]byte, error) { return EncodeRequest(r, "") },
			DecodeRequest: func(body []byte) (providertest.Info, *llm.Request, error) {
				// The fake Bedrock's reading, with the model the path of
				// every suite request names, which the body does not.
				_, req, err := decodeInvokeBody(suiteModel, body)
				if err != nil {
					return providertest.Info{}, nil, err
				}
				req.Model = ""
				return providertest.Info{}, req, nil
			},
			// The answer is Anthropic's Messages response.
			EncodeResponse: anthropic.EncodeResponse,
			DecodeResponse: anthropic.DecodeResponse,
			NoModelInBody:  true,
		},
		// Bedrock sends no rate-limit headers: Anthropic's, were a proxy to
		// pass them, are not Bedrock's and are not read.
		RateLimit: providertest.RateLimitCase{Header: map[string]string{
			"anthropic-ratelimit-requests-limit": "50", "x-amzn-RequestId": "8d9a0ad6-2b0e-4f9e-9b5e-0f6f3c1f2a11"}},
		Leak: providertest.LeakCase{
			File:    "echoes_key.json",
			Key:     "AKIAI44QH8DHBEXAMPLE",
			Secrets: []string{testAKID, testSecret, testToken, "123456789012"},
			Message: "security token included in the request is invalid",
		},
		BadRequests: []providertest.BadRequest{
			{Name: "model in the body", Body: `{"model":"m","anthropic_version":"bedrock-2023-05-31","max_tokens":1,"messages":[]}`, Want: "extraneous key [model]"},
			{Name: "stream in the body", Body: `{"stream":true,"anthropic_version":"bedrock-2023-05-31","max_tokens":1,"messages":[]}`, Want: "extraneous key [stream]"},
			{Name: "no anthropic_version", Body: `{"max_tokens":1,"messages":[]}`, Want: "required key [anthropic_version] not found"},
		},
		Mock: "bedrock",
		// The mock answers in Bedrock's shape: an error type, no
		// Retry-After, an account quota for a spend cap.
		MockErrors: map[string]providertest.MockError{
			"rate_limit":         {Class: llm.ClassRateLimited, Status: 429, Code: "ThrottlingException", Message: "Too many requests"},
			"overloaded":         {Class: llm.ClassOverloaded, Status: 503, Code: "ServiceUnavailableException"},
			"server_error":       {Class: llm.ClassTransient, Status: 500, Code: "InternalServerException"},
			"spend_limit":        {Class: llm.ClassRateLimited, Status: 400, Code: "ServiceQuotaExceededException", Message: "service quota"},
			"insufficient_quota": {Class: llm.ClassRateLimited, Status: 400, Code: "ServiceQuotaExceededException"},
			"invalid_request":    {Class: llm.ClassPermanent, Status: 400, Code: "ValidationException"},
			"message echoing the key": {Class: llm.ClassTransient, Status: 500, Code: "InternalServerException",
				Message: "upstream refused"},
			"buckets": {Class: llm.ClassRateLimited, Status: 429, Code: "ThrottlingException",
				Message: "Too many requests, please wait before trying again."},
		},
	})
}

// checkSigned is the suite's check of a request as Bedrock would make it:
// a valid SigV4 signature by the test secret, for "bedrock" in the key's
// region, the session token sent and signed, JSON accepted.
func checkSigned(r *http.Request, body []byte) error {
	if err := verifySigV4(r, body, testSecret); err != nil {
		return err
	}
	h := r.Header
	auth := h.Get("Authorization")
	scope := "Credential=" + testAKID + "/" + h.Get("X-Amz-Date")[:8] + "/" + testRegion + "/bedrock/aws4_request"
	if !strings.Contains(auth, scope) || h.Get("X-Amz-Security-Token") != testToken || !strings.Contains(auth, "x-amz-security-token") {
		return fmt.Errorf("Authorization %q (token %q), want scope %s and the token signed", auth, h.Get("X-Amz-Security-Token"), scope)
	}
	if h.Get("Accept") != "application/json" {
		return fmt.Errorf("Accept %q, want application/json", h.Get("Accept"))
	}
	return nil
}

// The anthropic_version sent, and the requests EncodeRequest refuses (the
// client fails them as permanent, sending nothing).
func TestEncodeRequest(t *testing.T) {
	t.Parallel()
	body, err := EncodeRequest(textRequest(testModel), "")
	if err != nil {
		t.Fatal(err)
	}
	if version, _, err := decodeInvokeBody(testModel, body); err != nil || version != AnthropicVersionDefault {
		t.Errorf("anthropic_version %q (%v)", version, err)
	}
	if _, err := EncodeRequest(&llm.Request{MaxTokens: 1}, ""); err == nil {
		t.Error("a request without a model encoded")
	}
	if _, err := EncodeRequest(nil, ""); err == nil {
		t.Error("a nil request encoded")
	}
	body, err = EncodeRequest(textRequest(testModel), "bedrock-2099-01-01")
	if err != nil || !strings.Contains(string(body), `"anthropic_version":"bedrock-2099-01-01"`) {
		t.Errorf("version not sent: %s (%v)", body, err)
	}
	pe := failure(t, New(Config{Credentials: staticCreds(testAKID, testSecret, "")}, nil), cred(testRegion), &llm.Request{MaxTokens: 1})
	if pe.Class != llm.ClassPermanent {
		t.Errorf("error %v, want permanent", pe)
	}
}

// What the suite's Transport cases do not cover of Bedrock's config: the
// provider name, the defaults, and the fields only Bedrock has.
func TestProviderAndConfig(t *testing.T) {
	t.Parallel()
	if got := New(Config{Provider: "bedrock-eu"}, nil).Provider(); got != "bedrock-eu" {
		t.Errorf("Provider() = %s", got)
	}
	d := Config{}.WithDefaults()
	if d.Timeout != TimeoutDefault || d.AnthropicVersion != "bedrock-2023-05-31" || d.BaseURL != "" || d.Provider != "bedrock" {
		t.Errorf("defaults %+v", d)
	}
	for _, tt := range []struct {
		cfg   Config
		field string
	}{
		{Config{BaseURL: "http://h/p?x=1"}, "bedrock.BaseURL"},
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

// Model ids with ":" and ARNs with "/" go into the path escaped, below a
// gateway's prefix, and the body Bedrock accepts is sent (fakeBedrock
// checks both, and the signature).
func TestModelIDsInPath(t *testing.T) {
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
			if _, err := testClient(srv.URL+tt.base, srv.Client(), staticCreds(testAKID, testSecret, testToken)).Complete(t.Context(), cred(testRegion), want); err != nil {
				t.Fatal(err)
			}
			got := <-seen
			_, req, _ := decodeInvokeBody(got.model, got.body)
			if d := wiretest.Diff(want, req); d != "" {
				t.Errorf("Bedrock received another request (-want +got):\n%s", d)
			}
			if err := checkSigned(got.r, got.body); err != nil {
				t.Error(err)
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
		if r.r.Header.Get("User-Agent") != provider.UserAgent {
			t.Errorf("User-Agent %q", r.r.Header.Get("User-Agent"))
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

// Credentials no header can carry are an auth failure, nothing sent and
// nothing of them in the error: Bedrock's form of the suite's key with a
// newline, which it skips.
func TestCredentialsNoHeaderCanCarry(t *testing.T) {
	t.Parallel()
	for _, cr := range []*countingCreds{staticCreds("AKID\n", testSecret, ""), staticCreds(testAKID, testSecret, "tok\r\nen")} {
		pe := failure(t, New(Config{Credentials: cr}, nil), cred(testRegion), textRequest(testModel))
		if pe.Class != llm.ClassAuth || strings.Contains(pe.Error(), "tok") {
			t.Errorf("error %v, want auth", pe)
		}
	}
}
