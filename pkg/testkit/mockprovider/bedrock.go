package mockprovider

// The Bedrock Runtime's InvokeModel for Claude: POST /model/{modelId}/invoke.
//
// What the mock imitates, and where it comes from:
//
//   - The operation: POST /model/{modelId}/invoke, modelId a path label (a
//     model id, an inference profile id or an ARN, escaped: "%3A" for ":"),
//     the body the model's own request (Amazon Bedrock API Reference,
//     "InvokeModel", Request Syntax).
//   - The body of a Claude model: Anthropic's Messages request without
//     "model", with "anthropic_version": "bedrock-2023-05-31", which is
//     required and the only value (Bedrock user guide, "Anthropic Claude
//     Messages API", request parameters). The answer is Anthropic's
//     Messages response, with the path's model id as "model". A body with
//     "model" or "stream", or without anthropic_version, gets 400
//     ValidationException "Malformed input request: #: extraneous key
//     [model] is not permitted …" / "required key [anthropic_version] not
//     found …", the wording Bedrock uses for a body its schema refuses;
//     other wording of the mock's validation is its own.
//   - Signature Version 4 (IAM user guide, "Signing AWS API requests";
//     "Elements of an AWS API request signature"): every request needs
//     "Authorization: AWS4-HMAC-SHA256 Credential=<access key
//     id>/<yyyymmdd>/<region>/bedrock/aws4_request, SignedHeaders=…,
//     Signature=<64 hex>" and X-Amz-Date (yyyymmddThhmmssZ, the scope's
//     date), with host and x-amz-date among the signed headers. The mock
//     checks that shape, not the signature itself (it knows no secret
//     keys); an X-Amz-Content-Sha256 that is sent must be the body's
//     SHA-256, as the signature covers it. Without Authorization: 403
//     MissingAuthenticationTokenException "Missing Authentication Token"
//     (AWS common errors: MissingAuthenticationToken, 403). A header
//     missing a part, or no X-Amz-Date: 400 IncompleteSignatureException,
//     whose message quotes the Authorization header as AWS's does (so a
//     client's redaction is exercised); a scope for another service or no
//     region, a date that disagrees, a malformed signature or payload
//     hash: 403 InvalidSignatureException (AWS common errors:
//     IncompleteSignature 400; Bedrock troubleshooting guide:
//     IncompleteSignature 400). Bedrock API keys (bearer tokens) are not
//     accepted. The request's age (RequestExpired) is not checked: the
//     mock's clock is often a test's fake one.
//   - Errors in the REST-JSON shape of the AWS SDKs: the type in the
//     x-amzn-ErrorType header ("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
//     the body {"message": "…"}, the request id in x-amzn-RequestId. The
//     statuses are InvokeModel's (API Reference, "Errors"):
//     ThrottlingException 429 ("Too many requests, please wait before
//     trying again." or "Too many tokens, …", the messages AWS's knowledge
//     center quotes), ServiceUnavailableException 503,
//     InternalServerException 500, ServiceQuotaExceededException 400,
//     ValidationException 400.
//   - Quotas: Bedrock meters each account per region and per model (RPM
//     and TPM quotas, Service Quotas for Amazon Bedrock), so the mock
//     meters per access key id + region (BedrockKey, the "key" Bulwark
//     pools: one region of one account) and per model, with the same
//     buckets, window and reservation as the Anthropic side (see the
//     package doc). Bedrock sends no rate-limit headers and, usually, no
//     Retry-After on a 429; neither does the mock, even for a fault that
//     sets Fault.RetryAfter.
//   - Streaming: POST /model/{modelId}/invoke-with-response-stream
//     (InvokeModelWithResponseStream) takes the same body and answers the
//     same answer in the binary AWS event-stream encoding
//     (bedrock_stream.go); "stream" in the body is refused on both paths,
//     as above.
//   - Faults answer in Bedrock's shape: rate_limit → 429
//     ThrottlingException; overloaded → 503 ServiceUnavailableException;
//     server_error → 500 InternalServerException; spend_limit and
//     insufficient_quota → 400 ServiceQuotaExceededException (Bedrock has
//     no spend cap; the account quota is the nearest refusal waiting does
//     not lift at once); invalid_request → 400 ValidationException;
//     timeout hangs. Stats count Bedrock under "bedrock". Fault.Provider
//     "" reaches Bedrock calls; to aim at one Bedrock key, set
//     KeyFingerprint to Fingerprint(BedrockKey(id, region)).

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
)

// providerBedrock names the Bedrock wire in stats.
const providerBedrock provider = "bedrock"

// BedrockAnthropicVersion is the only anthropic_version the mock's Bedrock
// endpoint accepts, as Bedrock documents it.
const BedrockAnthropicVersion = "bedrock-2023-05-31"

// BedrockKey is the key the mock meters a Bedrock call under: the access
// key id and the region of its SigV4 credential scope. Config.Keys takes it
// for per-key limits, and Fingerprint(BedrockKey(…)) names the key in stats
// and faults.
func BedrockKey(accessKeyID, region string) string { return accessKeyID + "/" + region }

// Error types of Bedrock's answers.
const (
	bedrockThrottling   = "ThrottlingException"
	bedrockUnavailable  = "ServiceUnavailableException"
	bedrockInternal     = "InternalServerException"
	bedrockQuota        = "ServiceQuotaExceededException"
	bedrockValidation   = "ValidationException"
	bedrockNoAuth       = "MissingAuthenticationTokenException"
	bedrockIncomplete   = "IncompleteSignatureException"
	bedrockBadSignature = "InvalidSignatureException"
)

// bedrockWire is one InvokeModel request: unlike the other wires it holds
// what this request's path and headers said, so each request gets its own.
type bedrockWire struct {
	model string
	// stream: InvokeModelWithResponseStream, answered in the AWS event
	// stream encoding (bedrock_stream.go).
	stream bool
	// errType is the type of a refusal preflight or parse decided on
	// (signature problems); "" means the kind's usual type.
	errType string
	// payloadHash is the X-Amz-Content-Sha256 sent, "" when none.
	payloadHash string
}

func (w *bedrockWire) provider() provider      { return providerBedrock }
func (w *bedrockWire) endpoint() string        { return "bedrock-invoke/" + w.model }
func (w *bedrockWire) requestIDHeader() string { return "x-amzn-RequestId" }

// sigV4 is a parsed "AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…,
// Signature=…" header.
type sigV4 struct {
	scheme        string
	credential    string
	signedHeaders string
	signature     string
	// The credential scope: <akid>/<date>/<region>/<service>/aws4_request.
	akid, date, region, service, terminator string
}

const sigV4Scheme = "AWS4-HMAC-SHA256"

func parseSigV4(h string) sigV4 {
	var s sigV4
	scheme, rest, _ := strings.Cut(strings.TrimSpace(h), " ")
	s.scheme = scheme
	for part := range strings.SplitSeq(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Credential":
			s.credential = v
		case "SignedHeaders":
			s.signedHeaders = v
		case "Signature":
			s.signature = v
		}
	}
	if scope := strings.Split(s.credential, "/"); len(scope) == 5 {
		s.akid, s.date, s.region, s.service, s.terminator = scope[0], scope[1], scope[2], scope[3], scope[4]
	}
	return s
}

// apiKey is the Bedrock key of the request: BedrockKey of its credential
// scope, "" without an Authorization header (403 Missing Authentication
// Token). A header whose scope cannot be read is its own key here;
// preflight refuses it.
func (w *bedrockWire) apiKey(r *http.Request) string {
	h := strings.TrimSpace(r.Header.Get("Authorization"))
	if h == "" {
		return ""
	}
	if s := parseSigV4(h); s.akid != "" && s.region != "" {
		return BedrockKey(s.akid, s.region)
	}
	return h
}

var (
	bedrockRegion  = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$`)
	bedrockDate    = regexp.MustCompile(`^[0-9]{8}$`)
	bedrockHex64   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	amzDateLayout  = "20060102T150405Z"
	signatureWrong = "The request signature we calculated does not match the signature you provided. " +
		"Check your AWS Secret Access Key and signing method. Consult the service documentation for details."
)

// refuse is a signature refusal of type typ with status.
func (w *bedrockWire) refuse(typ string, status int, format string, a ...any) *apiError {
	w.errType = typ
	return &apiError{kind: errInvalid, status: status, message: fmt.Sprintf(format, a...)}
}

// preflight checks the SigV4 shape of the request (see the file comment).
func (w *bedrockWire) preflight(r *http.Request) *apiError {
	h := strings.TrimSpace(r.Header.Get("Authorization"))
	s := parseSigV4(h)
	var missing []string
	if s.scheme != sigV4Scheme {
		return w.refuse(bedrockIncomplete, http.StatusBadRequest,
			"Authorization header requires the %s scheme with 'Credential', 'SignedHeaders' and 'Signature' parameters. Authorization=%s", sigV4Scheme, h)
	}
	for _, p := range []struct{ name, v string }{{"Credential", s.credential}, {"Signature", s.signature}, {"SignedHeaders", s.signedHeaders}} {
		if p.v == "" {
			missing = append(missing, fmt.Sprintf("Authorization header requires '%s' parameter.", p.name))
		}
	}
	amzDate := r.Header.Get("X-Amz-Date")
	if amzDate == "" {
		missing = append(missing, "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.")
	}
	if len(missing) > 0 {
		return w.refuse(bedrockIncomplete, http.StatusBadRequest, "%s Authorization=%s", strings.Join(missing, " "), h)
	}
	if s.terminator != "aws4_request" || s.akid == "" || !bedrockDate.MatchString(s.date) {
		return w.refuse(bedrockIncomplete, http.StatusBadRequest,
			"Credential must have exactly 5 slash-delimited elements, e.g. keyid/date/region/service/term, got '%s'", s.credential)
	}
	if s.service != "bedrock" {
		return w.refuse(bedrockBadSignature, http.StatusForbidden, "Credential should be scoped to correct service: 'bedrock'. ")
	}
	if !bedrockRegion.MatchString(s.region) {
		return w.refuse(bedrockBadSignature, http.StatusForbidden, "Credential should be scoped to a valid region. ")
	}
	t, err := time.Parse(amzDateLayout, amzDate)
	if err != nil || t.Format("20060102") != s.date {
		return w.refuse(bedrockBadSignature, http.StatusForbidden,
			"Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: '%s' != '%s', from '%s'.",
			s.date, strings.SplitN(amzDate, "T", 2)[0], amzDate)
	}
	signed := strings.Split(s.signedHeaders, ";")
	for _, need := range []string{"host", "x-amz-date"} {
		if !slices.Contains(signed, need) {
			return w.refuse(bedrockIncomplete, http.StatusBadRequest, "'%s' must be a 'SignedHeader' in the AWS Authorization.", need)
		}
	}
	if r.Header.Get("X-Amz-Security-Token") != "" && !slices.Contains(signed, "x-amz-security-token") {
		return w.refuse(bedrockIncomplete, http.StatusBadRequest, "'x-amz-security-token' must be a 'SignedHeader' in the AWS Authorization.")
	}
	if !bedrockHex64.MatchString(s.signature) {
		return w.refuse(bedrockBadSignature, http.StatusForbidden, "%s", signatureWrong)
	}
	if ph := r.Header.Get("X-Amz-Content-Sha256"); ph != "" {
		if !bedrockHex64.MatchString(ph) {
			return w.refuse(bedrockBadSignature, http.StatusForbidden, "%s", signatureWrong)
		}
		w.payloadHash = ph
	}
	return nil
}

// bedrockMalformed is Bedrock's wording for a body its schema refuses.
func bedrockMalformed(format string, a ...any) *apiError {
	return invalid("Malformed input request: #: %s, please reformat your input and try again.", fmt.Sprintf(format, a...))
}

// parse reads an InvokeModel body for a Claude model: the checks Bedrock
// makes of the envelope, then the Anthropic side's parse of the Messages
// body with the path's model.
func (w *bedrockWire) parse(body []byte) (*call, *apiError) {
	if w.payloadHash != "" {
		if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != w.payloadHash {
			return nil, w.refuse(bedrockBadSignature, http.StatusForbidden, "%s", signatureWrong)
		}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return nil, invalid("Malformed input request: the body is not a JSON object, please reformat your input and try again.")
	}
	for _, k := range []string{"model", "stream"} {
		if _, ok := fields[k]; ok {
			return nil, bedrockMalformed("extraneous key [%s] is not permitted", k)
		}
	}
	raw, ok := fields["anthropic_version"]
	if !ok {
		return nil, bedrockMalformed("required key [anthropic_version] not found")
	}
	var version string
	if err := json.Unmarshal(raw, &version); err != nil || version != BedrockAnthropicVersion {
		return nil, invalid("anthropic_version: %s is the only version supported", BedrockAnthropicVersion)
	}
	delete(fields, "anthropic_version")
	model, err := json.Marshal(w.model)
	if err != nil {
		return nil, invalid("modelId: %v", err)
	}
	fields["model"] = model
	if w.stream {
		fields["stream"] = json.RawMessage("true")
	}
	msg, err := json.Marshal(fields)
	if err != nil {
		return nil, invalid("reading request body: %v", err)
	}
	cl, e := anthropicWire{}.parse(msg)
	if e != nil || !w.stream {
		return cl, e
	}
	anthropicStream := cl.stream
	cl.stream = func(now time.Time, chunkBytes int) *script {
		return bedrockScript(anthropicStream(now, chunkBytes))
	}
	return cl, nil
}

// setRateHeaders writes nothing: Bedrock sends no rate-limit headers.
func (w *bedrockWire) setRateHeaders(http.Header, snapshot) {}

type bedrockErrorBody struct {
	Message string `json:"message"`
}

// writeError answers e in Bedrock's REST-JSON error shape, without
// Retry-After.
func (w *bedrockWire) writeError(rw http.ResponseWriter, e *apiError, _ string) {
	typ, status, msg := bedrockValidation, http.StatusBadRequest, e.message
	namespace := "com.amazon.bedrock"
	switch e.kind {
	case errInvalid:
		if w.errType != "" {
			typ, status, namespace = w.errType, cmp.Or(e.status, http.StatusForbidden), "com.amazon.coral.service"
		}
	case errAuth:
		typ, status, msg, namespace = bedrockNoAuth, http.StatusForbidden, "Missing Authentication Token", "com.amazon.coral.service"
	case errRateLimit, errTooLarge:
		typ, status, msg = bedrockThrottling, http.StatusTooManyRequests, "Too many requests, please wait before trying again."
		if e.limitedBy != limitByRequests {
			msg = "Too many tokens, please wait before trying again."
		}
	case errOverloaded:
		typ, status, msg = bedrockUnavailable, http.StatusServiceUnavailable, "Bedrock is unable to process your request."
	case errServer:
		typ, status, msg = bedrockInternal, http.StatusInternalServerError,
			"The system encountered an unexpected error during processing. Try your request again."
	case errQuota:
		typ, status, msg = bedrockQuota, http.StatusBadRequest,
			"Your request exceeds the service quota for your account. You can view your quotas at Viewing service quotas. "+
				"You can resubmit your request later."
	}
	if e.custom != "" {
		msg = e.custom
	}
	rw.Header().Set("x-amzn-ErrorType", typ+":http://internal.amazon.com/coral/"+namespace+"/")
	writeJSON(rw, status, bedrockErrorBody{Message: msg})
}
