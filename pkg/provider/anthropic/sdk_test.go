package anthropic

import (
	"encoding/json"
	"errors"
	"testing"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/providertest"
)

// sdkHarness drives the official Anthropic SDK for the conformance suite's
// SDK cases.
func sdkHarness() *providertest.SDK {
	return &providertest.SDK{
		ToolUseID: "toolu_1",
		Complete: func(t *testing.T, baseURL string) (*llm.Response, error) {
			c := sdkClient(baseURL)
			msg, err := c.Messages.New(t.Context(), sdkParams())
			if err != nil {
				return nil, err
			}
			return fromSDK(t, msg), nil
		},
		Stream: func(t *testing.T, baseURL string) (*llm.Response, int, error) {
			c := sdkClient(baseURL)
			stream := c.Messages.NewStreaming(t.Context(), sdkParams())
			defer stream.Close()
			var acc sdk.Message
			events := 0
			for stream.Next() {
				events++
				if err := acc.Accumulate(stream.Current()); err != nil {
					return nil, events, err
				}
			}
			return fromSDK(t, &acc), events, stream.Err()
		},
		MinEvents: 6,
		APIError: func(err error) (providertest.SDKError, bool) {
			var e *sdk.Error
			if !errors.As(err, &e) {
				return providertest.SDKError{}, false
			}
			return providertest.SDKError{Status: e.StatusCode, Type: string(e.Type()), Code: e.Details.ErrorCode,
				Message: e.Message, Header: e.Response.Header}, true
		},
	}
}

func sdkClient(baseURL string) sdk.Client {
	return sdk.NewClient(option.WithBaseURL(baseURL), option.WithAPIKey("client-token"), option.WithMaxRetries(0))
}

// sdkParams is providertest.SDKConversation as an SDK user would build it.
func sdkParams() sdk.MessageNewParams {
	return sdk.MessageNewParams{
		Model:     "claude-sonnet-4-5",
		MaxTokens: 300,
		System:    []sdk.TextBlockParam{{Text: "Be brief."}},
		Tools: []sdk.ToolUnionParam{{OfTool: &sdk.ToolParam{
			Name:        "lookup_error_code",
			InputSchema: sdk.ToolInputSchemaParam{Properties: map[string]any{"code": map[string]any{"type": "string"}}, Required: []string{"code"}},
		}}},
		Messages: []sdk.MessageParam{
			sdk.NewUserMessage(sdk.NewTextBlock("Explain P0A80.")),
			sdk.NewAssistantMessage(sdk.NewToolUseBlock("toolu_1", map[string]any{"code": "P0A80"}, "lookup_error_code")),
			sdk.NewUserMessage(sdk.NewToolResultBlock("toolu_1", "service down", true)),
		},
	}
}

// fromSDK converts the SDK's parsed message back to the neutral model.
func fromSDK(t *testing.T, m *sdk.Message) *llm.Response {
	t.Helper()
	out := &llm.Response{ID: m.ID, Model: string(m.Model), StopReason: llm.StopReason(m.StopReason),
		Usage: llm.Usage{InputTokens: int(m.Usage.InputTokens), OutputTokens: int(m.Usage.OutputTokens)}}
	for _, b := range m.Content {
		switch b.Type {
		case "text":
			out.Content = append(out.Content, llm.Block{Type: llm.BlockText, Text: b.Text})
		case "tool_use":
			out.Content = append(out.Content, llm.Block{Type: llm.BlockToolUse, ToolUseID: b.ID, ToolName: b.Name, Input: json.RawMessage(b.Input)})
		default:
			t.Errorf("unexpected block %q", b.Type)
		}
	}
	return out
}
