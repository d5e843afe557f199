package azure

import (
	"encoding/json"
	"errors"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	oaiazure "github.com/openai/openai-go/v3/azure"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/provider/providertest"
)

// sdkHarness drives the official OpenAI SDK with its Azure options
// (github.com/openai/openai-go/v3/azure) for the conformance suite's SDK
// cases: the SDK addresses the deployment named by the model, adds the
// api-version and sends the api-key header.
func sdkHarness() *providertest.SDK {
	return &providertest.SDK{
		ToolUseID: "call_1",
		Complete: func(t *testing.T, baseURL string) (*llm.Response, error) {
			params := sdkParams()
			params.StreamOptions = sdk.ChatCompletionStreamOptionsParam{}
			c := sdkClient(baseURL)
			got, err := c.Chat.Completions.New(t.Context(), params)
			if err != nil {
				return nil, err
			}
			return fromSDK(got), nil
		},
		Stream: func(t *testing.T, baseURL string) (*llm.Response, int, error) {
			c := sdkClient(baseURL)
			stream := c.Chat.Completions.NewStreaming(t.Context(), sdkParams())
			defer stream.Close()
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

// sdkClient is an Azure OpenAI client of the SDK for the resource at
// endpoint (plain HTTP on loopback, which the SDK allows only when told).
func sdkClient(endpoint string, opts ...option.RequestOption) sdk.Client {
	return sdk.NewClient(append([]option.RequestOption{
		oaiazure.WithEndpoint(endpoint, APIVersionDefault),
		oaiazure.WithAPIKey("client-token"),
		oaiazure.WithUnsafeAllowHTTP(),
		option.WithMaxRetries(0),
	}, opts...)...)
}

// sdkParams is providertest.SDKConversation as an SDK user would build it.
func sdkParams() sdk.ChatCompletionNewParams {
	assistant := sdk.ChatCompletionAssistantMessageParam{ToolCalls: []sdk.ChatCompletionMessageToolCallUnionParam{{
		OfFunction: &sdk.ChatCompletionMessageFunctionToolCallParam{
			ID:       "call_1",
			Function: sdk.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "lookup_error_code", Arguments: `{"code":"P0A80"}`},
		},
	}}}
	return sdk.ChatCompletionNewParams{
		Model:               "test-model", // the deployment
		MaxCompletionTokens: sdk.Int(300),
		Messages: []sdk.ChatCompletionMessageParamUnion{
			sdk.SystemMessage("Be brief."),
			sdk.UserMessage("Explain P0A80."),
			{OfAssistant: &assistant},
			sdk.ToolMessage(openai.ToolErrorPrefix+"service down", "call_1"),
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
func fromSDK(c *sdk.ChatCompletion) *llm.Response {
	out := &llm.Response{ID: c.ID, Model: c.Model, Content: []llm.Block{},
		Usage: llm.Usage{InputTokens: int(c.Usage.PromptTokens), OutputTokens: int(c.Usage.CompletionTokens)}}
	if len(c.Choices) == 0 {
		return out
	}
	ch := c.Choices[0]
	out.StopReason = map[string]llm.StopReason{"stop": llm.StopEndTurn, "length": llm.StopMaxTokens,
		"tool_calls": llm.StopToolUse, "content_filter": llm.StopRefusal}[ch.FinishReason]
	if ch.Message.Content != "" {
		out.Content = append(out.Content, llm.Block{Type: llm.BlockText, Text: ch.Message.Content})
	}
	for _, tc := range ch.Message.ToolCalls {
		out.Content = append(out.Content, llm.Block{Type: llm.BlockToolUse, ToolUseID: tc.ID, ToolName: tc.Function.Name, Input: json.RawMessage(tc.Function.Arguments)})
	}
	return out
}
