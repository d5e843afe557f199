package anthropic

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/internal/wirejson"
	"bulwark/pkg/secret"
)

// failure is what classification reads from one error answer.
type failure struct {
	status  int
	errType string // error.type, e.g. "rate_limit_error"
	code    string // error.details.error_code, e.g. "enforced_spend_limit_reached"
	message string // error.message, lower-cased
	body    string // the whole body, lower-cased
}

// classRule maps a provider signal to a class. Rules are tried in order and
// the first match wins; every rule reads the body, none reads the status,
// which is consulted only when no rule matched (provider.ClassifyStatus).
type classRule struct {
	name  string
	match func(f failure) bool
	class llm.Class
}

// classRules is Anthropic's table. Order matters:
//
//   - Spend caps come first. Anthropic reports a tier's monthly spend cap as
//     a 429 rate_limit_error whose details.error_code is
//     enforced_spend_limit_reached (and no retry-after), a spend limit the
//     organisation set as a 400 invalid_request_error ("You have reached your
//     specified API usage limits"), an empty prepaid balance as a 400 ("Your
//     credit balance is too low") and a payment problem as 402
//     billing_error. Waiting does not help any of them, so they are quota,
//     never rate_limited or permanent.
//   - overloaded_error (529) is the provider overloaded for everyone:
//     overloaded, so the worker fails over to the other provider instead of
//     burning the other keys of this one.
//   - authentication_error (401) and permission_error (403) condemn the key.
//   - api_error (500) and timeout_error (504) are transient.
//   - not_found_error on a Messages call names the one resource it has, the
//     model (unknown, retired, or not enabled for the account):
//     model_unavailable, so the other provider's equivalent answers.
//   - invalid_request_error and request_too_large are the request's fault:
//     permanent.
var classRules = []classRule{
	{"tier spend cap", func(f failure) bool {
		return f.code == "enforced_spend_limit_reached" || strings.Contains(f.body, "enforced_spend_limit_reached")
	}, llm.ClassQuota},
	{"billing", func(f failure) bool { return f.errType == "billing_error" }, llm.ClassQuota},
	{"spend limit or credit", func(f failure) bool {
		return containsAny(f.message, "api usage limits", "spend limit", "credit balance")
	}, llm.ClassQuota},
	{"rate limit", func(f failure) bool { return f.errType == "rate_limit_error" }, llm.ClassRateLimited},
	{"overloaded", func(f failure) bool { return f.errType == "overloaded_error" }, llm.ClassOverloaded},
	{"credential", func(f failure) bool {
		return f.errType == "authentication_error" || f.errType == "permission_error"
	}, llm.ClassAuth},
	{"server", func(f failure) bool { return f.errType == "api_error" || f.errType == "timeout_error" }, llm.ClassTransient},
	{"model", func(f failure) bool { return f.errType == "not_found_error" }, llm.ClassModelUnavailable},
	{"request", func(f failure) bool {
		switch f.errType {
		case "invalid_request_error", "request_too_large":
			return true
		}
		return false
	}, llm.ClassPermanent},
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// Classify returns the class of an Anthropic error answer: the provider's
// error type, details.error_code and message are read first (see
// classRules), the HTTP status only when they say nothing known.
// errType, code and message may be empty (a proxy's HTML page, an empty
// body); body is the raw answer.
func Classify(status int, errType, code, message string, body []byte) llm.Class {
	f := failure{
		status:  status,
		errType: errType,
		code:    code,
		message: strings.ToLower(message),
		body:    strings.ToLower(string(body)),
	}
	for _, r := range classRules {
		if r.match(f) {
			return r.class
		}
	}
	return provider.ClassifyStatus(status)
}

// errorOf turns a non-2xx reply into a classified *llm.Error, with every
// trace of key (and anything else key-shaped) removed from the message.
func errorOf(r *provider.Reply, key secret.String, now time.Time) *llm.Error {
	var w wireError
	var errType, detail, message string
	if json.Unmarshal(r.Body, &w) == nil && w.Error.Type != "" {
		errType, message = w.Error.Type, w.Error.Message
		if w.Error.Details != nil {
			detail = w.Error.Details.ErrorCode
		}
	} else {
		message = provider.Snippet(r.Body, 300)
	}
	// Code is the most specific identifier the provider gave.
	code := errType
	if detail != "" {
		code = detail
	}
	return &llm.Error{
		Class:      Classify(r.Status, errType, detail, message, r.Body),
		Provider:   llm.ProviderClaude,
		Status:     r.Status,
		Code:       provider.Redact(code, key),
		Message:    provider.Redact(message, key),
		RetryAfter: provider.ParseRetryAfter(r.Header, now),
		RateLimit:  ParseRateLimit(r.Header),
	}
}

// bucket is one anthropic-ratelimit-<name>-* triple.
type bucket struct {
	limit, remaining           int
	reset                      time.Time
	hasLimit, hasRem, hasReset bool
}

func (b bucket) known() bool { return b.hasLimit || b.hasRem || b.hasReset }

func readBucket(h http.Header, name string) bucket {
	var b bucket
	prefix := "anthropic-ratelimit-" + name + "-"
	b.limit, b.hasLimit = provider.HeaderInt(h, prefix+"limit")
	b.remaining, b.hasRem = provider.HeaderInt(h, prefix+"remaining")
	b.reset, b.hasReset = provider.HeaderTime(h, prefix+"reset")
	return b
}

// ParseRateLimit reads Anthropic's rate-limit headers:
// anthropic-ratelimit-requests-{limit,remaining,reset} and, for tokens, the
// tighter (fewer remaining) of anthropic-ratelimit-tokens-* (the most
// restrictive token limit in force) and anthropic-ratelimit-input-tokens-*;
// either alone is used when only it is present. The input-tokens-* and
// output-tokens-* triples also go, as they are, to the Input... and
// Output... fields: the key pool keeps a bucket for each when a key sets
// its ITPM and OTPM. Resets are RFC 3339 timestamps. Missing, negative or
// malformed values leave their field zero; Known is true when any of these
// headers parsed.
func ParseRateLimit(h http.Header) llm.RateLimit {
	req := readBucket(h, "requests")
	in, out := readBucket(h, "input-tokens"), readBucket(h, "output-tokens")
	tok := tighter(readBucket(h, "tokens"), in)
	return llm.RateLimit{
		RequestsLimit:         req.limit,
		RequestsRemaining:     req.remaining,
		RequestsReset:         req.reset,
		TokensLimit:           tok.limit,
		TokensRemaining:       tok.remaining,
		TokensReset:           tok.reset,
		InputTokensLimit:      in.limit,
		InputTokensRemaining:  in.remaining,
		InputTokensReset:      in.reset,
		OutputTokensLimit:     out.limit,
		OutputTokensRemaining: out.remaining,
		OutputTokensReset:     out.reset,
		Known:                 req.known() || tok.known() || out.known(),
	}
}

// tighter returns the bucket with fewer tokens remaining, a when they tie or
// when b says nothing about what remains.
func tighter(a, b bucket) bucket {
	switch {
	case !b.known():
		return a
	case !a.known():
		return b
	case a.hasRem && b.hasRem && b.remaining < a.remaining:
		return b
	case !a.hasRem && b.hasRem:
		return b
	}
	return a
}

// errorTypeFor is the error.type Anthropic uses for an HTTP status.
func errorTypeFor(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// EncodeError renders an error answer in the Messages API shape,
// {"type":"error","error":{"type":…,"message":…}}, for a compat endpoint.
// The error type follows status as Anthropic's does (429 rate_limit_error,
// 529 and 503 overloaded_error, other 4xx invalid_request_error, …). A
// non-empty code (Bulwark's own, e.g. "queue_full") goes in
// error.details.error_code, where Anthropic puts its own machine-readable
// causes; clients that do not know it ignore it.
func EncodeError(status int, code, message string) []byte {
	w := wireError{Type: "error", Error: wireErrorDetail{Type: errorTypeFor(status), Message: message}}
	if code != "" {
		w.Error.Details = &wireErrorDetails{ErrorCode: code}
	}
	body, err := wirejson.Marshal(w)
	if err != nil {
		// Marshalling strings cannot fail; keep the answer well-formed anyway.
		return []byte(`{"type":"error","error":{"type":"api_error","message":"internal error"}}`)
	}
	return body
}
