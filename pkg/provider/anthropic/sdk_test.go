package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/internal/wiretest"
)

// compatServer plays Bulwark's Anthropic-compatible endpoint: it decodes
// whatever the official SDK sends with DecodeRequest and answers with
// EncodeResponse, WriteStream or EncodeError. seen receives each decoded
// request.
func compatServer(t *testing.T, resp *llm.Response, seen chan<- *llm.Request) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		info, req, err := DecodeRequest(body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(EncodeError(http.StatusBadRequest, "", err.Error()))
			return
		}
		if resp == nil {
			w.Header().Set("retry-after", "7")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(EncodeError(http.StatusTooManyRequests, "queue_full", "queue is full"))
			return
		}
		seen <- req
		if info.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			if err := WriteStream(w, resp, info.Model); err != nil {
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
	return sdk.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey("client-token"), option.WithMaxRetries(0))
}

// sdkParams is a request with a system prompt, tools, a tool_use turn and
// tool results, as an SDK user would build it.
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

func TestOfficialSDKParsesOurAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Responses() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			seen := make(chan *llm.Request, 2)
			srv := compatServer(t, tc.Value, seen)
			client := sdkClient(srv)
			want := *tc.Value
			want.Model = "claude-sonnet-4-5" // the model the client asked for

			msg, err := client.Messages.New(t.Context(), sdkParams())
			if err != nil {
				t.Fatalf("SDK Messages.New: %v", err)
			}
			if d := wiretest.Diff(&want, fromSDK(t, msg)); d != "" {
				t.Errorf("SDK non-streaming view (-want +got):\n%s", d)
			}

			stream := client.Messages.NewStreaming(t.Context(), sdkParams())
			var acc sdk.Message
			events := 0
			for stream.Next() {
				events++
				if err := acc.Accumulate(stream.Current()); err != nil {
					t.Fatalf("Accumulate: %v", err)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("SDK stream: %v", err)
			}
			if d := wiretest.Diff(&want, fromSDK(t, &acc)); d != "" {
				t.Errorf("SDK streaming view (-want +got):\n%s", d)
			}
			if events < 6 {
				t.Errorf("only %d events", events)
			}

			// What the SDK sent decoded into the request it meant.
			req := <-seen
			if req.System != "Be brief." || len(req.Messages) != 3 || len(req.Tools) != 1 ||
				!req.Messages[2].Content[0].IsError || req.Messages[1].Content[0].ToolName != "lookup_error_code" {
				t.Errorf("decoded SDK request: %+v", req)
			}
		})
	}
}

func TestOfficialSDKParsesOurErrors(t *testing.T) {
	t.Parallel()
	srv := compatServer(t, nil, nil)
	client := sdkClient(srv)
	_, err := client.Messages.New(t.Context(), sdkParams())
	var apiErr *sdk.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("error %v is not an SDK API error", err)
	}
	if apiErr.StatusCode != http.StatusTooManyRequests || !strings.Contains(apiErr.Error(), "rate_limit_error") || !strings.Contains(apiErr.Error(), "queue is full") {
		t.Errorf("SDK error %v", apiErr)
	}
}

func TestWriteStreamGolden(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := WriteStream(&b, wiretest.Responses()[1].Value, "claude-sonnet-4-5"); err != nil {
		t.Fatal(err)
	}
	wiretest.GoldenText(t, "stream_tool_use_parallel.sse", b.Bytes())
}
