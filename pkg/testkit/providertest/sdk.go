package providertest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/wiretest"
)

// SDK drives a provider's official SDK against Bulwark's compat endpoint
// for that provider, played by the suite with the adapter's Wire. Every
// call sends SDKConversation, built with the SDK's own types as an SDK user
// would, with retries off.
type SDK struct {
	// ToolUseID is the id the conversation gives the assistant's tool call.
	ToolUseID string
	// Complete sends the conversation to baseURL (the endpoint's root)
	// without streaming and returns the SDK's parsed answer in the neutral
	// model.
	Complete func(t *testing.T, baseURL string) (*llm.Response, error)
	// Stream sends it streaming and returns the SDK's accumulated answer
	// and the number of events it saw.
	Stream func(t *testing.T, baseURL string) (*llm.Response, int, error)
	// MinEvents is the fewest stream events an answer may take.
	MinEvents int
	// APIError reads the SDK's error of a call the endpoint refused; false
	// when err is not one.
	APIError func(err error) (SDKError, bool)
}

// SDKError is what an SDK made of an error answer.
type SDKError struct {
	Status              int
	Type, Code, Message string
	Header              http.Header
}

// SDKConversation is the request every SDK call sends: a system prompt, a
// tool, the user's question, the assistant's call of the tool (id
// toolUseID) and its failed result.
func SDKConversation(model, toolUseID string) *llm.Request {
	return &llm.Request{
		Model:     model,
		MaxTokens: 300,
		System:    "Be brief.",
		Tools: []llm.Tool{{
			Name:        "lookup_error_code",
			InputSchema: json.RawMessage(`{"properties":{"code":{"type":"string"}},"required":["code"],"type":"object"}`),
		}},
		Messages: []llm.Message{
			{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "Explain P0A80."}}},
			{Role: llm.RoleAssistant, Content: []llm.Block{{Type: llm.BlockToolUse, ToolUseID: toolUseID,
				ToolName: "lookup_error_code", Input: json.RawMessage(`{"code":"P0A80"}`)}}},
			{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockToolResult, ToolUseID: toolUseID,
				Text: "service down", IsError: true}}},
		},
	}
}

// compatServer plays Bulwark's compat endpoint for the provider: it decodes
// whatever the SDK sends with DecodeRequest and answers with EncodeResponse
// or WriteStream, or, when resp is nil, with a 429 from EncodeError. seen
// receives each decoded request.
func (h *Harness) compatServer(t *testing.T, resp *llm.Response, seen chan<- *llm.Request) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != h.Path {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		info, req, err := h.Wire.DecodeRequest(body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write(h.Wire.EncodeError(http.StatusBadRequest, "", err.Error()))
			return
		}
		if resp == nil {
			w.Header().Set("retry-after", "7")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(h.Wire.EncodeError(http.StatusTooManyRequests, "queue_full", "queue is full"))
			return
		}
		seen <- req
		if info.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			if err := h.Wire.WriteStream(w, resp, info); err != nil {
				t.Error(err)
			}
			return
		}
		out, err := h.Wire.EncodeResponse(resp, info.Model)
		if err != nil {
			t.Error(err)
		}
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// normalizeSchemas re-encodes every tool schema of r with sorted keys, so
// that the key order an SDK writes does not count.
func normalizeSchemas(t *testing.T, r *llm.Request) {
	t.Helper()
	for i, tool := range r.Tools {
		var v any
		if err := json.Unmarshal(tool.InputSchema, &v); err != nil {
			t.Fatalf("tool %s schema: %v", tool.Name, err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		r.Tools[i].InputSchema = b
	}
}

func (h *Harness) testSDK(t *testing.T) {
	sdk := h.SDK
	t.Run("parses our answers", func(t *testing.T) {
		t.Parallel()
		for _, tc := range wiretest.Responses() {
			t.Run(tc.Name, func(t *testing.T) {
				t.Parallel()
				seen := make(chan *llm.Request, 2)
				url := h.compatServer(t, tc.Value, seen)
				want := *tc.Value
				want.Model = h.Model // the model the client asked for

				got, err := sdk.Complete(t, url)
				if err != nil {
					t.Fatalf("SDK call: %v", err)
				}
				if d := wiretest.Diff(&want, got); d != "" {
					t.Errorf("SDK non-streaming view (-want +got):\n%s", d)
				}

				got, events, err := sdk.Stream(t, url)
				if err != nil {
					t.Fatalf("SDK stream: %v", err)
				}
				if d := wiretest.Diff(&want, got); d != "" {
					t.Errorf("SDK streaming view (-want +got):\n%s", d)
				}
				if events < sdk.MinEvents {
					t.Errorf("only %d events, want at least %d", events, sdk.MinEvents)
				}

				// What the SDK sent, both times, decoded into the request
				// it meant.
				for _, call := range []string{"non-streaming", "streaming"} {
					req := <-seen
					normalizeSchemas(t, req)
					if d := wiretest.Diff(SDKConversation(h.Model, sdk.ToolUseID), req); d != "" {
						t.Errorf("decoded %s SDK request (-want +got):\n%s", call, d)
					}
				}
			})
		}
	})

	t.Run("parses our errors", func(t *testing.T) {
		t.Parallel()
		_, err := sdk.Complete(t, h.compatServer(t, nil, nil))
		got, ok := sdk.APIError(err)
		if !ok {
			t.Fatalf("error %v is not an SDK API error", err)
		}
		if got.Status != http.StatusTooManyRequests || got.Type != "rate_limit_error" || got.Code != "queue_full" ||
			got.Message != "queue is full" || got.Header.Get("retry-after") != "7" {
			t.Errorf("SDK error %+v", got)
		}
	})
}
