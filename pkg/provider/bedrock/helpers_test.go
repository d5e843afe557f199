package bedrock

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/provider/internal/wirejson"
)

// Test credentials, in AWS's documented example shapes.
const (
	testAKID   = "AKIAIOSFODNN7EXAMPLE"
	testSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	testToken  = "IQoJb3JpZ2luX2VjEXAMPLE//////////wEaCXVzLWVhc3QtMSJHMEUCIQD+token"
	testRegion = "eu-central-1"
	testModel  = "anthropic.claude-3-5-sonnet-20240620-v1:0"
)

// countingCreds is a static credentials provider that counts its calls.
type countingCreds struct {
	creds aws.Credentials
	err   error
	calls atomic.Int32
}

func (c *countingCreds) Retrieve(context.Context) (aws.Credentials, error) {
	c.calls.Add(1)
	if c.err != nil {
		return aws.Credentials{}, c.err
	}
	return c.creds, nil
}

func staticCreds(akid, secretKey, token string) *countingCreds {
	return &countingCreds{creds: aws.Credentials{AccessKeyID: akid, SecretAccessKey: secretKey, SessionToken: token, Source: "test"}}
}

// cred is the pool's credential of a Bedrock key in region.
func cred(region string) llm.Credential {
	return llm.Credential{KeyID: "bedrock-" + region, Region: region}
}

// textRequest is a small request for model.
func textRequest(model string) *llm.Request {
	return &llm.Request{Model: model, MaxTokens: 64, Messages: []llm.Message{
		{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "Why did OTA batch 42 fail?"}}}}}
}

// received is one request as the fake Bedrock saw it.
type received struct {
	r     *http.Request
	body  []byte
	model string // unescaped from the path
}

// answer is what the fake Bedrock replies.
type answer struct {
	status int
	header map[string]string
	body   []byte
}

// fakeBedrock serves InvokeModel under prefix: it checks the request as
// Bedrock would (method, path, a valid SigV4 signature by secretKey, a body
// Bedrock accepts), hands it to seen when set, and answers a.
func fakeBedrock(t *testing.T, prefix, secretKey string, a answer, seen func(received)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec, err := checkInvoke(r, body, prefix, secretKey)
		if err != nil {
			t.Error(err)
			http.Error(w, err.Error(), http.StatusTeapot)
			return
		}
		if seen != nil {
			seen(rec)
		}
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// checkInvoke reports how r differs from an InvokeModel request Bedrock
// would accept.
func checkInvoke(r *http.Request, body []byte, prefix, secretKey string) (received, error) {
	p := r.URL.EscapedPath()
	if r.Method != http.MethodPost || !strings.HasPrefix(p, prefix+"/model/") || !strings.HasSuffix(p, "/invoke") {
		return received{}, fmt.Errorf("request %s %s, want POST %s/model/{modelId}/invoke", r.Method, p, prefix)
	}
	label := strings.TrimSuffix(strings.TrimPrefix(p, prefix+"/model/"), "/invoke")
	model, err := url.PathUnescape(label)
	if err != nil || strings.Contains(label, "/") || strings.Contains(label, ":") {
		return received{}, fmt.Errorf("model label %q is not escaped as the SDK escapes it", label)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return received{}, fmt.Errorf("Content-Type %q", ct)
	}
	if err := verifySigV4(r, body, secretKey); err != nil {
		return received{}, err
	}
	if _, _, err := decodeInvokeBody(model, body); err != nil {
		return received{}, fmt.Errorf("a body Bedrock would refuse: %w", err)
	}
	return received{r: r, body: body, model: model}, nil
}

// verifySigV4 checks r's signature as AWS would: it rebuilds the request
// from the headers the signature names, signs it again with secretKey at
// the X-Amz-Date sent, and compares. The payload hash, when sent, must be
// the body's.
func verifySigV4(r *http.Request, body []byte, secretKey string) error {
	auth := r.Header.Get("Authorization")
	const scheme = "AWS4-HMAC-SHA256 "
	if !strings.HasPrefix(auth, scheme) {
		return fmt.Errorf("Authorization %q is not SigV4", auth)
	}
	params := map[string]string{}
	for part := range strings.SplitSeq(strings.TrimPrefix(auth, scheme), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		params[k] = v
	}
	scope := strings.Split(params["Credential"], "/")
	if len(scope) != 5 || scope[3] != SigningName || scope[4] != "aws4_request" {
		return fmt.Errorf("credential scope %q", params["Credential"])
	}
	signed := strings.Split(params["SignedHeaders"], ";")
	for _, need := range []string{"host", "x-amz-date", "content-type", "x-amz-content-sha256"} {
		if !contains(signed, need) {
			return fmt.Errorf("%s is not signed: %s", need, params["SignedHeaders"])
		}
	}
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	if got := r.Header.Get("X-Amz-Content-Sha256"); got != hash {
		return fmt.Errorf("X-Amz-Content-Sha256 %q, want the body's %q", got, hash)
	}
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return fmt.Errorf("X-Amz-Date: %w", err)
	}
	again, err := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	for _, name := range signed {
		if name != "host" && name != "content-length" {
			again.Header[http.CanonicalHeaderKey(name)] = r.Header.Values(name)
		}
	}
	creds := aws.Credentials{AccessKeyID: scope[0], SecretAccessKey: secretKey, SessionToken: r.Header.Get("X-Amz-Security-Token")}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, hash, scope[3], scope[2], at); err != nil {
		return err
	}
	if want := again.Header.Get("Authorization"); want != auth {
		return fmt.Errorf("signature does not verify:\n got %s\nwant %s", auth, want)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// decodeInvokeBody reads an InvokeModel body sent to the path of model, as
// Bedrock reads it: anthropic_version present, no "model" or "stream" key,
// the rest Anthropic's Messages request. It returns the version and the
// request with Model set from the path.
func decodeInvokeBody(model string, body []byte) (string, *llm.Request, error) {
	var fields map[string]json.RawMessage
	if err := wirejson.Unmarshal(body, &fields); err != nil {
		return "", nil, err
	}
	if fields == nil {
		return "", nil, errors.New("request body: expected an object")
	}
	for _, k := range []string{"model", "stream"} {
		if _, ok := fields[k]; ok {
			return "", nil, fmt.Errorf("extraneous key [%s] is not permitted", k)
		}
	}
	raw, ok := fields["anthropic_version"]
	if !ok {
		return "", nil, errors.New("required key [anthropic_version] not found")
	}
	var version string
	if err := json.Unmarshal(raw, &version); err != nil || version == "" {
		return "", nil, errors.New("anthropic_version: expected a non-empty string")
	}
	delete(fields, "anthropic_version")
	m, err := json.Marshal(model)
	if err != nil {
		return "", nil, err
	}
	fields["model"] = m
	msg, err := wirejson.Marshal(fields)
	if err != nil {
		return "", nil, err
	}
	info, req, err := anthropic.DecodeRequest(msg)
	if err != nil {
		return "", nil, err
	}
	if len(info.Ignored) > 0 {
		return "", nil, fmt.Errorf("fields Bulwark does not send: %v", info.Ignored)
	}
	return version, req, nil
}

// failure calls c and returns the *llm.Error it must fail with.
func failure(t *testing.T, c *Client, cr llm.Credential, req *llm.Request) *llm.Error {
	t.Helper()
	_, err := c.Complete(t.Context(), cr, req)
	var pe *llm.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not an *llm.Error", err)
	}
	return pe
}
