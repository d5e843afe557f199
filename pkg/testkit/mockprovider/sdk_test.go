package mockprovider

// These tests drive the mock with the official SDKs Bulwark's adapters are
// built on, so a shape the real clients cannot parse fails here.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/google/go-cmp/cmp"
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

// The streams accumulated by the SDKs' own helpers must equal the
// non-streamed answers, and a mid-stream error must surface as the SDKs'
// error.

func TestAnthropicSDKStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{StreamChunkInterval: -1})
	c := anthropicClient(b, "sk-ant-sdk")
	text := anthropic.MessageNewParams{
		Model:     "claude-sonnet-test",
		MaxTokens: 200,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(streamPrompt))},
	}
	tools := text
	tools.Messages = []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("run fetch_logs and search_kb"))}
	for _, name := range []string{"fetch_logs", "search_kb"} {
		tools.Tools = append(tools.Tools, anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{}, name))
	}
	// What an adapter reads of a Message.
	summary := func(m anthropic.Message) []any {
		s := []any{m.Model, m.Role, m.StopReason, m.StopSequence, m.Usage.InputTokens, m.Usage.OutputTokens}
		for _, b := range m.Content {
			s = append(s, b.Type, b.Text, b.ID, b.Name, string(b.Input))
		}
		return s
	}
	for name, params := range map[string]anthropic.MessageNewParams{"text": text, "tool calls": tools} {
		want, err := c.Messages.New(ctx, params)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		stream := c.Messages.NewStreaming(ctx, params)
		defer stream.Close()
		var got anthropic.Message
		events := 0
		for stream.Next() {
			if err := got.Accumulate(stream.Current()); err != nil {
				t.Fatalf("%s: accumulating: %v", name, err)
			}
			events++
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("%s: stream: %v", name, err)
		}
		if diff := cmp.Diff(summary(*want), summary(got)); diff != "" || events < 8 {
			t.Errorf("%s: %d events; accumulated (-non-streamed +streamed):\n%s", name, events, diff)
		}
	}

	if err := b.srv.SetFault(Fault{Mode: FaultStreamError, Count: 1, AfterChunks: 2}); err != nil {
		t.Fatal(err)
	}
	// The SDK stops at the error event without closing the body.
	stream := c.Messages.NewStreaming(ctx, text)
	defer stream.Close()
	for stream.Next() {
	}
	var apiErr *anthropic.Error
	if err := stream.Err(); !errors.As(err, &apiErr) || apiErr.Type() != "overloaded_error" || apiErr.RequestID == "" {
		t.Errorf("mid-stream error: err = %v", err)
	}
}

func TestOpenAISDKStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{StreamChunkInterval: -1})
	c := openAIClient(b, "sk-openai-sdk")
	text := openai.ChatCompletionNewParams{
		Model:         "gpt-test",
		MaxTokens:     openai.Int(200),
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(streamPrompt)},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	tools := text
	tools.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage("run fetch_logs and search_kb")}
	tools.Tools = []openai.ChatCompletionToolUnionParam{
		openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "fetch_logs"}),
		openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "search_kb"}),
	}
	// What an adapter reads of a completion.
	summary := func(cc openai.ChatCompletion) []any {
		ch := cc.Choices[0]
		s := []any{cc.Model, ch.Message.Content, ch.FinishReason, cc.Usage.PromptTokens, cc.Usage.CompletionTokens, cc.Usage.TotalTokens}
		for _, tc := range ch.Message.ToolCalls {
			s = append(s, tc.ID, tc.Function.Name, tc.Function.Arguments)
		}
		return s
	}
	for name, params := range map[string]openai.ChatCompletionNewParams{"text": text, "tool calls": tools} {
		nonStreamed := params
		nonStreamed.StreamOptions = openai.ChatCompletionStreamOptionsParam{} // only allowed with stream
		want, err := c.Chat.Completions.New(ctx, nonStreamed)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		stream := c.Chat.Completions.NewStreaming(ctx, params)
		defer stream.Close()
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			if !acc.AddChunk(stream.Current()) {
				t.Fatalf("%s: chunk %d refused by the accumulator: %s", name, chunks, stream.Current().RawJSON())
			}
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("%s: stream: %v", name, err)
		}
		if diff := cmp.Diff(summary(*want), summary(acc.ChatCompletion)); diff != "" || chunks < 4 {
			t.Errorf("%s: %d chunks; accumulated (-non-streamed +streamed):\n%s", name, chunks, diff)
		}
	}

	if err := b.srv.SetFault(Fault{Mode: FaultStreamError, Count: 1, AfterChunks: 2}); err != nil {
		t.Fatal(err)
	}
	stream := c.Chat.Completions.NewStreaming(ctx, text)
	defer stream.Close()
	for stream.Next() {
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "server_error") {
		t.Errorf("mid-stream error: err = %v", err)
	}
}
