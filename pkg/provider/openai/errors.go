package openai

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
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
	errType string // error.type, e.g. "insufficient_quota"
	code    string // error.code, e.g. "rate_limit_exceeded"
	message string // error.message, lower-cased
}

// is reports whether the code or the type is one of names: OpenAI puts the
// same word in either depending on the endpoint and the year.
func (f failure) is(names ...string) bool {
	return slices.Contains(names, f.code) || slices.Contains(names, f.errType)
}

// classRule maps a provider signal to a class. Rules are tried in order and
// the first match wins; the status alone is consulted only when no rule
// matched (provider.ClassifyStatus).
type classRule struct {
	name  string
	match func(f failure) bool
	class llm.Class
}

// quotaCodes are OpenAI's billing failures, all sent as 429 with type
// insufficient_quota and the specific cause in code. Waiting does not help.
var quotaCodes = []string{
	"insufficient_quota",
	"credit_balance_exhausted",
	"organization_spend_limit_exceeded",
	"project_spend_limit_exceeded",
	"organization_usage_limit_exceeded",
	"billing_hard_limit_reached",
	"billing_not_active",
}

// classRules is OpenAI's table. Order matters:
//
//   - Billing first: insufficient_quota and its specific codes arrive as
//     429, the status of a rate limit, but only money or an operator fixes
//     them.
//   - Credential codes (invalid_api_key, …) condemn the key whatever the
//     status.
//   - Overload: server_is_overloaded (503, type service_unavailable_error),
//     the older engine_overloaded, a slow_down at any status but 429 (OpenAI
//     moved slow_down from 503 to 429), and any 5xx whose message says
//     "overloaded". OpenAI's limits are per organisation, so every key of the
//     same organisation would meet the same wall: overloaded makes the worker
//     fail over to the other provider. A bare 503 without such a signal is
//     transient (see ClassifyStatus): it is as often a proxy in front of one
//     deployment as OpenAI itself, and failing over a whole provider on it
//     would be too eager.
//   - Rate limits: rate_limit_exceeded, slow_down at 429 (traffic ramped up
//     too fast; it passes), and the legacy types "requests" and "tokens".
//   - Server errors by name (server_error, api_error, timeout) are transient.
//   - model_not_found (404, also sent when the account may not use the
//     model) and a 404 whose message names a model: model_unavailable, so
//     the other provider's equivalent answers.
//
// Everything else, invalid_request_error included (OpenAI also uses that
// type for a missing key at 401), is decided by the status.
var classRules = []classRule{
	{"billing", func(f failure) bool { return f.is(quotaCodes...) }, llm.ClassQuota},
	{"credential", func(f failure) bool {
		return f.is("invalid_api_key", "invalid_authentication", "authentication_error", "account_deactivated", "unsupported_country_region_territory")
	}, llm.ClassAuth},
	{"overloaded", func(f failure) bool {
		return f.is("server_is_overloaded", "engine_overloaded", "service_unavailable_error") ||
			(f.is("slow_down") && f.status != http.StatusTooManyRequests) ||
			(f.status >= 500 && strings.Contains(f.message, "overloaded"))
	}, llm.ClassOverloaded},
	{"rate limit", func(f failure) bool {
		return f.is("rate_limit_exceeded", "rate_limit_error", "slow_down", "requests", "tokens")
	}, llm.ClassRateLimited},
	{"server", func(f failure) bool { return f.is("server_error", "api_error", "timeout") }, llm.ClassTransient},
	{"model", func(f failure) bool {
		return f.is("model_not_found") || (f.status == http.StatusNotFound && strings.Contains(f.message, "model"))
	}, llm.ClassModelUnavailable},
}

// Classify returns the class of an OpenAI (or OpenAI-compatible) error
// answer: error.code and error.type are read first (see classRules), the
// HTTP status only when they say nothing known. errType, code and message
// may be empty.
func Classify(status int, errType, code, message string) llm.Class {
	f := failure{status: status, errType: errType, code: code, message: strings.ToLower(message)}
	for _, r := range classRules {
		if r.match(f) {
			return r.class
		}
	}
	return provider.ClassifyStatus(status)
}

// parseError reads an error body leniently: OpenAI's
// {"error":{"message","type","param","code"}}, and the shapes compatible
// hosts send instead ({"error":"text"}, {"message":…,"code":…}). ok is false
// when the body is none of these.
func parseError(body []byte) (errType, code, message string, ok bool) {
	var top struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Code    json.RawMessage `json:"code"`
	}
	if json.Unmarshal(body, &top) != nil {
		return "", "", "", false
	}
	var d wireErrorDetail
	var s string
	switch {
	case json.Unmarshal(top.Error, &d) == nil && (d.Message != "" || d.Type != "" || len(d.Code) > 0):
		return d.Type, rawCode(d.Code), d.Message, true
	case json.Unmarshal(top.Error, &s) == nil && s != "":
		return "", "", s, true
	case top.Message != "" || top.Type != "":
		return top.Type, rawCode(top.Code), top.Message, true
	}
	return "", "", "", false
}

// rawCode renders a code that may be a string, a number or null.
func rawCode(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// ErrorOf turns a non-2xx reply of any OpenAI endpoint (Chat Completions,
// Embeddings) into a classified *llm.Error (see Classify), with every trace
// of key (and anything else key-shaped) removed from the code and message,
// Retry-After and the rate-limit headers read at time now. key may be zero.
func ErrorOf(r *provider.Reply, key secret.String, now time.Time) *llm.Error {
	errType, code, message, ok := parseError(r.Body)
	if !ok {
		message = provider.Snippet(r.Body, 300)
	}
	// Code is the most specific identifier the provider gave.
	id := code
	if _, err := strconv.Atoi(id); id == "" || err == nil {
		id = errType
	}
	return &llm.Error{
		Class:      Classify(r.Status, errType, code, message),
		Provider:   llm.ProviderOpenAI,
		Status:     r.Status,
		Code:       provider.Redact(id, key),
		Message:    provider.Redact(message, key),
		RetryAfter: provider.ParseRetryAfter(r.Header, now),
		RateLimit:  ParseRateLimit(r.Header, now),
	}
}

// ParseRateLimit reads OpenAI's rate-limit headers at time now:
// x-ratelimit-{limit,remaining}-{requests,tokens} as counts and
// x-ratelimit-reset-{requests,tokens} as durations until the reset ("1s",
// "6m0s", "20ms", or a bare number of seconds), returned as now plus that
// duration. Missing, negative (-1 from some compatible hosts) or malformed
// values leave their field zero; Known is true when any of these headers
// parsed.
func ParseRateLimit(h http.Header, now time.Time) llm.RateLimit {
	var rl llm.RateLimit
	var ok [6]bool
	rl.RequestsLimit, ok[0] = provider.HeaderInt(h, "x-ratelimit-limit-requests")
	rl.RequestsRemaining, ok[1] = provider.HeaderInt(h, "x-ratelimit-remaining-requests")
	rl.RequestsReset, ok[2] = provider.HeaderResetIn(h, "x-ratelimit-reset-requests", now)
	rl.TokensLimit, ok[3] = provider.HeaderInt(h, "x-ratelimit-limit-tokens")
	rl.TokensRemaining, ok[4] = provider.HeaderInt(h, "x-ratelimit-remaining-tokens")
	rl.TokensReset, ok[5] = provider.HeaderResetIn(h, "x-ratelimit-reset-tokens", now)
	rl.Known = slices.Contains(ok[:], true)
	return rl
}

// errorTypeFor is the error.type used for an HTTP status.
func errorTypeFor(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "service_unavailable_error"
	}
	if status >= 500 {
		return "server_error"
	}
	return "invalid_request_error"
}

// EncodeError renders an error answer in the Chat Completions shape,
// {"error":{"message":…,"type":…,"param":null,"code":…}}, for a compat
// endpoint. The type follows status (401 authentication_error, 403
// permission_error, 429 rate_limit_error, 503 service_unavailable_error,
// other 5xx server_error, other 4xx invalid_request_error); code is
// Bulwark's own (e.g. "queue_full"), null when empty.
func EncodeError(status int, code, message string) []byte {
	e := outError{Error: outErrorDetail{Message: message, Type: errorTypeFor(status)}}
	if code != "" {
		e.Error.Code = &code
	}
	body, err := wirejson.Marshal(e)
	if err != nil {
		// Marshalling strings cannot fail; keep the answer well-formed anyway.
		return []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}`)
	}
	return body
}
