package bedrock

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"bulwark/pkg/llm"
)

// coral is the x-amzn-ErrorType suffix of Bedrock's own errors; the front
// door's (signature, token) carry com.amazon.coral.service.
const (
	coral        = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
	coralService = ":http://internal.amazon.com/coral/com.amazon.coral.service/"
)

// bedrockError is one error answer of Bedrock and what the client makes of
// it.
type bedrockError struct {
	name   string
	status int
	header map[string]string
	body   string
	class  llm.Class
	code   string
	msg    string
	retry  time.Duration
}

func typed(typ string) map[string]string { return map[string]string{"x-amzn-ErrorType": typ + coral} }

// bedrockErrors are InvokeModel's errors with their documented statuses,
// in the forms the SDK reads (header type, body __type, body code).
var bedrockErrors = []bedrockError{
	{"ThrottlingException", 429, typed("ThrottlingException"), `{"message":"Too many requests, please wait before trying again."}`,
		llm.ClassRateLimited, "ThrottlingException", "Too many requests", 0},
	{"ThrottlingException tokens with Retry-After", 429,
		map[string]string{"x-amzn-ErrorType": "ThrottlingException" + coral, "Retry-After": "7"},
		`{"message":"Too many tokens, please wait before trying again."}`, llm.ClassRateLimited, "ThrottlingException", "Too many tokens", 7 * time.Second},
	{"ThrottlingException daily tokens", 429, typed("ThrottlingException"), `{"message":"Too many tokens per day, please wait before trying again."}`,
		llm.ClassRateLimited, "ThrottlingException", "per day", 0},
	{"ServiceQuotaExceededException", 400, typed("ServiceQuotaExceededException"),
		`{"message":"Your request exceeds the service quota for your account. You can view your quotas at Viewing service quotas. You can resubmit your request later."}`,
		llm.ClassRateLimited, "ServiceQuotaExceededException", "service quota", 0},
	{"ModelNotReadyException", 429, typed("ModelNotReadyException"),
		`{"message":"Model is not ready for inference. Wait and try your request again."}`,
		llm.ClassOverloaded, "ModelNotReadyException", "not ready", 0},
	{"ServiceUnavailableException", 503, typed("ServiceUnavailableException"), `{"message":"Bedrock is unable to process your request."}`,
		llm.ClassOverloaded, "ServiceUnavailableException", "unable to process", 0},
	{"InternalServerException", 500, typed("InternalServerException"), `{"message":"The system encountered an unexpected error during processing. Try your request again."}`,
		llm.ClassTransient, "InternalServerException", "unexpected error", 0},
	{"ModelTimeoutException", 408, typed("ModelTimeoutException"), `{"message":"Model has timed out in processing the request. Try your request again."}`,
		llm.ClassTransient, "ModelTimeoutException", "timed out", 0},
	{"ModelErrorException", 424, typed("ModelErrorException"),
		`{"message":"Received error from the model.","originalStatusCode":500,"resourceName":"claude"}`,
		llm.ClassTransient, "ModelErrorException", "error from the model", 0},
	{"AccessDeniedException", 403, typed("AccessDeniedException"),
		`{"message":"You don't have access to the model with the specified model ID."}`,
		llm.ClassAuth, "AccessDeniedException", "don't have access", 0},
	{"AccessDeniedException IAM", 403, typed("AccessDeniedException"),
		`{"message":"User: arn:aws:sts::123456789012:assumed-role/bulwark-worker/i-0abc is not authorized to perform: bedrock:InvokeModel on resource: arn:aws:bedrock:eu-central-1::foundation-model/anthropic.claude-3-5-sonnet-20240620-v1:0"}`,
		llm.ClassAuth, "AccessDeniedException", "is not authorized to perform: bedrock:InvokeModel", 0},
	{"UnrecognizedClientException", 403, map[string]string{"x-amzn-ErrorType": "UnrecognizedClientException" + coralService},
		`{"message":"The security token included in the request is invalid."}`, llm.ClassAuth, "UnrecognizedClientException", "security token", 0},
	{"ExpiredTokenException in __type", 403, nil,
		`{"__type":"com.amazon.coral.service#ExpiredTokenException","message":"The security token included in the request is expired"}`,
		llm.ClassAuth, "ExpiredTokenException", "expired", 0},
	{"InvalidSignatureException", 403, map[string]string{"x-amzn-ErrorType": "InvalidSignatureException" + coralService},
		`{"message":"The request signature we calculated does not match the signature you provided."}`, llm.ClassAuth, "InvalidSignatureException", "signature", 0},
	{"MissingAuthenticationTokenException", 403, map[string]string{"x-amzn-ErrorType": "MissingAuthenticationTokenException" + coralService},
		`{"message":"Missing Authentication Token"}`, llm.ClassAuth, "MissingAuthenticationTokenException", "Missing Authentication Token", 0},
	{"IncompleteSignature code", 400, nil, `{"code":"IncompleteSignature","Message":"The request signature does not conform to AWS standards."}`,
		llm.ClassAuth, "IncompleteSignature", "does not conform", 0},
	{"FTUFormNotFilled", 404, typed("FTUFormNotFilled"), `{"message":"Model use case details have not been submitted for this account."}`,
		llm.ClassAuth, "FTUFormNotFilled", "use case details", 0},
	{"ResourceNotFoundException", 404, typed("ResourceNotFoundException"),
		`{"message":"This model version has reached the end of its life. Please refer to the AWS documentation for more details."}`,
		llm.ClassModelUnavailable, "ResourceNotFoundException", "end of its life", 0},
	{"ValidationException model id", 400, typed("ValidationException"), `{"message":"The provided model identifier is invalid."}`,
		llm.ClassModelUnavailable, "ValidationException", "model identifier is invalid", 0},
	{"ValidationException on-demand", 400, typed("ValidationException"),
		`{"message":"Invocation of model ID anthropic.claude-3-5-sonnet-20241022-v2:0 with on-demand throughput isn’t supported. Retry your request with the ID or ARN of an inference profile that contains this model."}`,
		llm.ClassModelUnavailable, "ValidationException", "inference profile", 0},
	{"ValidationException", 400, typed("ValidationException"),
		`{"message":"Malformed input request: #: extraneous key [model] is not permitted, please reformat your input and try again."}`,
		llm.ClassPermanent, "ValidationException", "extraneous key [model]", 0},
	{"ValidationException too long", 400, typed("ValidationException"), `{"message":"Input is too long for requested model."}`,
		llm.ClassPermanent, "ValidationException", "too long", 0},
	{"RequestExpired", 400, nil, `{"__type":"RequestExpired","message":"Request has expired."}`,
		llm.ClassTransient, "RequestExpired", "expired", 0},
	{"ModelNotReadyException under another status", 400, typed("ModelNotReadyException"), `{"message":"not ready"}`,
		llm.ClassOverloaded, "ModelNotReadyException", "not ready", 0},
	{"unknown type falls back on the status", 429, typed("SomethingNewException"), `{"message":"slow down"}`,
		llm.ClassRateLimited, "SomethingNewException", "slow down", 0},
	{"header type beats the body's", 503, typed("ServiceUnavailableException"), `{"__type":"ValidationException","message":"m"}`,
		llm.ClassOverloaded, "ServiceUnavailableException", "m", 0},
}

// The error mapping over real HTTP: each answer, from a fake Bedrock that
// verifies the signature, classifies as the table says.
func TestErrorMapping(t *testing.T) {
	t.Parallel()
	for _, tt := range bedrockErrors {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := fakeBedrock(t, "", testSecret, answer{status: tt.status, header: tt.header, body: []byte(tt.body)}, nil)
			pe := failure(t, testClient(srv.URL, srv.Client(), staticCreds(testAKID, testSecret, testToken)), cred(testRegion), textRequest(testModel))
			if pe.Class != tt.class || pe.Code != tt.code || pe.Status != tt.status || pe.Provider != "bedrock" ||
				pe.RetryAfter != tt.retry || !strings.Contains(pe.Message, tt.msg) || pe.RateLimit != (llm.RateLimit{}) {
				t.Errorf("got %+v; want class %s code %s status %d retry %s message with %q", pe, tt.class, tt.code, tt.status, tt.retry, tt.msg)
			}
			if strings.Contains(pe.Error(), "123456789012") {
				t.Errorf("account id in %v", pe)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status       int
		errType, msg string
		want         llm.Class
	}{
		{429, "ThrottlingException", "", llm.ClassRateLimited},
		{400, "ServiceQuotaExceededException", "", llm.ClassRateLimited},
		{429, "ModelNotReadyException", "", llm.ClassOverloaded},
		{503, "ServiceUnavailableException", "", llm.ClassOverloaded},
		{500, "InternalServerException", "", llm.ClassTransient},
		{408, "ModelTimeoutException", "", llm.ClassTransient},
		{424, "ModelErrorException", "", llm.ClassTransient},
		{403, "AccessDeniedException", "", llm.ClassAuth},
		{403, "UnrecognizedClientException", "", llm.ClassAuth},
		{403, "ExpiredTokenException", "", llm.ClassAuth},
		{403, "InvalidSignatureException", "", llm.ClassAuth},
		{404, "ResourceNotFoundException", "", llm.ClassModelUnavailable},
		{400, "ValidationException", "", llm.ClassPermanent},
		{400, "ValidationException", "The provided model identifier is invalid.", llm.ClassModelUnavailable},
		{424, "", "", llm.ClassPermanent},
		{503, "", "", llm.ClassTransient},
	} {
		if got := Classify(tt.status, tt.errType, tt.msg); got != tt.want {
			t.Errorf("Classify(%d, %q, %q) = %s, want %s", tt.status, tt.errType, tt.msg, got, tt.want)
		}
	}
}

// Credentials, signatures and account ids never reach an error: an answer
// that echoes the signed request (IncompleteSignature quotes the whole
// Authorization header) is redacted, and the message keeps its meaning.
func TestNoCredentialsInErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, typ string
		status    int
		body      func(auth, token string) string
		meaning   string
	}{
		{"IncompleteSignature echoing Authorization", "IncompleteSignatureException", 400, func(auth, _ string) string {
			return `{"message":"Authorization header requires 'Signature' parameter. Authorization=` + auth + `"}`
		}, "requires 'Signature' parameter"},
		{"token and keys quoted", "UnrecognizedClientException", 403, func(_, token string) string {
			return fmt.Sprintf(`{"message":"The security token included in the request is invalid: %s (key %s, secret %s, X-Amz-Security-Token: %s, account 123456789012)"}`,
				token, testAKID, testSecret, token)
		}, "security token included in the request is invalid"},
		{"a proxy's page", "AccessDeniedException", 403, func(auth, _ string) string {
			return "<html>forbidden: " + auth + " from 10.1.2.3:8443</html>"
		}, "forbidden"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			auths := make(chan string, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				if err := verifySigV4(r, body, testSecret); err != nil {
					t.Error(err)
				}
				auth := r.Header.Get("Authorization")
				auths <- auth
				w.Header().Set("x-amzn-ErrorType", tt.typ+coralService)
				w.Header().Set("x-echo", auth)
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body(auth, r.Header.Get("X-Amz-Security-Token")))
			}))
			t.Cleanup(srv.Close)
			_, err := testClient(srv.URL, srv.Client(), staticCreds(testAKID, testSecret, testToken)).
				Complete(t.Context(), cred(testRegion), textRequest(testModel))
			var pe *llm.Error
			if !errors.As(err, &pe) || pe.Class != llm.ClassAuth {
				t.Fatalf("error %v, want auth", err)
			}
			auth := <-auths
			sig := auth[strings.Index(auth, "Signature=")+len("Signature="):]
			for _, s := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", pe), pe.Message, pe.Code} {
				for _, secretText := range []string{testAKID, testSecret, testToken, sig, "123456789012", "10.1.2.3"} {
					if strings.Contains(s, secretText) {
						t.Errorf("error text leaks %q: %s", secretText, s)
					}
				}
			}
			if !strings.Contains(pe.Message, tt.meaning) || !strings.Contains(pe.Message, "[redacted]") {
				t.Errorf("message %q: lost its meaning, or nothing was redacted", pe.Message)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	none := aws.Credentials{}
	for _, tt := range []struct {
		in    string
		creds aws.Credentials
		want  string
	}{
		{"AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260301/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=" + strings.Repeat("fe", 32),
			none, "AWS4-HMAC-SHA256 Credential=[redacted], SignedHeaders=host;x-amz-date, Signature=[redacted]"},
		{"key ASIAY34FZKBOKMUTVV7A expired", none, "key [redacted] expired"},
		{"role AROAJQABLZS4A3QDU576Q denied", none, "role [redacted] denied"},
		{"User: arn:aws:iam::123456789012:user/ci is not authorized", none, "User: arn:aws:iam::[redacted]:user/ci is not authorized"},
		{"account 210987654321 over quota", none, "account [redacted] over quota"},
		{"X-Amz-Security-Token: FwoGZXIvYXdzEXAMPLE rejected", none, "X-Amz-Security-Token: [redacted] rejected"},
		{"presigned https://h/p?X-Amz-Credential=AKID%2F2026&X-Amz-Signature=abc", none, "presigned https://h/p?[redacted]"},
		{"exact AKIDEXACTVALUE and s3cr3t and t0k", aws.Credentials{AccessKeyID: "AKIDEXACTVALUE", SecretAccessKey: "s3cr3t", SessionToken: "t0k"},
			"exact [redacted] and [redacted] and [redacted]"},
		{"Too many tokens, please wait before trying again.", none, "Too many tokens, please wait before trying again."},
	} {
		if got := Redact(tt.in, tt.creds); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}

	// The call's model id stays readable in its errors (provider.Redact
	// alone takes "…-v1:0" for a host:port), an ARN's account id aside.
	for _, tt := range []struct{ model, in, want string }{
		{testModel, "Invocation of model ID " + testModel + " with on-demand throughput isn't supported",
			"Invocation of model ID " + testModel + " with on-demand throughput isn't supported"},
		{"arn:aws:bedrock:eu-central-1:123456789012:inference-profile/eu.anthropic.claude-3-7-sonnet-20250219-v1:0",
			"model arn:aws:bedrock:eu-central-1:123456789012:inference-profile/eu.anthropic.claude-3-7-sonnet-20250219-v1:0 not found at 10.0.0.1:443",
			"model arn:aws:bedrock:eu-central-1:[redacted]:inference-profile/eu.anthropic.claude-3-7-sonnet-20250219-v1:0 not found at [redacted]"},
		{testModel, "other model anthropic.claude-v2:1 at gw.internal:8443", "other model [redacted] at [redacted]"},
	} {
		if got := redactKeeping(tt.in, aws.Credentials{}, tt.model); got != tt.want {
			t.Errorf("redactKeeping(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	for _, tt := range []struct{ in, want string }{
		{"MissingAuthenticationTokenException", "MissingAuthenticationTokenException"},
		{"AKIAIOSFODNN7EXAMPLE", "[redacted]"},
		{"Bad type with spaces sk-ant-api03-abcdefgh", "Bad type with spaces [redacted]"},
	} {
		if got := redactType(tt.in, aws.Credentials{}); got != tt.want {
			t.Errorf("redactType(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
