package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/internal/wiretest"
)

// compatServer plays Bulwark's OpenAI-compatible endpoint: it decodes
// whatever the official SDK sends with DecodeRequest and answers with
// EncodeResponse, WriteStream or EncodeError. seen receives each decoded
// request.
func compatServer(t *testing.T, resp *llm.Response, seen chan<- *llm.Request) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		info, req, err := DecodeRequest(body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(EncodeError(http.StatusBadRequest, "", err.Error()))
			return
		}
		if resp == nil {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(EncodeError(http.StatusTooManyRequests, "queue_full", "queue is full"))
			return
		}
		seen <- req
		if info.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			if err := WriteStream(w, resp, info.Model, WithUsage(info.IncludeUsage)); err != nil {
				t.Error(err)
			}
			return
		}
		out, err := EncodeResponse(resp, info.Model)
		if err != nil {
			t.Error(err)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func sdkClient(srv *httptest.Server) sdk.Client {
	return sdk.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("client-token"), option.WithMaxRetries(0))
}

// sdkParams is a request with a system prompt, a tool, an assistant tool
// call and its (failed) result, as an SDK user would build it.
func sdkParams() sdk.ChatCompletionNewParams {
	assistant := sdk.ChatCompletionAssistantMessageParam{ToolCalls: []sdk.ChatCompletionMessageToolCallUnionParam{{
		OfFunction: &sdk.ChatCompletionMessageFunctionToolCallParam{
			ID:       "call_1",
			Function: sdk.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "lookup_error_code", Arguments: `{"code":"P0A80"}`},
		},
	}}}
	return sdk.ChatCompletionNewParams{
		Model:               "gpt-4o",
		MaxCompletionTokens: sdk.Int(300),
		Messages: []sdk.ChatCompletionMessageParamUnion{
			sdk.SystemMessage("Be brief."),
			sdk.UserMessage("Explain P0A80."),
			{OfAssistant: &assistant},
			sdk.ToolMessage(ToolErrorPrefix+"service down", "call_1"),
		},
		Tools: []sdk.ChatCompletionToolUnionParam{sdk.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:       "lookup_error_code",
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"code": map[string]any{"type": "string"}}},
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
	out.StopReason = stopReasonOf(ch.FinishReason)
	if ch.Message.Content != "" {
		out.Content = append(out.Content, llm.Block{Type: llm.BlockText, Text: ch.Message.Content})
	}
	for _, tc := range ch.Message.ToolCalls {
		out.Content = append(out.Content, llm.Block{Type: llm.BlockToolUse, ToolUseID: tc.ID, ToolName: tc.Function.Name, Input: json.RawMessage(tc.Function.Arguments)})
	}
	return out
}

func TestOfficialSDKParsesOurAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Responses() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			seen := make(chan *llm.Request, 2)
			srv := compatServer(t, tc.Value, seen)
			client := sdkClient(srv)
			want := *tc.Value
			want.Model = "gpt-4o" // the model the client asked for

			params := sdkParams()
			params.StreamOptions = sdk.ChatCompletionStreamOptionsParam{}
			got, err := client.Chat.Completions.New(t.Context(), params)
			if err != nil {
				t.Fatalf("SDK Chat.Completions.New: %v", err)
			}
			if d := wiretest.Diff(&want, fromSDK(got)); d != "" {
				t.Errorf("SDK non-streaming view (-want +got):\n%s", d)
			}

			stream := client.Chat.Completions.NewStreaming(t.Context(), sdkParams())
			var acc sdk.ChatCompletionAccumulator
			chunks := 0
			for stream.Next() {
				chunks++
				if !acc.AddChunk(stream.Current()) {
					t.Fatalf("accumulator rejected chunk %d", chunks)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("SDK stream: %v", err)
			}
			if d := wiretest.Diff(&want, fromSDK(&acc.ChatCompletion)); d != "" {
				t.Errorf("SDK streaming view (-want +got):\n%s", d)
			}
			if chunks < 3 {
				t.Errorf("only %d chunks", chunks)
			}

			// What the SDK sent decoded into the request it meant.
			req := <-seen
			if req.System != "Be brief." || len(req.Messages) != 3 || len(req.Tools) != 1 || req.MaxTokens != 300 ||
				!req.Messages[2].Content[0].IsError || req.Messages[2].Content[0].Text != "service down" ||
				req.Messages[1].Content[0].ToolName != "lookup_error_code" {
				t.Errorf("decoded SDK request: %+v", req)
			}
		})
	}
}

func TestOfficialSDKParsesOurErrors(t *testing.T) {
	t.Parallel()
	srv := compatServer(t, nil, nil)
	client := sdkClient(srv)
	_, err := client.Chat.Completions.New(t.Context(), sdkParams())
	var apiErr *sdk.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("error %v is not an SDK API error", err)
	}
	if apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "queue_full" || apiErr.Type != "rate_limit_error" || apiErr.Message != "queue is full" {
		t.Errorf("SDK error %+v", apiErr)
	}
}

func TestWriteStreamGolden(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := WriteStream(&b, wiretest.Responses()[1].Value, "gpt-4o", WithUsage(true), withCreated(created)); err != nil {
		t.Fatal(err)
	}
	wiretest.GoldenText(t, "stream_tool_use_parallel.sse", b.Bytes())
}
