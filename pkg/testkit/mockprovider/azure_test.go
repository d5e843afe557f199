package mockprovider

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	oazure "github.com/openai/openai-go/v3/azure"
	ooption "github.com/openai/openai-go/v3/option"
)

const azureVersion = "2024-10-21"

func azurePath(deployment string) string {
	return "/openai/deployments/" + deployment + "/chat/completions?api-version=" + azureVersion
}

func (b *bundle) azure(t *testing.T, deployment, key string, body any) reply {
	t.Helper()
	var h map[string]string
	if key != "" {
		h = map[string]string{"api-key": key}
	}
	return b.do(t, http.MethodPost, azurePath(deployment), h, body)
}

type azureErrorReply struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func TestAzureChat(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 600, TPM: 60000}})
	prompt := "Why did the OTA update fail on car 17?"
	r := b.azure(t, "gpt4o", "azure-key-1", chatText(prompt, 100))
	wantStatus(t, r, http.StatusOK)
	var got chatReply
	r.decode(t, &got)
	text := Reply(prompt)
	in, out := CountTokens(prompt), CountTokens(text)
	if len(got.Choices) != 1 || deref(got.Choices[0].Message.Content) != text || got.Model != "gpt-test" ||
		got.Usage["prompt_tokens"] != in || got.Usage["completion_tokens"] != out {
		t.Fatalf("answer %s", r.body)
	}
	want := map[string]string{
		"x-ratelimit-limit-requests":     "600",
		"x-ratelimit-remaining-requests": "599",
		"x-ratelimit-reset-requests":     "1", // 100 ms, in whole seconds
		"x-ratelimit-limit-tokens":       "60000",
		"x-ratelimit-remaining-tokens":   itoa(60000 - in - 100), // prompt + max_tokens, no refund
		"x-ratelimit-reset-tokens":       "1",
		azureUtilizationHeader:           "",
		"x-request-id":                   "",
	}
	for name, w := range want {
		if g := r.header.Get(name); g != w {
			t.Errorf("header %s = %q, want %q", name, g, w)
		}
	}
	if id := r.header.Get("apim-request-id"); !strings.HasPrefix(id, "req_") {
		t.Errorf("apim-request-id = %q", id)
	}

	// The body's model is optional: the deployment answers.
	r = b.azure(t, "gpt4o", "azure-key-1", map[string]any{"max_tokens": 10, "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	wantStatus(t, r, http.StatusOK)
	r.decode(t, &got)
	if got.Model != "gpt4o" {
		t.Errorf("model %q, want the deployment", got.Model)
	}
}

func TestAzureRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for _, tt := range []struct {
		name   string
		path   string
		header map[string]string
		status int
		code   string
		msg    string
	}{
		{"no api-version", "/openai/deployments/d/chat/completions", map[string]string{"api-key": "k"},
			400, "MissingApiVersionParameter", "The api-version query parameter (?api-version=) is required for all requests."},
		{"no key", azurePath("d"), nil, 401, "401", "Access denied due to missing subscription key"},
		{"an empty api-key", azurePath("d"), map[string]string{"api-key": " "}, 401, "401", "Access denied"},
	} {
		r := b.do(t, http.MethodPost, tt.path, tt.header, chatText("hi", 10))
		var e azureErrorReply
		r.decode(t, &e)
		if r.status != tt.status || e.Error.Code != tt.code || !strings.Contains(e.Error.Message, tt.msg) {
			t.Errorf("%s: %d %s", tt.name, r.status, r.body)
		}
	}
	// The model's own errors keep OpenAI's shape.
	r := b.azure(t, "d", "k", map[string]any{"messages": []any{}})
	wantStatus(t, r, http.StatusBadRequest)
	if m := r.json(t); m["error"].(map[string]any)["type"] != "invalid_request_error" {
		t.Errorf("invalid request: %s", r.body)
	}
}

// A key's buckets are per deployment; the api-key and a bearer token are
// both keys.
func TestAzureMetering(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 60}})
	wantStatus(t, b.azure(t, "east", "k1", chatText("a", 10)), http.StatusOK)
	r := b.azure(t, "east", "k1", chatText("a", 10))
	wantStatus(t, r, http.StatusTooManyRequests)
	var e azureErrorReply
	r.decode(t, &e)
	wantMsg := "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded call rate limit " +
		"of your current OpenAI S0 pricing tier. Please retry after 1 second. " + azureQuotaLink
	if d := cmp.Diff([]string{"429", wantMsg, "1", "1000", "60", "59"}, []string{e.Error.Code, e.Error.Message,
		r.header.Get("retry-after"), r.header.Get("retry-after-ms"),
		r.header.Get("x-ratelimit-limit-requests"), r.header.Get("x-ratelimit-remaining-requests")}); d != "" {
		t.Errorf("429 (-want +got):\n%s", d)
	}
	wantStatus(t, b.azure(t, "west", "k1", chatText("a", 10)), http.StatusOK)
	wantStatus(t, b.azure(t, "east", "k2", chatText("a", 10)), http.StatusOK)
	r = b.do(t, http.MethodPost, azurePath("east"), map[string]string{"Authorization": "Bearer entra-token"}, chatText("a", 10))
	wantStatus(t, r, http.StatusOK)
	r = b.do(t, http.MethodPost, azurePath("east"), map[string]string{"Authorization": "Bearer entra-token"}, chatText("a", 10))
	wantStatus(t, r, http.StatusTooManyRequests)

	// The token bucket refuses in its own words.
	b = setup(t, Config{DefaultLimits: Limits{TPM: 600}})
	wantStatus(t, b.azure(t, "east", "k1", chatText("a", 8)), http.StatusOK)
	r = b.azure(t, "east", "k1", chatText("a", 8))
	r.decode(t, &e)
	if r.status != http.StatusTooManyRequests || !strings.Contains(e.Error.Message, "exceeded token rate limit") {
		t.Errorf("token 429: %d %s", r.status, r.body)
	}
	// More than the TPM itself: no wait helps, so no retry headers.
	r = b.azure(t, "east", "k3", chatText("a", 700))
	r.decode(t, &e)
	if r.status != http.StatusTooManyRequests || r.header.Get("retry-after") != "" || !strings.Contains(e.Error.Message, "more than the limit of 600 tokens") {
		t.Errorf("too large: %d %v %s", r.status, r.header, r.body)
	}
}

func TestAzurePTU(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 60}, AzurePTUDeployments: []string{"gpt4o-ptu"}})
	r := b.azure(t, "gpt4o-ptu", "k1", chatText("a", 10))
	wantStatus(t, r, http.StatusOK)
	if u := r.header.Get(azureUtilizationHeader); u != "1.7%" || r.header.Get("x-ratelimit-remaining-requests") != "" {
		t.Errorf("PTU headers %v, want utilization 1.7%% and no x-ratelimit headers", r.header)
	}
	r = b.azure(t, "gpt4o-ptu", "k1", chatText("a", 10))
	wantStatus(t, r, http.StatusTooManyRequests)
	var e azureErrorReply
	r.decode(t, &e)
	if d := cmp.Diff([]string{"429", "1", "1000", "100.0%"}, []string{e.Error.Code,
		r.header.Get("retry-after"), r.header.Get("retry-after-ms"), r.header.Get(azureUtilizationHeader)}); d != "" {
		t.Errorf("PTU 429 (-want +got):\n%s", d)
	}
	if !strings.Contains(e.Error.Message, "provisioned throughput of deployment 'gpt4o-ptu'") || strings.Contains(e.Error.Message, "pricing tier") {
		t.Errorf("PTU 429 message %q", e.Error.Message)
	}
	// Another deployment of the same key is standard.
	r = b.azure(t, "gpt4o", "k1", chatText("a", 10))
	if r.status != http.StatusOK || r.header.Get(azureUtilizationHeader) != "" || r.header.Get("x-ratelimit-remaining-requests") != "59" {
		t.Errorf("standard deployment: %d %v", r.status, r.header)
	}
}

// Azure's faults and stats are its own: an OpenAI fault leaves it
// answering, an Azure fault fails it, and its calls count under azure.
func TestAzureFaultsAndStats(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.srv.SetFault(Fault{Provider: "openai", Mode: FaultOverloaded, Count: 1}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, b.azure(t, "d", "k1", chatText("a", 10)), http.StatusOK)
	if err := b.srv.SetFault(Fault{Provider: "azure", Mode: FaultOverloaded, Count: 1}); err != nil {
		t.Fatal(err)
	}
	r := b.azure(t, "d", "k1", chatText("a", 10))
	wantStatus(t, r, http.StatusServiceUnavailable)
	if m := r.json(t); !strings.Contains(m["error"].(map[string]any)["message"].(string), "That model is currently overloaded") {
		t.Errorf("overloaded: %s", r.body)
	}
	if err := b.srv.SetFault(Fault{Provider: "azure", Mode: FaultRateLimit, Count: 1, Message: "slow down, key k1"}); err != nil {
		t.Fatal(err)
	}
	r = b.azure(t, "d", "k1", chatText("a", 10))
	var e azureErrorReply
	r.decode(t, &e)
	if r.status != http.StatusTooManyRequests || e.Error.Message != "slow down, key k1" || r.header.Get("retry-after-ms") != "1000" {
		t.Errorf("rate-limit fault: %d %v %s", r.status, r.header, r.body)
	}
	wantStatus(t, b.azure(t, "d", "k1", chatText("a", 10)), http.StatusOK)
	st := b.srv.Stats().Providers["azure"]
	if st.Requests != 4 || st.OK != 2 || st.Injected[FaultOverloaded] != 1 || st.Injected[FaultRateLimit] != 1 {
		t.Errorf("azure stats %+v", st)
	}
}

// fakeCredential is an azcore.TokenCredential with a fixed token.
type fakeCredential struct{ token string }

func (c fakeCredential) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: c.token}, nil
}

// The official SDK's Azure options (api-key and Entra ID) against the mock.
func TestAzureSDK(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: map[string]Limits{"entra-token-sdk": {RPM: 60}}})
	params := openai.ChatCompletionNewParams{
		Model:    "gpt4o", // the deployment
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Explain P0A80.")},
	}
	for _, auth := range []ooption.RequestOption{
		oazure.WithAPIKey("azure-key-sdk"),
		oazure.WithTokenCredential(fakeCredential{"entra-token-sdk"}),
	} {
		c := openai.NewClient(oazure.WithEndpoint(b.url, azureVersion), auth, oazure.WithUnsafeAllowHTTP(), ooption.WithMaxRetries(0))
		got, err := c.Chat.Completions.New(t.Context(), params)
		if err != nil {
			t.Fatal(err)
		}
		if got.Model != "gpt4o" || len(got.Choices) != 1 || got.Choices[0].Message.Content != Reply("Explain P0A80.") {
			t.Errorf("answer %+v", got)
		}
	}
	// The bearer token is the key the mock meters: its second call is over
	// its 60 RPM.
	c := openai.NewClient(oazure.WithEndpoint(b.url, azureVersion), oazure.WithTokenCredential(fakeCredential{"entra-token-sdk"}),
		oazure.WithUnsafeAllowHTTP(), ooption.WithMaxRetries(0))
	_, err := c.Chat.Completions.New(t.Context(), params)
	var e *openai.Error
	if !errors.As(err, &e) || e.StatusCode != http.StatusTooManyRequests || e.Code != "429" || e.Response.Header.Get("retry-after-ms") != "1000" {
		t.Fatalf("error %v, want the SDK's 429", err)
	}
	if got := b.srv.Stats().Keys[Fingerprint("entra-token-sdk")]; got.OK != 1 || got.RateLimited != 1 {
		t.Errorf("the token's counters %+v", got)
	}
}
