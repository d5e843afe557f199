package bedrock

import (
	"encoding/json"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
)

// classRule maps a Bedrock error to a class. Rules are tried in order and
// the first match wins; the status alone decides only when none matched
// (provider.ClassifyStatus).
type classRule struct {
	name  string
	match func(errType, message string) bool
	class llm.Class
}

func typeIs(names ...string) func(string, string) bool {
	return func(errType, _ string) bool {
		for _, n := range names {
			if errType == n {
				return true
			}
		}
		return false
	}
}

// classRules is Bedrock's table. The types and their statuses are
// InvokeModel's (Amazon Bedrock API Reference, InvokeModel, "Errors"; the
// same in the SDK's model: ThrottlingException 429, ModelNotReadyException
// 429, ServiceQuotaExceededException 400, ServiceUnavailableException 503,
// InternalServerException 500, ModelTimeoutException 408,
// ModelErrorException 424, AccessDeniedException 403,
// ResourceNotFoundException 404, ValidationException 400) and the errors
// every AWS API may answer before the service sees the request (AWS common
// errors; the Bedrock user guide's "Troubleshooting Amazon Bedrock API
// Error Codes"). Why each class:
//
//   - ThrottlingException: the account's per-region, per-model quota (RPM
//     or TPM) is spent, which is this key's: rate_limited, so the key
//     cools and another region or account answers.
//   - ServiceQuotaExceededException: "Your request exceeds the service
//     quota for your account … You can resubmit your request later." It is
//     the account's quota in this region, the key's, and waiting helps,
//     which is rate_limited (cool the key, escalating), not quota (disable
//     it until an operator steps in: for spend caps that waiting does not
//     lift).
//   - ModelNotReadyException (429): the model cannot serve yet, for any key
//     ("the AWS SDK will automatically retry the operation up to 5 times"):
//     overloaded, so the route's breaker counts it and the other provider
//     answers, and no key cools for it. Read by its 429 alone it would cool
//     a key that did nothing wrong.
//   - ServiceUnavailableException (503): Bedrock cannot serve for now:
//     overloaded, as Anthropic's 529.
//   - InternalServerException (500, and the common InternalFailure),
//     ModelTimeoutException (408), ModelErrorException (424, "an error
//     while processing the model"): transient, another key after a
//     backoff. By status alone 424 would be permanent.
//   - AccessDeniedException (403; also "You don't have access to the model"
//     when the account has not enabled it), the signature and token errors
//     (UnrecognizedClientException, InvalidSignatureException,
//     ExpiredTokenException, IncompleteSignature, MissingAuthenticationToken,
//     InvalidClientTokenId, SignatureDoesNotMatch, NotAuthorized,
//     OptInRequired) and FTUFormNotFilled (404: the account has not
//     submitted Anthropic's use-case form): this key's credentials or
//     account cannot call the model: auth, the key is disabled and the
//     operators are alerted; other accounts' keys go on.
//   - RequestExpired, RequestTimeTooSkewed: this host's clock, not the
//     key or the request: transient.
//   - ResourceNotFoundException (404): the model id is unknown or retired
//     in this region: model_unavailable, the other provider's equivalent
//     answers.
//   - ValidationException (400) naming the model ("The provided model
//     identifier is invalid", "… with on-demand throughput isn't supported
//     …", which wants an inference profile): the route's model
//     configuration, not the request: model_unavailable. Any other
//     ValidationException, and ConflictException, is the request's fault:
//     permanent.
var classRules = []classRule{
	{"throttled", typeIs("ThrottlingException"), llm.ClassRateLimited},
	{"account quota", typeIs("ServiceQuotaExceededException"), llm.ClassRateLimited},
	{"model not ready", typeIs("ModelNotReadyException"), llm.ClassOverloaded},
	{"unavailable", typeIs("ServiceUnavailableException", "ServiceUnavailable"), llm.ClassOverloaded},
	{"server", typeIs("InternalServerException", "InternalFailure", "ModelTimeoutException", "ModelErrorException",
		"ModelStreamErrorException"), llm.ClassTransient},
	{"clock", typeIs("RequestExpired", "RequestTimeTooSkewed", "RequestInTheFuture"), llm.ClassTransient},
	{"credentials", typeIs("AccessDeniedException", "AccessDenied", "UnrecognizedClientException",
		"InvalidSignatureException", "ExpiredTokenException", "ExpiredToken", "IncompleteSignature",
		"IncompleteSignatureException", "MissingAuthenticationToken", "MissingAuthenticationTokenException",
		"InvalidClientTokenId", "SignatureDoesNotMatch", "NotAuthorized", "OptInRequired", "FTUFormNotFilled"), llm.ClassAuth},
	{"model", typeIs("ResourceNotFoundException"), llm.ClassModelUnavailable},
	{"model id", func(errType, message string) bool {
		return errType == "ValidationException" && (strings.Contains(message, "model identifier is invalid") ||
			strings.Contains(message, "on-demand throughput isn"))
	}, llm.ClassModelUnavailable},
	{"request", typeIs("ValidationException", "ConflictException", "SerializationException"), llm.ClassPermanent},
}

// Classify returns the class of a Bedrock error answer from its error type
// (sanitised: "ThrottlingException", not the header's URI suffix) and
// message, or from status when the type says nothing known (see
// classRules).
func Classify(status int, errType, message string) llm.Class {
	message = strings.ToLower(message)
	for _, r := range classRules {
		if r.match(errType, message) {
			return r.class
		}
	}
	return provider.ClassifyStatus(status)
}

// staleCredentials reports whether an error of errType says the signing
// credentials themselves are no good (expired, unknown, or signing wrong):
// the cached ones are dropped so that the next call fetches them anew.
func staleCredentials(errType string) bool {
	switch errType {
	case "ExpiredTokenException", "ExpiredToken", "UnrecognizedClientException", "InvalidClientTokenId",
		"InvalidSignatureException", "SignatureDoesNotMatch":
		return true
	}
	return false
}

// wireError is a Bedrock error body: {"message": "…"}, sometimes with
// "Message", "__type" or "code". encoding/json matches "message" and
// "Message" alike.
type wireError struct {
	Type    string          `json:"__type"`
	Code    json.RawMessage `json:"code"`
	Message string          `json:"message"`
}

// errorType returns an error answer's type as the AWS SDK resolves it:
// the x-amzn-ErrorType header, else the body's "__type", else its "code",
// with a namespace ("com.amazon.coral.service#") and a URI suffix
// (":http://internal.amazon.com/coral/…") removed.
func errorType(header string, w wireError) string {
	t := strings.TrimSpace(header)
	if t == "" {
		t = w.Type
	}
	if t == "" {
		var code string
		if json.Unmarshal(w.Code, &code) == nil {
			t = code
		}
	}
	if i := strings.Index(t, ":"); i >= 0 {
		t = t[:i]
	}
	if i := strings.Index(t, "#"); i >= 0 {
		t = t[i+1:]
	}
	return strings.TrimSpace(t)
}

// errorOf turns a non-2xx reply to a call of model into a classified
// *llm.Error, with every trace of creds (and anything else
// credential-shaped) removed.
func errorOf(p llm.Provider, r *provider.Reply, creds aws.Credentials, model string, now time.Time) *llm.Error {
	var w wireError
	var message string
	isJSON := json.Unmarshal(r.Body, &w) == nil
	if isJSON {
		message = w.Message
	} else {
		message = provider.Snippet(r.Body, 300)
	}
	errType := errorType(r.Header.Get("X-Amzn-ErrorType"), w)
	return &llm.Error{
		Class:      Classify(r.Status, errType, message),
		Provider:   p,
		Status:     r.Status,
		Code:       redactType(errType, creds),
		Message:    redactKeeping(message, creds, model),
		RetryAfter: provider.ParseRetryAfter(r.Header, now),
	}
}

// credentialPatterns match what an AWS error (or a proxy in front of AWS)
// may quote of a signed request: IncompleteSignature echoes the whole
// Authorization header, AccessDeniedException the caller's ARN.
var credentialPatterns = []struct {
	re   *regexp.Regexp
	repl string
}{
	// The parts of a SigV4 Authorization header or presigned query.
	{regexp.MustCompile(`(?i)\b(X-Amz-)?Credential=[^\s,&"']+`), "${1}Credential=" + provider.Redacted},
	{regexp.MustCompile(`(?i)\b(X-Amz-)?Signature=[^\s,&"']+`), "${1}Signature=" + provider.Redacted},
	{regexp.MustCompile(`(?i)\bX-Amz-Security-Token(["']?\s*[:=]\s*["']?)[^\s,;&"']+`), "X-Amz-Security-Token${1}" + provider.Redacted},
	// Access key ids and the other IAM unique ids: long-term (AKIA…),
	// temporary (ASIA…), roles (AROA…), users (AIDA…) and the rest.
	{regexp.MustCompile(`\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA|ASCA)[A-Z0-9]{12,}\b`), provider.Redacted},
	// Account ids, in ARNs (arn:aws:sts::123456789012:assumed-role/…) and
	// alone.
	{regexp.MustCompile(`\b(arn:aws[a-z\-]*:[a-z0-9\-]*:[a-z0-9\-]*:)[0-9]{12}\b`), "${1}" + provider.Redacted},
	{regexp.MustCompile(`\b[0-9]{12}\b`), provider.Redacted},
}

// Redact returns msg without creds' access key id, secret key and session
// token, without the parts of a SigV4 signature (Credential=, Signature=,
// X-Amz-Security-Token), access key and IAM ids and account ids, and
// without whatever provider.Redact removes, cut to provider.MaxMessageLen.
// It is for what operators read.
func Redact(msg string, creds aws.Credentials) string {
	for _, s := range []string{creds.SecretAccessKey, creds.SessionToken, creds.AccessKeyID} {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, provider.Redacted)
		}
	}
	for _, p := range credentialPatterns {
		msg = p.re.ReplaceAllString(msg, p.repl)
	}
	return provider.Redact(msg)
}

// typeName is the shape of an AWS error type ("ThrottlingException").
var typeName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,63}$`)

// redactType redacts an error type: a type name keeps its letters (Redact's
// rule for long mixed-case tokens would take "MissingAuthenticationTokenException"),
// unless it is one of creds or an access key id; anything else is a message.
func redactType(errType string, creds aws.Credentials) string {
	if !typeName.MatchString(errType) {
		return Redact(errType, creds)
	}
	for _, s := range []string{creds.SecretAccessKey, creds.SessionToken, creds.AccessKeyID} {
		if s != "" && strings.Contains(errType, s) {
			return provider.Redacted
		}
	}
	return credentialPatterns[3].re.ReplaceAllString(errType, provider.Redacted)
}

// modelMark stands for the model id while a message is redacted: a model
// id such as "anthropic.claude-3-5-sonnet-20240620-v1:0" looks like a
// host:port to provider.Redact, and an operator reading "model … not
// found" needs to see which.
const modelMark = "BEDROCKMODELID"

// redactKeeping is Redact that keeps model, the call's model id, readable;
// only an account id in it (an ARN's) is redacted.
func redactKeeping(msg string, creds aws.Credentials, model string) string {
	if model == "" || !strings.Contains(msg, model) || strings.Contains(msg, modelMark) {
		return Redact(msg, creds)
	}
	shown := model
	for _, p := range credentialPatterns {
		shown = p.re.ReplaceAllString(shown, p.repl)
	}
	return strings.ReplaceAll(Redact(strings.ReplaceAll(msg, model, modelMark), creds), modelMark, shown)
}
