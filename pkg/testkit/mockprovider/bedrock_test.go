package mockprovider

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/types"
	"github.com/aws/smithy-go"
)

const (
	bedrockModel  = "anthropic.claude-3-5-sonnet-20240620-v1:0"
	bedrockAKID   = "AKIDMOCKEXAMPLE01"
	bedrockSecret = "mock/secret+key/0123456789abcdefghijklmn"
)

// bedrockBody is a minimal InvokeModel body for a Claude model.
func bedrockBody(prompt string, maxTokens int) map[string]any {
	return map[string]any{
		"anthropic_version": BedrockAnthropicVersion,
		"max_tokens":        maxTokens,
		"messages":          []any{map[string]any{"role": "user", "content": prompt}},
	}
}

// bedrockSDK is the official Bedrock Runtime client pointed at the mock,
// signing as akid in region, without retries.
func bedrockSDK(b *bundle, akid, region string) *bedrockruntime.Client {
	return bedrockruntime.New(bedrockruntime.Options{
		Region:       region,
		BaseEndpoint: aws.String(b.url),
		Credentials:  credentials.NewStaticCredentialsProvider(akid, bedrockSecret, ""),
		HTTPClient:   b.client,
		Retryer:      aws.NopRetryer{},
	})
}

func invoke(t *testing.T, c *bedrockruntime.Client, model string, body any) (*bedrockruntime.InvokeModelOutput, error) {
	t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return c.InvokeModel(t.Context(), &bedrockruntime.InvokeModelInput{
		ModelId: aws.String(model), Body: raw,
		ContentType: aws.String("application/json"), Accept: aws.String("application/json"),
	})
}

// The official SDK signs, sends and parses: the answer is the Messages
// response for the path's model, ids and ARNs with ":" and "/" included.
func TestBedrockSDK(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 600, TPM: 100000}})
	c := bedrockSDK(b, bedrockAKID, "us-east-1")
	for _, model := range []string{bedrockModel, "us.anthropic.claude-sonnet-4-20250514-v1:0",
		"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-7-sonnet-20250219-v1:0"} {
		prompt := "Why did OTA batch 42 fail? " + model
		out, err := invoke(t, c, model, bedrockBody(prompt, 200))
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		var msg struct {
			Type       string `json:"type"`
			Model      string `json:"model"`
			StopReason string `json:"stop_reason"`
			Content    []struct{ Type, Text string }
			Usage      struct {
				InputTokens int `json:"input_tokens"`
			}
		}
		if err := json.Unmarshal(out.Body, &msg); err != nil {
			t.Fatal(err)
		}
		if msg.Type != "message" || msg.Model != model || msg.StopReason != "end_turn" || len(msg.Content) != 1 ||
			msg.Content[0].Text != Reply(prompt) || msg.Usage.InputTokens <= 0 || aws.ToString(out.ContentType) != "application/json" {
			t.Errorf("%s: answer %s", model, out.Body)
		}
	}
	if got := b.srv.Stats().Providers["bedrock"]; got.OK != 3 {
		t.Errorf("bedrock stats %+v, want 3 OK", got)
	}
}

// The SDK reads every refusal of the mock as the typed error Bedrock's
// model declares for it.
func TestBedrockSDKErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		mode   FaultMode
		status int
		as     func(error) bool
	}{
		{FaultRateLimit, 429, func(err error) bool { var e *types.ThrottlingException; return errors.As(err, &e) }},
		{FaultOverloaded, 503, func(err error) bool { var e *types.ServiceUnavailableException; return errors.As(err, &e) }},
		{FaultServerError, 500, func(err error) bool { var e *types.InternalServerException; return errors.As(err, &e) }},
		{FaultSpendLimit, 400, func(err error) bool { var e *types.ServiceQuotaExceededException; return errors.As(err, &e) }},
		{FaultInvalidRequest, 400, func(err error) bool { var e *types.ValidationException; return errors.As(err, &e) }},
	} {
		t.Run(string(tt.mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			if err := b.srv.SetFault(Fault{Mode: tt.mode, Count: 1, RetryAfter: 3 * time.Second,
				KeyFingerprint: Fingerprint(BedrockKey(bedrockAKID, "eu-west-1"))}); err != nil {
				t.Fatal(err)
			}
			c := bedrockSDK(b, bedrockAKID, "eu-west-1")
			_, err := invoke(t, c, bedrockModel, bedrockBody("hi", 10))
			var re interface{ HTTPStatusCode() int }
			if !tt.as(err) || !errors.As(err, &re) || re.HTTPStatusCode() != tt.status {
				t.Fatalf("error %v, want the typed error with status %d", err, tt.status)
			}
			if _, err := invoke(t, c, bedrockModel, bedrockBody("hi", 10)); err != nil {
				t.Errorf("after the fault: %v", err)
			}
		})
	}

	t.Run("bucket 429", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{DefaultLimits: Limits{RPM: 60}})
		c := bedrockSDK(b, bedrockAKID, "us-west-2")
		if _, err := invoke(t, c, bedrockModel, bedrockBody("one", 10)); err != nil {
			t.Fatal(err)
		}
		_, err := invoke(t, c, bedrockModel, bedrockBody("two", 10))
		var te *types.ThrottlingException
		if !errors.As(err, &te) || te.ErrorMessage() != "Too many requests, please wait before trying again." {
			t.Fatalf("error %v, want ThrottlingException", err)
		}
	})

	t.Run("unsigned", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{})
		// The signature is taken off on the way out.
		c := bedrockruntime.New(bedrockruntime.Options{Region: "us-east-1", BaseEndpoint: aws.String(b.url),
			Credentials: credentials.NewStaticCredentialsProvider(bedrockAKID, bedrockSecret, ""),
			HTTPClient:  stripAuth{b.client}, Retryer: aws.NopRetryer{}})
		_, err := invoke(t, c, bedrockModel, bedrockBody("hi", 10))
		var ae smithy.APIError
		if !errors.As(err, &ae) || ae.ErrorCode() != "MissingAuthenticationTokenException" || ae.ErrorMessage() != "Missing Authentication Token" {
			t.Fatalf("error %v, want MissingAuthenticationTokenException", err)
		}
	})
}

// stripAuth sends requests without their signature.
type stripAuth struct{ hc *http.Client }

func (s stripAuth) Do(r *http.Request) (*http.Response, error) {
	r.Header.Del("Authorization")
	return s.hc.Do(r)
}

// bedrock POSTs body to the mock's InvokeModel for model (":" escaped as
// %3A), signed by sign, and returns the answer.
func (b *bundle) bedrock(t *testing.T, model string, body []byte, sign func(*http.Request, string)) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.url+"/model/"+strings.ReplaceAll(model, ":", "%3A")+"/invoke", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	sum := sha256.Sum256(body)
	if sign != nil {
		sign(req, hex.EncodeToString(sum[:]))
	}
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: raw}
}

// signV4 signs with the SDK's signer as akid in region.
func signV4(akid, region string) func(*http.Request, string) {
	return func(r *http.Request, hash string) {
		creds := aws.Credentials{AccessKeyID: akid, SecretAccessKey: bedrockSecret}
		if err := v4.NewSigner().SignHTTP(r.Context(), creds, r, hash, "bedrock", region, time.Now()); err != nil {
			panic(err)
		}
	}
}

// checkBedrockError checks an error answer's status, x-amzn-ErrorType and
// message.
func checkBedrockError(t *testing.T, r reply, status int, typ, message string) {
	t.Helper()
	var body struct{ Message string }
	_ = json.Unmarshal(r.body, &body)
	errType, _, _ := strings.Cut(r.header.Get("x-amzn-ErrorType"), ":")
	if r.status != status || errType != typ || !strings.Contains(body.Message, message) {
		t.Errorf("answer %d %q %s, want %d %s containing %q", r.status, r.header.Get("x-amzn-ErrorType"), r.body, status, typ, message)
	}
	if r.header.Get("x-amzn-RequestId") == "" || r.header.Get("Retry-After") != "" {
		t.Errorf("headers %v: want a request id and no Retry-After", r.header)
	}
}

// A request without a well-formed SigV4 signature is refused in Bedrock's
// shape before anything else happens.
func TestBedrockSignatureRequired(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	body := []byte(mustJSON(t, bedrockBody("hi", 10)))
	setAuth := func(auth, date string) func(*http.Request, string) {
		return func(r *http.Request, _ string) {
			if auth != "" {
				r.Header.Set("Authorization", auth)
			}
			if date != "" {
				r.Header.Set("X-Amz-Date", date)
			}
		}
	}
	const date = "20260301T120000Z"
	sig := strings.Repeat("ab", 32)
	good := "Credential=" + bedrockAKID + "/20260301/us-east-1/bedrock/aws4_request"
	for _, tt := range []struct {
		name    string
		sign    func(*http.Request, string)
		status  int
		typ     string
		message string
	}{
		{"unsigned", nil, 403, "MissingAuthenticationTokenException", "Missing Authentication Token"},
		{"bearer", setAuth("Bearer bedrock-api-key-123", date), 400, "IncompleteSignatureException", "AWS4-HMAC-SHA256"},
		{"no signature", setAuth("AWS4-HMAC-SHA256 "+good+", SignedHeaders=host;x-amz-date", date), 400,
			"IncompleteSignatureException", "requires 'Signature' parameter. Authorization=AWS4-HMAC-SHA256 Credential=" + bedrockAKID},
		{"no X-Amz-Date", setAuth("AWS4-HMAC-SHA256 "+good+", SignedHeaders=host;x-amz-date, Signature="+sig, ""), 400,
			"IncompleteSignatureException", "'X-Amz-Date'"},
		{"short scope", setAuth("AWS4-HMAC-SHA256 Credential="+bedrockAKID+"/20260301/us-east-1, SignedHeaders=host;x-amz-date, Signature="+sig, date), 400,
			"IncompleteSignatureException", "5 slash-delimited elements"},
		{"other service", setAuth("AWS4-HMAC-SHA256 Credential="+bedrockAKID+"/20260301/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature="+sig, date), 403,
			"InvalidSignatureException", "scoped to correct service: 'bedrock'"},
		{"no region", setAuth("AWS4-HMAC-SHA256 Credential="+bedrockAKID+"/20260301/nowhere/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature="+sig, date), 403,
			"InvalidSignatureException", "valid region"},
		{"date disagrees", setAuth("AWS4-HMAC-SHA256 "+good+", SignedHeaders=host;x-amz-date, Signature="+sig, "20260302T000000Z"), 403,
			"InvalidSignatureException", "Date in Credential scope does not match"},
		{"host unsigned", setAuth("AWS4-HMAC-SHA256 "+good+", SignedHeaders=x-amz-date, Signature="+sig, date), 400,
			"IncompleteSignatureException", "'host' must be a 'SignedHeader'"},
		{"signature not hex", setAuth("AWS4-HMAC-SHA256 "+good+", SignedHeaders=host;x-amz-date, Signature=xyz", date), 403,
			"InvalidSignatureException", "signature we calculated does not match"},
		{"payload hash of another body", func(r *http.Request, _ string) {
			signV4(bedrockAKID, "us-east-1")(r, strings.Repeat("0", 64))
			r.Header.Set("X-Amz-Content-Sha256", strings.Repeat("0", 64))
		}, 403, "InvalidSignatureException", "signature we calculated does not match"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkBedrockError(t, b.bedrock(t, bedrockModel, body, tt.sign), tt.status, tt.typ, tt.message)
		})
	}
	if st := b.srv.Stats().Providers["bedrock"]; st.OK != 0 || st.Unauthorized != 1 {
		t.Errorf("stats %+v: want nothing answered and one unauthorized", st)
	}

	// The same body signed as the SDK signs it passes, with and without a
	// payload hash header.
	wantStatus(t, b.bedrock(t, bedrockModel, body, signV4(bedrockAKID, "us-east-1")), http.StatusOK)
	wantStatus(t, b.bedrock(t, bedrockModel, body, func(r *http.Request, hash string) {
		r.Header.Set("X-Amz-Content-Sha256", hash)
		signV4(bedrockAKID, "us-east-1")(r, hash)
	}), http.StatusOK)
}

// The envelope Bedrock checks before the model sees the body.
func TestBedrockBody(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	sign := signV4(bedrockAKID, "us-east-1")
	with := func(k string, v any) []byte {
		m := bedrockBody("hi", 10)
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return []byte(mustJSON(t, m))
	}
	for _, tt := range []struct {
		name, message string
		body          []byte
	}{
		{"model in the body", "extraneous key [model] is not permitted", with("model", "claude")},
		{"stream", "extraneous key [stream] is not permitted", with("stream", false)},
		{"no anthropic_version", "required key [anthropic_version] not found", with("anthropic_version", nil)},
		{"other anthropic_version", "bedrock-2023-05-31 is the only version", with("anthropic_version", "2023-06-01")},
		{"no max_tokens", "max_tokens", with("max_tokens", nil)},
		{"not an object", "not a JSON object", []byte(`[1]`)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkBedrockError(t, b.bedrock(t, bedrockModel, tt.body, sign), 400, "ValidationException", tt.message)
		})
	}
}

// Each access key id + region is a key of its own with its own buckets,
// per model, and a bucket 429 is Bedrock's ThrottlingException.
func TestBedrockMetersPerRegionAndAccount(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: map[string]Limits{BedrockKey(bedrockAKID, "us-east-1"): {RPM: 60}}})
	body := []byte(mustJSON(t, bedrockBody("hi", 10)))
	wantStatus(t, b.bedrock(t, bedrockModel, body, signV4(bedrockAKID, "us-east-1")), http.StatusOK)
	checkBedrockError(t, b.bedrock(t, bedrockModel, body, signV4(bedrockAKID, "us-east-1")),
		429, "ThrottlingException", "Too many requests, please wait before trying again.")
	// Another model of the same key, the same account in another region and
	// another account in the same region are other quotas (unlimited here).
	wantStatus(t, b.bedrock(t, "anthropic.claude-3-haiku-20240307-v1:0", body, signV4(bedrockAKID, "us-east-1")), http.StatusOK)
	wantStatus(t, b.bedrock(t, bedrockModel, body, signV4(bedrockAKID, "us-west-2")), http.StatusOK)
	wantStatus(t, b.bedrock(t, bedrockModel, body, signV4("AKIDOTHERACCOUNT1", "us-east-1")), http.StatusOK)

	st := b.srv.Stats()
	if k := st.Keys[Fingerprint(BedrockKey(bedrockAKID, "us-east-1"))]; k.OK != 2 || k.RateLimited != 1 {
		t.Errorf("key stats %+v, want 2 OK and 1 rate limited", k)
	}
	if p := st.Providers["bedrock"]; p.OK != 4 || p.RateLimited != 1 {
		t.Errorf("bedrock stats %+v", p)
	}

	// Tokens: 6,000 TPM over the 1 s window is a 100-token bucket; a call
	// of 80 input tokens and max_tokens 15 leaves 5, and the same call
	// again at once is refused by the token bucket.
	b2 := setup(t, Config{DefaultLimits: Limits{TPM: 6000}})
	big := []byte(mustJSON(t, bedrockBody(strings.Repeat("x", 320), 15)))
	wantStatus(t, b2.bedrock(t, bedrockModel, big, signV4(bedrockAKID, "us-east-1")), http.StatusOK)
	checkBedrockError(t, b2.bedrock(t, bedrockModel, big, signV4(bedrockAKID, "us-east-1")),
		429, "ThrottlingException", "Too many tokens, please wait before trying again.")
}

// A fault aimed at a Bedrock key by fingerprint fails only that key's
// calls, in Bedrock's shape, with the fault's message when it has one.
func TestBedrockFaults(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	body := []byte(mustJSON(t, bedrockBody("hi", 10)))
	if err := b.srv.SetFault(Fault{Mode: FaultOverloaded, KeyFingerprint: Fingerprint(BedrockKey(bedrockAKID, "eu-central-1")),
		Message: "capacity is short in eu-central-1"}); err != nil {
		t.Fatal(err)
	}
	checkBedrockError(t, b.bedrock(t, bedrockModel, body, signV4(bedrockAKID, "eu-central-1")),
		503, "ServiceUnavailableException", "capacity is short in eu-central-1")
	wantStatus(t, b.bedrock(t, bedrockModel, body, signV4(bedrockAKID, "eu-west-1")), http.StatusOK)
	wantStatus(t, b.claude(t, "sk-ant", claudeText("hi", 10)), http.StatusOK)
	if got := b.srv.Stats().Providers["bedrock"].Injected[FaultOverloaded]; got != 1 {
		t.Errorf("injected %d, want 1", got)
	}

	// A fault for every provider reaches Bedrock too.
	b.srv.ClearFaults()
	if err := b.srv.SetFault(Fault{Mode: FaultTimeout, Count: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/model/m/invoke", bytes.NewReader(body))
	signV4(bedrockAKID, "eu-west-1")(req, "")
	if resp, err := b.client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("timeout fault answered %d", resp.StatusCode)
	}
}
