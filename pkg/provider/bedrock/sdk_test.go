package bedrock

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime"
)

// The official SDK and the adapter put a model id into the path alike, ids
// with ":" and ARNs with "/" included, and the SDK's default endpoint is
// Endpoint's.
func TestPathAndEndpointAsTheSDK(t *testing.T) {
	t.Parallel()
	paths := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths <- r.URL.EscapedPath()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	sdk := bedrockruntime.New(bedrockruntime.Options{Region: testRegion, BaseEndpoint: aws.String(srv.URL),
		Credentials: staticCreds(testAKID, testSecret, ""), HTTPClient: srv.Client(), Retryer: aws.NopRetryer{}})
	for _, model := range []string{testModel, "us.anthropic.claude-sonnet-4-20250514-v1:0",
		"arn:aws:bedrock:eu-central-1:123456789012:inference-profile/eu.anthropic.claude-3-7-sonnet-20250219-v1:0",
		"arn:aws:bedrock:eu-central-1:123456789012:provisioned-model/abc123 x+y"} {
		if _, err := sdk.InvokeModel(t.Context(), &bedrockruntime.InvokeModelInput{ModelId: aws.String(model), Body: []byte(`{}`),
			ContentType: aws.String("application/json")}); err != nil {
			t.Fatal(err)
		}
		if got, want := <-paths, InvokePath(model); got != want {
			t.Errorf("model %s: the SDK sends %s, the adapter %s", model, got, want)
		}
	}

	for _, region := range []string{"us-east-1", "cn-north-1", "us-gov-west-1"} {
		ep, err := bedrockruntime.NewDefaultEndpointResolverV2().ResolveEndpoint(t.Context(), bedrockruntime.EndpointParameters{Region: aws.String(region)})
		if err != nil {
			t.Fatal(err)
		}
		if got := ep.URI.String(); got != Endpoint(region) {
			t.Errorf("region %s: the SDK resolves %s, Endpoint %s", region, got, Endpoint(region))
		}
	}
}

// verifySigV4, which the fake Bedrock of these tests relies on, refuses a
// request changed after it was signed.
func TestVerifySigV4(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":1}`)
	sign := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "http://bedrock.test/model/m%3A0/invoke", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		sum := sha256.Sum256(body)
		hash := hex.EncodeToString(sum[:])
		r.Header.Set("X-Amz-Content-Sha256", hash)
		if err := v4.NewSigner().SignHTTP(t.Context(), aws.Credentials{AccessKeyID: testAKID, SecretAccessKey: testSecret}, r, hash, "bedrock", testRegion, time.Now()); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := verifySigV4(sign(), body, testSecret); err != nil {
		t.Fatalf("a good signature refused: %v", err)
	}
	for name, tamper := range map[string]func(*http.Request) ([]byte, string){
		"other secret": func(*http.Request) ([]byte, string) { return body, "other" },
		"header changed": func(r *http.Request) ([]byte, string) {
			r.Header.Set("Content-Type", "text/plain")
			return body, testSecret
		},
		"body changed": func(*http.Request) ([]byte, string) { return []byte(`{"a":2}`), testSecret },
		"path changed": func(r *http.Request) ([]byte, string) {
			r.URL.RawPath, r.URL.Path = "/model/m:0/invoke", "/model/m:0/invoke"
			return body, testSecret
		},
		"signature stripped": func(r *http.Request) ([]byte, string) { r.Header.Del("Authorization"); return body, testSecret },
	} {
		r := sign()
		b, secretKey := tamper(r)
		if err := verifySigV4(r, b, secretKey); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}
