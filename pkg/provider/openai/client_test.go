package openai

import (
	"io"
	"net/http"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/testkit/providertest"
)

// created is the fixed timestamp of golden responses and streams.
const created = 1767225600

// TestConformance holds the adapter to what every provider adapter must
// do; the rest of this package's tests cover what only OpenAI does.
func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, providertest.Harness{
		Provider:             llm.ProviderOpenAI,
		ConfigName:           "openai",
		KeepsAdmissionCharge: true,
		Constructor: providertest.ConstructorOf(func(c providertest.Config) Config {
			return Config{BaseURL: c.BaseURL, Timeout: c.Timeout}
		}, New),
		Path: "/v1/chat/completions",
		KeyHeaders: func(key string) http.Header {
			return http.Header{"Authorization": {"Bearer " + key}}
		},
		Model: "gpt-4o",
		Wire: providertest.Wire{
			EncodeRequest: EncodeRequest,
			DecodeRequest: providertest.DecodeWith(DecodeRequest, func(i *RequestInfo) providertest.Info {
				return providertest.Info{Model: i.Model, Stream: i.Stream, IncludeUsage: i.IncludeUsage, Ignored: i.Ignored}
			}),
			EncodeResponse: func(resp *llm.Response, model string) ([]byte, error) { return encodeResponse(resp, model, created) },
			DecodeResponse: DecodeResponse,
			WriteStream: func(w io.Writer, resp *llm.Response, info providertest.Info) error {
				return WriteStream(w, resp, info.Model, WithUsage(info.IncludeUsage), withCreated(created))
			},
			EncodeError: EncodeError,
		},
		RateLimit: providertest.RateLimitCase{
			Header: map[string]string{
				"x-ratelimit-limit-requests":     "5000",
				"x-ratelimit-remaining-requests": "4999",
				"x-ratelimit-reset-requests":     "12ms",
				"x-ratelimit-limit-tokens":       "160000",
				"x-ratelimit-remaining-tokens":   "159976",
				"x-ratelimit-reset-tokens":       "6m0s",
			},
			Want:            llm.RateLimit{RequestsLimit: 5000, RequestsRemaining: 4999, TokensLimit: 160000, TokensRemaining: 159976, Known: true},
			RequestsResetIn: 12 * time.Millisecond,
			TokensResetIn:   6 * time.Minute,
		},
		ErrorRateLimit: providertest.RateLimitCase{
			Header: map[string]string{
				"x-ratelimit-limit-requests":     "500",
				"x-ratelimit-remaining-requests": "0",
				"x-ratelimit-reset-requests":     "-1",
				"x-ratelimit-limit-tokens":       "-1",
				"x-ratelimit-remaining-tokens":   "n/a",
			},
			// -1 and "n/a" leave their fields zero.
			Want: llm.RateLimit{RequestsLimit: 500, Known: true},
		},
		Errors:     errorCases,
		ErrorTypes: errorTypes,
		Leak: providertest.LeakCase{
			File:    "echoes_key.json",
			Key:     "sk-proj-Zx9_Qw8-Er7Ty6Ui5Op4As3Df2Gh1Jk0",
			Secrets: []string{"sk-proj-****AAAA", "AAAA", "hunter2"},
			Message: "Incorrect API key provided",
		},
		BadRequests: badRequests,
		Mock:        "openai",
		SDK:         sdkHarness(),
		// OpenAI reports a failure after the stream began as a data line
		// holding an error body.
		Stream: &providertest.StreamCase{
			ErrorEvent: `data: {"error":{"message":"The server had an error while processing your request (key KEY_PLACEHOLDER). Sorry about that!","type":"server_error","param":null,"code":null}}` + "\n\n",
			Class:      llm.ClassTransient,
			Code:       "server_error",
		},
	})
}

// errorCases are OpenAI's and compatible hosts' error answers
// (testdata/errors).
var errorCases = []providertest.ErrorCase{
	{Name: "429 rate_limit_exceeded (RPM), retry-after-ms first", Status: 429, File: "rate_limit_requests.json",
		Header: map[string]string{"retry-after-ms": "120", "retry-after": "1"}, Limits: true,
		Class: llm.ClassRateLimited, Code: "rate_limit_exceeded", Message: "requests per min (RPM)", RetryAfter: 120 * time.Millisecond},
	{Name: "429 rate_limit_exceeded (TPM)", Status: 429, File: "rate_limit_tokens.json", Header: map[string]string{"retry-after": "2"}, Limits: true,
		Class: llm.ClassRateLimited, Code: "rate_limit_exceeded", Message: "tokens per min (TPM)", RetryAfter: 2 * time.Second},
	{Name: "429 insufficient_quota", Status: 429, File: "insufficient_quota.json", Limits: true,
		Class: llm.ClassQuota, Code: "insufficient_quota", Message: "exceeded your current quota"},
	{Name: "429 credit_balance_exhausted", Status: 429, File: "credit_balance_exhausted.json",
		Class: llm.ClassQuota, Code: "credit_balance_exhausted", Message: "no prepaid credits"},
	{Name: "429 slow_down", Status: 429, File: "slow_down_429.json",
		Class: llm.ClassRateLimited, Code: "slow_down", Message: "reduce your rate"},
	{Name: "503 slow_down", Status: 503, File: "slow_down_503.json",
		Class: llm.ClassOverloaded, Code: "slow_down", Message: "reduce your rate"},
	{Name: "503 server_is_overloaded", Status: 503, File: "server_is_overloaded.json", Header: map[string]string{"retry-after": "5"},
		Class: llm.ClassOverloaded, Code: "server_is_overloaded", Message: "overloaded", RetryAfter: 5 * time.Second},
	{Name: "503 engine overloaded message", Status: 503, File: "engine_overloaded.json",
		Class: llm.ClassOverloaded, Code: "server_error", Message: "currently overloaded"},
	{Name: "500 server_error", Status: 500, File: "server_error.json",
		Class: llm.ClassTransient, Code: "server_error", Message: "error while processing"},
	{Name: "401 invalid_api_key", Status: 401, File: "invalid_api_key.json",
		Class: llm.ClassAuth, Code: "invalid_api_key", Message: "Incorrect API key provided: [redacted]"},
	{Name: "401 missing key (invalid_request_error)", Status: 401, File: "missing_key.json",
		Class: llm.ClassAuth, Code: "invalid_request_error", Message: "didn't provide an API key"},
	{Name: "403 unsupported country", Status: 403, File: "unsupported_country.json",
		Class: llm.ClassAuth, Code: "unsupported_country_region_territory", Message: "not supported"},
	{Name: "400 context_length_exceeded", Status: 400, File: "context_length.json",
		Class: llm.ClassPermanent, Code: "context_length_exceeded", Message: "maximum context length"},
	{Name: "404 model_not_found", Status: 404, File: "model_not_found.json",
		Class: llm.ClassModelUnavailable, Code: "model_not_found", Message: "gpt-nope"},
	{Name: "compatible host: string error", Status: 503, File: "compat_string_error.json",
		Class: llm.ClassOverloaded, Message: "upstream overloaded"},
	{Name: "compatible host: numeric code, -1 ms, seconds fallback", Status: 429, File: "compat_numeric_code.json",
		Header: map[string]string{"retry-after-ms": "-1", "retry-after": "3"},
		Class:  llm.ClassRateLimited, Message: "Too many requests", RetryAfter: 3 * time.Second},
	{Name: "retry-after clamped to 10 min", Status: 429, File: "rate_limit_requests.json", Header: map[string]string{"retry-after-ms": "3600000"},
		Class: llm.ClassRateLimited, Code: "rate_limit_exceeded", RetryAfter: provider.MaxRetryAfter},
}

// TestClassifyTable: OpenAI's error codes and types are read before the
// status (a bodyless status is in the conformance suite).
func TestClassifyTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status             int
		errType, code, msg string
		want               llm.Class
	}{
		{429, "requests", "rate_limit_exceeded", "", llm.ClassRateLimited},
		{429, "insufficient_quota", "", "", llm.ClassQuota},
		{429, "insufficient_quota", "project_spend_limit_exceeded", "", llm.ClassQuota},
		{429, "", "organization_usage_limit_exceeded", "", llm.ClassQuota},
		{400, "", "rate_limit_exceeded", "", llm.ClassRateLimited},
		{401, "invalid_request_error", "", "", llm.ClassAuth},
		{400, "invalid_request_error", "invalid_api_key", "", llm.ClassAuth},
		{503, "", "", "Service Unavailable: back-end overloaded", llm.ClassOverloaded},
		{400, "", "", "model overloaded with options", llm.ClassPermanent},
		{503, "service_unavailable_error", "server_is_overloaded", "", llm.ClassOverloaded},
		{429, "rate_limit_error", "slow_down", "", llm.ClassRateLimited},
		{503, "", "slow_down", "", llm.ClassOverloaded},
		{400, "invalid_request_error", "context_length_exceeded", "", llm.ClassPermanent},
	}
	for _, tt := range tests {
		if got := Classify(tt.status, tt.errType, tt.code, tt.msg); got != tt.want {
			t.Errorf("Classify(%d, %q, %q, %q) = %s, want %s", tt.status, tt.errType, tt.code, tt.msg, got, tt.want)
		}
	}
}
