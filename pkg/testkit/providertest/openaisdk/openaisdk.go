// Package openaisdk is the conformance suite's SDK harness for adapters of
// the OpenAI chat wire format (pkg/provider/openai, pkg/provider/azure): it
// drives the official OpenAI Go SDK, built however the adapter's users
// build it (plain base URL, Azure options), through
// providertest.SDKConversation. It is imported by tests only.
package openaisdk

import (
	"encoding/json"
	"errors"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/providertest"
)

// Config is what differs between the adapters sharing the harness.
type Config struct {
	// Model is what the SDK asks for: the model, or an Azure deployment.
	Model string
	// NewClient makes the SDK client for the compat endpoint at baseURL.
	NewClient func(baseURL string) sdk.Client
	// ToolErrorPrefix marks a failed tool result (openai.ToolErrorPrefix;
	// a parameter because package openai's own tests use this harness).
	ToolErrorPrefix string
	// StopReason maps a finish_reason (openai.StopReasonOf).
	StopReason func(finish string) llm.StopReason
}

// Harness returns the SDK cases' driver for cfg.
func Harness(cfg Config) *providertest.SDK {
	model, newClient := cfg.Model, cfg.NewClient
	fromSDK := func(c *sdk.ChatCompletion) *llm.Response { return fromSDK(c, cfg.StopReason) }
	return &providertest.SDK{
		ToolUseID: "call_1",
		Complete: func(t *testing.T, baseURL string) (*llm.Response, error) {
			params := params(model, cfg.ToolErrorPrefix)
			params.StreamOptions = sdk.ChatCompletionStreamOptionsParam{}
			c := newClient(baseURL)
			got, err := c.Chat.Completions.New(t.Context(), params)
			if err != nil {
				return nil, err
			}
			return fromSDK(got), nil
		},
		Stream: func(t *testing.T, baseURL string) (*llm.Response, int, error) {
			c := newClient(baseURL)
			stream := c.Chat.Completions.NewStreaming(t.Context(), params(model, cfg.ToolErrorPrefix))
			defer func() { _ = stream.Close() }()
			var acc sdk.ChatCompletionAccumulator
			chunks := 0
			for stream.Next() {
				chunks++
				if !acc.AddChunk(stream.Current()) {
					t.Fatalf("accumulator rejected chunk %d", chunks)
				}
			}
			return fromSDK(&acc.ChatCompletion), chunks, stream.Err()
		},
		MinEvents: 3,
		APIError: func(err error) (providertest.SDKError, bool) {
			var e *sdk.Error
			if !errors.As(err, &e) {
				return providertest.SDKError{}, false
			}
			return providertest.SDKError{Status: e.StatusCode, Type: e.Type, Code: e.Code, Message: e.Message, Header: e.Response.Header}, true
		},
	}
}

// params is providertest.SDKConversation as an SDK user would build it.
func params(model, toolErrorPrefix string) sdk.ChatCompletionNewParams {
	assistant := sdk.ChatCompletionAssistantMessageParam{ToolCalls: []sdk.ChatCompletionMessageToolCallUnionParam{{
		OfFunction: &sdk.ChatCompletionMessageFunctionToolCallParam{
			ID:       "call_1",
			Function: sdk.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "lookup_error_code", Arguments: `{"code":"P0A80"}`},
		},
	}}}
	return sdk.ChatCompletionNewParams{
		Model:               model,
		MaxCompletionTokens: sdk.Int(300),
		Messages: []sdk.ChatCompletionMessageParamUnion{
			sdk.SystemMessage("Be brief."),
			sdk.UserMessage("Explain P0A80."),
			{OfAssistant: &assistant},
			sdk.ToolMessage(toolErrorPrefix+"service down", "call_1"),
		},
		Tools: []sdk.ChatCompletionToolUnionParam{sdk.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "lookup_error_code",
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"code": map[string]any{"type": "string"}},
				"required": []string{"code"}},
		})},
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	}
}

// fromSDK converts the SDK's parsed completion back to the neutral model.
func fromSDK(c *sdk.ChatCompletion, stopReason func(string) llm.StopReason) *llm.Response {
	out := &llm.Response{ID: c.ID, Model: c.Model, Content: []llm.Block{},
		Usage: llm.Usage{InputTokens: int(c.Usage.PromptTokens), OutputTokens: int(c.Usage.CompletionTokens)}}
	if len(c.Choices) == 0 {
		return out
	}
	ch := c.Choices[0]
	out.StopReason = stopReason(ch.FinishReason)
	if ch.Message.Content != "" {
		out.Content = append(out.Content, llm.Block{Type: llm.BlockText, Text: ch.Message.Content})
	}
	for _, tc := range ch.Message.ToolCalls {
		out.Content = append(out.Content, llm.Block{Type: llm.BlockToolUse, ToolUseID: tc.ID, ToolName: tc.Function.Name, Input: json.RawMessage(tc.Function.Arguments)})
	}
	return out
}
