package azure

import (
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/testkit/providertest"
)

// created is the fixed timestamp of golden responses and streams.
const created = "1767225600"

// createdField matches the created timestamp openai's encoders stamp with
// the clock, which the golden files fix.
var createdField = regexp.MustCompile(`"created":\d+`)

func fixCreated(b []byte) []byte {
	return createdField.ReplaceAll(b, []byte(`"created":`+created))
}

// fixedWriter fixes the created timestamps of what passes through it.
type fixedWriter struct{ w io.Writer }

func (f fixedWriter) Write(p []byte) (int, error) {
	if _, err := f.w.Write(fixCreated(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// TestConformance holds the adapter to what every provider adapter must
// do; the rest of this package's tests cover what only Azure does. Azure
// speaks OpenAI's wire format: the Wire is openai's, and the golden files
// are openai's (but for the stream, which names this harness's model).
func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, providertest.Harness{
		Provider:             ProviderDefault,
		ConfigName:           "azure",
		KeepsAdmissionCharge: true,
		Constructor: providertest.ConstructorOf(func(c providertest.Config) Config {
			return Config{BaseURL: c.BaseURL, Timeout: c.Timeout}
		}, New),
		// The client cases send model "test-model": with no deployment of
		// the key's own, that is the deployment.
		Path: "/openai/deployments/test-model/chat/completions",
		KeyHeaders: func(key string) http.Header {
			return http.Header{"Api-Key": {key}}
		},
		Model: "test-model",
		Wire: providertest.Wire{
			EncodeRequest: openai.EncodeRequest,
			DecodeRequest: providertest.DecodeWith(openai.DecodeRequest, func(i *openai.RequestInfo) providertest.Info {
				return providertest.Info{Model: i.Model, Stream: i.Stream, IncludeUsage: i.IncludeUsage, Ignored: i.Ignored}
			}),
			EncodeResponse: func(resp *llm.Response, model string) ([]byte, error) {
				b, err := openai.EncodeResponse(resp, model)
				return fixCreated(b), err
			},
			DecodeResponse: openai.DecodeResponse,
			WriteStream: func(w io.Writer, resp *llm.Response, info providertest.Info) error {
				return openai.WriteStream(fixedWriter{w}, resp, info.Model, openai.WithUsage(info.IncludeUsage))
			},
			EncodeError: openai.EncodeError,
		},
		// Standard deployments send the remaining counts; newer ones the
		// limits and resets (in seconds) too.
		RateLimit: providertest.RateLimitCase{
			Header: map[string]string{
				"x-ratelimit-remaining-requests": "19",
				"x-ratelimit-remaining-tokens":   "19913",
				"x-ratelimit-limit-tokens":       "20000",
				"x-ratelimit-reset-tokens":       "55",
			},
			Want:          llm.RateLimit{RequestsRemaining: 19, TokensLimit: 20000, TokensRemaining: 19913, Known: true},
			TokensResetIn: 55 * time.Second,
		},
		ErrorRateLimit: providertest.RateLimitCase{
			Header: map[string]string{
				"x-ratelimit-remaining-requests": "0",
				"x-ratelimit-remaining-tokens":   "1200",
				"x-ratelimit-limit-tokens":       "-1",
				"x-ratelimit-reset-tokens":       "n/a",
			},
			// 0, -1 and "n/a" leave their fields zero.
			Want: llm.RateLimit{TokensRemaining: 1200, Known: true},
		},
		Errors:     errorCases,
		ErrorTypes: errorTypes,
		Leak: providertest.LeakCase{
			File:    "echoes_key.json",
			Key:     "9c2b6f0e4a1d4b7c8e3f5a6b7c8d9e0f",
			Secrets: []string{"hunter2", "6f1e2d3c-4b5a-4978-8a9b-0c1d2e3f4a5b"},
			Message: "Access denied due to invalid subscription key",
		},
		// The mock's Azure endpoint is of the OpenAI family: its faults
		// are OpenAI's.
		Mock: "azure",
		SDK:  sdkHarness(),
		// Azure streams OpenAI's chunks, errors included; its own table
		// classifies them.
		Stream: &providertest.StreamCase{
			ErrorEvent: `data: {"error":{"code":"server_error","message":"The server had an error while processing your request (api-key KEY_PLACEHOLDER)."}}` + "\n\n",
			Class:      llm.ClassTransient,
			Code:       "server_error",
		},
	})
}

// errorTypes is the error type openai.EncodeError writes for each status.
var errorTypes = map[int]string{
	400: "invalid_request_error",
	401: "authentication_error",
	403: "permission_error",
	429: "rate_limit_error",
	500: "server_error",
	503: "service_unavailable_error",
}

// errorCases are Azure OpenAI's error answers (testdata/errors).
var errorCases = []providertest.ErrorCase{
	{Name: "429 call rate limit, retry-after-ms first", Status: 429, File: "rate_limit_calls.json",
		Header: map[string]string{"retry-after-ms": "1500", "retry-after": "2"}, Limits: true,
		Class: llm.ClassRateLimited, Message: "exceeded call rate limit", RetryAfter: 1500 * time.Millisecond},
	{Name: "429 token rate limit, retry-after", Status: 429, File: "rate_limit_tokens.json", Header: map[string]string{"retry-after": "5"},
		Class: llm.ClassRateLimited, Message: "exceeded token rate limit", RetryAfter: 5 * time.Second},
	{Name: "429 without retry headers: the message's wait", Status: 429, File: "rate_limit_new_wording.json",
		Class: llm.ClassRateLimited, Message: "Please retry after 45 seconds", RetryAfter: 45 * time.Second},
	{Name: "429 without any wait", Status: 429, File: "rate_limit_no_wait.json", Class: llm.ClassRateLimited},
	{Name: "429 high demand", Status: 429, File: "high_demand.json",
		Class: llm.ClassRateLimited, Message: "experiencing high demand", RetryAfter: 20 * time.Second},
	{Name: "429 of a provisioned deployment (utilization header)", Status: 429, File: "ptu_capacity.json",
		Header: map[string]string{"retry-after-ms": "730", "retry-after": "1", UtilizationHeader: "100.4%"},
		Class:  llm.ClassRateLimited, Code: CodeCapacityFull, RetryAfter: 730 * time.Millisecond},
	{Name: "429 standard body with the utilization header", Status: 429, File: "rate_limit_calls.json",
		Header: map[string]string{UtilizationHeader: "101.0%"},
		Class:  llm.ClassRateLimited, Code: CodeCapacityFull, RetryAfter: 2 * time.Second},
	{Name: "400 content_filter", Status: 400, File: "content_filter.json",
		Class: llm.ClassPermanent, Code: "content_filter", Message: "content management policy"},
	{Name: "404 DeploymentNotFound", Status: 404, File: "deployment_not_found.json",
		Class: llm.ClassModelUnavailable, Code: "DeploymentNotFound", Message: "deployment for this resource does not exist"},
	{Name: "400 OperationNotSupported", Status: 400, File: "operation_not_supported.json",
		Class: llm.ClassModelUnavailable, Code: "OperationNotSupported", Message: "does not work with the specified model"},
	{Name: "401 invalid subscription key", Status: 401, File: "invalid_key.json",
		Class: llm.ClassAuth, Message: "Access denied due to invalid subscription key"},
	{Name: "401 expired token with api-key auth", Status: 401, File: "token_expired.json",
		Class: llm.ClassAuth, Message: "expired"},
	{Name: "403 PermissionDenied (RBAC)", Status: 403, File: "permission_denied.json",
		Class: llm.ClassAuth, Code: "PermissionDenied", Message: "The principal `[redacted]` lacks the required data action"},
	{Name: "400 MissingApiVersionParameter", Status: 400, File: "missing_api_version.json",
		Class: llm.ClassPermanent, Code: "MissingApiVersionParameter", Message: "api-version"},
	{Name: "404 Resource not found", Status: 404, File: "resource_not_found.json",
		Class: llm.ClassPermanent, Message: "Resource not found"},
	{Name: "400 context_length_exceeded", Status: 400, File: "context_length.json",
		Class: llm.ClassPermanent, Code: "context_length_exceeded", Message: "maximum context length"},
	{Name: "500 server_error", Status: 500, File: "server_error.json",
		Class: llm.ClassTransient, Code: "server_error", Message: "error while processing"},
	{Name: "503 service unavailable", Status: 503, File: "service_unavailable.json",
		Class: llm.ClassTransient, Message: "temporarily unable"},
	{Name: "503 model overloaded", Status: 503, File: "model_overloaded.json", Header: map[string]string{"retry-after": "3"},
		Class: llm.ClassOverloaded, Code: "server_error", Message: "currently overloaded", RetryAfter: 3 * time.Second},
	{Name: "retry-after-ms clamped", Status: 429, File: "rate_limit_calls.json", Header: map[string]string{"retry-after-ms": "3600000"},
		Class: llm.ClassRateLimited, RetryAfter: provider.MaxRetryAfter},
	{Name: "the message's wait clamped", Status: 429, File: "rate_limit_a_day.json",
		Class: llm.ClassRateLimited, RetryAfter: provider.MaxRetryAfter},
}
