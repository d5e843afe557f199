package mockprovider

// These tests drive the mock with the official SDKs Bulwark's adapters are
// built on, so a shape the real clients cannot parse fails here.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

func anthropicClient(b *bundle, key string) anthropic.Client {
	return anthropic.NewClient(aoption.WithAPIKey(key), aoption.WithBaseURL(b.url),
		aoption.WithMaxRetries(0), aoption.WithHTTPClient(b.client))
}

func openAIClient(b *bundle, key string) openai.Client {
	return openai.NewClient(ooption.WithAPIKey(key), ooption.WithBaseURL(b.url+"/v1"),
		ooption.WithMaxRetries(0), ooption.WithHTTPClient(b.client))
}

func TestAnthropicSDK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// 180 RPM over the default 1 s window: 3 calls at once, then one
	// every 1/3 s.
	b := setup(t, Config{DefaultLimits: Limits{RPM: 180, TPM: 100000}})
	c := anthropicClient(b, "sk-ant-sdk")
	prompt := "check fetch_logs for car 17"
	params := anthropic.MessageNewParams{
		Model:     "claude-sonnet-test",
		MaxTokens: 200,
		System:    []anthropic.TextBlockParam{{Text: "diagnose"}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))},
		Tools: []anthropic.ToolUnionParam{
			anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{Properties: map[string]any{"query": map[string]any{"type": "string"}}}, "fetch_logs"),
		},
	}
	msg, err := c.Messages.New(ctx, params)
	if err != nil {
		t.Fatalf("tool round: %v", err)
	}
	if msg.StopReason != anthropic.StopReasonToolUse || len(msg.Content) != 1 || msg.Content[0].Type != "tool_use" || msg.Content[0].Name != "fetch_logs" {
		t.Fatalf("tool round answer = %+v", msg)
	}
	use := msg.Content[0]
	var in map[string]string
	if err := json.Unmarshal(use.Input, &in); err != nil || in["query"] != prompt {
		t.Errorf("tool input = %s (%v)", use.Input, err)
	}

	params.Messages = append(params.Messages,
		anthropic.NewAssistantMessage(anthropic.NewToolUseBlock(use.ID, json.RawMessage(use.Input), use.Name)),
		anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, "3 errors found", false)))
	msg, err = c.Messages.New(ctx, params)
	if err != nil {
		t.Fatalf("result round: %v", err)
	}
	if msg.StopReason != anthropic.StopReasonEndTurn || msg.Content[0].Text != "tool results: 3 errors found" || msg.Usage.OutputTokens == 0 {
		t.Errorf("result round answer = %+v", msg)
	}

	// Third request uses the last slot of the window; the fourth is a 429
	// the SDK surfaces with its type.
	if _, err := c.Messages.New(ctx, params); err != nil {
		t.Fatal(err)
	}
	_, err = c.Messages.New(ctx, params)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Type() != "rate_limit_error" ||
		apiErr.Response.Header.Get("retry-after") != "1" || apiErr.RequestID == "" {
		t.Errorf("rate limited: err = %v", err)
	}

	// A spend cap: same status and type, told apart by its error code.
	if err := b.srv.SetFault(Fault{Mode: FaultSpendLimit, Count: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Messages.New(ctx, params)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Type() != "rate_limit_error" || apiErr.ErrorCode() != "enforced_spend_limit_reached" {
		t.Errorf("spend limit: err = %v", err)
	}
	if err := b.srv.SetFault(Fault{Mode: FaultOverloaded, Count: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Messages.New(ctx, params)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 529 || apiErr.Type() != "overloaded_error" {
		t.Errorf("overloaded: err = %v", err)
	}
}

func TestOpenAISDK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 600, TPM: 100000}}) // 10 calls a 1 s window
	c := openAIClient(b, "sk-openai-sdk")
	prompt := "run fetch_logs and search_kb"
	params := openai.ChatCompletionNewParams{
		Model:     "gpt-test",
		MaxTokens: openai.Int(200),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("diagnose"), openai.UserMessage(prompt)},
		Tools: []openai.ChatCompletionToolUnionParam{
			openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "fetch_logs"}),
			openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "search_kb"}),
		},
	}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("tool round: %v", err)
	}
	calls := resp.Choices[0].Message.ToolCalls
	if resp.Choices[0].FinishReason != "tool_calls" || len(calls) != 2 || calls[0].Function.Name != "fetch_logs" || calls[1].ID != "call_2" {
		t.Fatalf("tool round answer = %s", resp.RawJSON())
	}

	params.Messages = append(params.Messages, resp.Choices[0].Message.ToParam(),
		openai.ToolMessage("log ok", calls[0].ID), openai.ToolMessage("kb ok", calls[1].ID))
	resp, err = c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("result round: %v", err)
	}
	if resp.Choices[0].Message.Content != "tool results: log ok; kb ok" || resp.Usage.TotalTokens != resp.Usage.PromptTokens+resp.Usage.CompletionTokens {
		t.Errorf("result round answer = %s", resp.RawJSON())
	}

	emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: "text-embedding-3-small",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a b", "c d"}},
	})
	if err != nil || len(emb.Data) != 2 || len(emb.Data[1].Embedding) != EmbeddingDimsDefault {
		t.Fatalf("embeddings: %v", err)
	}

	if err := b.srv.SetFault(Fault{Provider: "openai", Mode: FaultInsufficientQuota, Count: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Chat.Completions.New(ctx, params)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Code != "insufficient_quota" || apiErr.Type != "insufficient_quota" {
		t.Errorf("quota: err = %v", err)
	}
	if err := b.srv.SetFault(Fault{Provider: "openai", Mode: FaultRateLimit, Count: 1, RetryAfter: 1500 * 1e6}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Chat.Completions.New(ctx, params)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Code != "rate_limit_exceeded" || apiErr.Response.Header.Get("retry-after-ms") != "1500" {
		t.Errorf("rate limited: err = %v", err)
	}
}
