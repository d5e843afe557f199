package anthropic

import (
	"io"
	"net/http"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/testkit/providertest"
)

// TestConformance holds the adapter to what every provider adapter must
// do; the rest of this package's tests cover what only Anthropic does.
func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, providertest.Harness{
		Provider:   llm.ProviderClaude,
		ConfigName: "anthropic",
		Constructor: providertest.ConstructorOf(func(c providertest.Config) Config {
			return Config{BaseURL: c.BaseURL, Timeout: c.Timeout}
		}, New),
		Path: "/v1/messages",
		KeyHeaders: func(key string) http.Header {
			return http.Header{"X-Api-Key": {key}, "Anthropic-Version": {VersionDefault}}
		},
		Model: "claude-sonnet-4-5",
		Wire: providertest.Wire{
			EncodeRequest: EncodeRequest,
			DecodeRequest: providertest.DecodeWith(DecodeRequest, func(i *RequestInfo) providertest.Info {
				return providertest.Info{Model: i.Model, Stream: i.Stream, Ignored: i.Ignored}
			}),
			EncodeResponse: EncodeResponse,
			DecodeResponse: DecodeResponse,
			WriteStream: func(w io.Writer, resp *llm.Response, info providertest.Info) error {
				return WriteStream(w, resp, info.Model)
			},
			EncodeError: EncodeError,
		},
		RateLimit: providertest.RateLimitCase{
			Header: map[string]string{
				"anthropic-ratelimit-requests-limit":         "50",
				"anthropic-ratelimit-requests-remaining":     "49",
				"anthropic-ratelimit-requests-reset":         "2026-05-01T12:00:01Z",
				"anthropic-ratelimit-tokens-limit":           "90000",
				"anthropic-ratelimit-tokens-remaining":       "80000",
				"anthropic-ratelimit-tokens-reset":           "2026-05-01T12:00:02Z",
				"anthropic-ratelimit-input-tokens-limit":     "40000",
				"anthropic-ratelimit-input-tokens-remaining": "5000",
				"anthropic-ratelimit-input-tokens-reset":     "2026-05-01T12:00:03.5Z",
				"anthropic-ratelimit-output-tokens-limit":    "8000",
			},
			Want: llm.RateLimit{
				RequestsLimit: 50, RequestsRemaining: 49, RequestsReset: time.Date(2026, 5, 1, 12, 0, 1, 0, time.UTC),
				// input-tokens is tighter than tokens here, so it wins.
				TokensLimit: 40000, TokensRemaining: 5000, TokensReset: time.Date(2026, 5, 1, 12, 0, 3, 5e8, time.UTC),
				// The input and output triples are also kept apart, for a
				// key with ITPM and OTPM buckets.
				InputTokensLimit: 40000, InputTokensRemaining: 5000,
				InputTokensReset:  time.Date(2026, 5, 1, 12, 0, 3, 5e8, time.UTC),
				OutputTokensLimit: 8000,
				Known:             true,
			},
		},
		ErrorRateLimit: providertest.RateLimitCase{
			Header: map[string]string{
				"anthropic-ratelimit-requests-limit":     "50",
				"anthropic-ratelimit-requests-remaining": "0",
				"anthropic-ratelimit-requests-reset":     "2026-05-01T12:00:30Z",
				"anthropic-ratelimit-tokens-limit":       "-1",
				"anthropic-ratelimit-tokens-remaining":   "lots",
			},
			// -1 and "lots" leave the token fields zero; the request fields
			// parse.
			Want: llm.RateLimit{RequestsLimit: 50, RequestsReset: time.Date(2026, 5, 1, 12, 0, 30, 0, time.UTC), Known: true},
		},
		Errors:     errorCases,
		ErrorTypes: errorTypes,
		Leak: providertest.LeakCase{
			File:    "echoes_key.json",
			Key:     "sk-ant-api03-Zx9_Qw8-Er7Ty6Ui5Op4As3Df2Gh1Jk0",
			Secrets: []string{"sk-ant-api03-AAAA", "hunter2"},
			Message: "invalid x-api-key",
		},
		BadRequests: badRequests,
		Mock:        "claude",
		SDK:         sdkHarness(),
		// "Streaming Messages", "Error events": an overloaded_error may
		// come mid-stream, where a non-streaming call would get a 529.
		Stream: &providertest.StreamCase{
			ErrorEvent: "event: error\n" + `data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded (key KEY_PLACEHOLDER)"}}` + "\n\n",
			Class:      llm.ClassOverloaded,
			Code:       "overloaded_error",
		},
	})
}

// errorCases are Anthropic's error answers (testdata/errors).
var errorCases = []providertest.ErrorCase{
	{Name: "429 rate_limit_error", Status: 429, File: "rate_limit.json", Header: map[string]string{"retry-after": "17"}, Limits: true,
		Class: llm.ClassRateLimited, Code: "rate_limit_error", Message: "would exceed the rate limit", RetryAfter: 17 * time.Second},
	{Name: "429 tier spend cap", Status: 429, File: "spend_cap_tier.json", Limits: true,
		Class: llm.ClassQuota, Code: "enforced_spend_limit_reached", Message: "monthly API usage threshold"},
	{Name: "400 spend limit set", Status: 400, File: "spend_limit_set.json",
		Class: llm.ClassQuota, Code: "invalid_request_error", Message: "specified API usage limits"},
	{Name: "400 credit balance", Status: 400, File: "credit_balance.json",
		Class: llm.ClassQuota, Code: "invalid_request_error", Message: "credit balance is too low"},
	{Name: "402 billing_error", Status: 402, File: "billing.json",
		Class: llm.ClassQuota, Code: "billing_error", Message: "billing"},
	{Name: "529 overloaded_error", Status: 529, File: "overloaded.json", Header: map[string]string{"retry-after": "3"},
		Class: llm.ClassOverloaded, Code: "overloaded_error", Message: "Overloaded", RetryAfter: 3 * time.Second},
	{Name: "overloaded_error under 500 still overloaded", Status: 500, File: "overloaded.json",
		Class: llm.ClassOverloaded, Code: "overloaded_error", Message: "Overloaded"},
	{Name: "401 authentication_error", Status: 401, File: "authentication.json",
		Class: llm.ClassAuth, Code: "authentication_error", Message: "invalid x-api-key"},
	{Name: "403 permission_error", Status: 403, File: "permission.json",
		Class: llm.ClassAuth, Code: "permission_error", Message: "permission"},
	{Name: "500 api_error", Status: 500, File: "api_error.json",
		Class: llm.ClassTransient, Code: "api_error", Message: "Internal server error"},
	{Name: "504 timeout_error", Status: 504, File: "timeout.json",
		Class: llm.ClassTransient, Code: "timeout_error", Message: "Request timeout"},
	{Name: "400 invalid_request_error", Status: 400, File: "invalid_request.json",
		Class: llm.ClassPermanent, Code: "invalid_request_error", Message: "max_tokens: 100000 > 64000"},
	{Name: "404 not_found_error", Status: 404, File: "not_found.json",
		Class: llm.ClassModelUnavailable, Code: "not_found_error", Message: "claude-nope-1"},
	{Name: "413 request_too_large", Status: 413, File: "request_too_large.json",
		Class: llm.ClassPermanent, Code: "request_too_large", Message: "maximum allowed number of bytes"},
	{Name: "502 HTML from a proxy", Status: 502, File: "bad_gateway.html", Header: map[string]string{"retry-after": "garbage"},
		Class: llm.ClassTransient, Message: "502 Bad Gateway"},
	{Name: "retry-after clamped to 10 min", Status: 429, File: "rate_limit.json", Header: map[string]string{"retry-after": "86400"},
		Class: llm.ClassRateLimited, Code: "rate_limit_error", RetryAfter: provider.MaxRetryAfter},
}

// TestParseRateLimitInputOutput: the input-tokens-* and output-tokens-*
// triples land in their own fields, whatever tokens-* says, so the key
// pool can lower a key's ITPM and OTPM buckets apart; a malformed value
// leaves only its own field zero.
func TestParseRateLimitInputOutput(t *testing.T) {
	t.Parallel()
	at := func(sec int) time.Time { return time.Date(2026, 5, 1, 12, 0, sec, 0, time.UTC) }
	tests := []struct {
		name   string
		header map[string]string
		want   llm.RateLimit
	}{
		{"all three token triples", map[string]string{
			"anthropic-ratelimit-tokens-limit":            "96000",
			"anthropic-ratelimit-tokens-remaining":        "90000",
			"anthropic-ratelimit-tokens-reset":            "2026-05-01T12:00:01Z",
			"anthropic-ratelimit-input-tokens-limit":      "80000",
			"anthropic-ratelimit-input-tokens-remaining":  "79000",
			"anthropic-ratelimit-input-tokens-reset":      "2026-05-01T12:00:02Z",
			"anthropic-ratelimit-output-tokens-limit":     "16000",
			"anthropic-ratelimit-output-tokens-remaining": "11000",
			"anthropic-ratelimit-output-tokens-reset":     "2026-05-01T12:00:20Z",
		}, llm.RateLimit{
			// input-tokens has fewer remaining than tokens: the combined
			// fields keep their old reading.
			TokensLimit: 80000, TokensRemaining: 79000, TokensReset: at(2),
			InputTokensLimit: 80000, InputTokensRemaining: 79000, InputTokensReset: at(2),
			OutputTokensLimit: 16000, OutputTokensRemaining: 11000, OutputTokensReset: at(20),
			Known: true,
		}},
		{"output alone", map[string]string{
			"anthropic-ratelimit-output-tokens-limit":     "16000",
			"anthropic-ratelimit-output-tokens-remaining": "0",
			"anthropic-ratelimit-output-tokens-reset":     "2026-05-01T12:00:30Z",
		}, llm.RateLimit{OutputTokensLimit: 16000, OutputTokensReset: at(30), Known: true}},
		{"malformed output values", map[string]string{
			"anthropic-ratelimit-input-tokens-limit":      "80000",
			"anthropic-ratelimit-output-tokens-limit":     "-1",
			"anthropic-ratelimit-output-tokens-remaining": "lots",
			"anthropic-ratelimit-output-tokens-reset":     "soon",
		}, llm.RateLimit{TokensLimit: 80000, InputTokensLimit: 80000, Known: true}},
		{"none", map[string]string{"content-type": "application/json"}, llm.RateLimit{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for k, v := range tt.header {
				h.Set(k, v)
			}
			if got := ParseRateLimit(h); got != tt.want {
				t.Errorf("ParseRateLimit =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

// TestClassifyTable: Anthropic's error types and codes are read before the
// status (a bodyless status is in the conformance suite).
func TestClassifyTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status             int
		errType, code, msg string
		body               string
		want               llm.Class
	}{
		{429, "rate_limit_error", "", "", "", llm.ClassRateLimited},
		{429, "rate_limit_error", "enforced_spend_limit_reached", "", "", llm.ClassQuota},
		{429, "", "", "", `{"weird":"enforced_spend_limit_reached"}`, llm.ClassQuota},
		{400, "rate_limit_error", "", "", "", llm.ClassRateLimited},
		{503, "overloaded_error", "", "", "", llm.ClassOverloaded},
		{400, "invalid_request_error", "", "prompt is too long", "", llm.ClassPermanent},
		{400, "invalid_request_error", "", "Your credit balance is too low", "", llm.ClassQuota},
	}
	for _, tt := range tests {
		if got := Classify(tt.status, tt.errType, tt.code, tt.msg, []byte(tt.body)); got != tt.want {
			t.Errorf("Classify(%d, %q, %q, %q) = %s, want %s", tt.status, tt.errType, tt.code, tt.msg, got, tt.want)
		}
	}
}
