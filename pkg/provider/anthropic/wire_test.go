package anthropic

import (
	"encoding/json"
	"strings"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/internal/wiretest"
)

func TestEncodeRequestGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Requests() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			body, err := EncodeRequest(tc.Value)
			if err != nil {
				t.Fatal(err)
			}
			wiretest.Golden(t, "request_"+tc.Name+".json", body)

			info, got, err := DecodeRequest(body)
			if err != nil {
				t.Fatalf("DecodeRequest(EncodeRequest(x)): %v", err)
			}
			if d := wiretest.Diff(tc.Value, got); d != "" {
				t.Errorf("DecodeRequest(EncodeRequest(x)) != x (-want +got):\n%s", d)
			}
			if info.Model != tc.Value.Model || info.Stream || len(info.Ignored) != 0 {
				t.Errorf("info = %+v", info)
			}
		})
	}
}

func TestEncodeResponseGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Responses() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			body, err := EncodeResponse(tc.Value, "")
			if err != nil {
				t.Fatal(err)
			}
			wiretest.Golden(t, "response_"+tc.Name+".json", body)

			got, err := DecodeResponse(body)
			if err != nil {
				t.Fatalf("DecodeResponse(EncodeResponse(x)): %v", err)
			}
			if d := wiretest.Diff(tc.Value, got); d != "" {
				t.Errorf("DecodeResponse(EncodeResponse(x)) != x (-want +got):\n%s", d)
			}
		})
	}
}

func TestDecodeRequestShapes(t *testing.T) {
	t.Parallel()
	text := func(s string) llm.Block { return llm.Block{Type: llm.BlockText, Text: s} }
	tests := []struct {
		name     string
		body     string
		want     *llm.Request
		wantInfo RequestInfo
	}{
		{
			name: "string content and string system",
			body: `{"model":"claude-x","max_tokens":10,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`,
			want: &llm.Request{Model: "claude-x", MaxTokens: 10, System: "Be brief.",
				Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{text("hi")}}}},
			wantInfo: RequestInfo{Model: "claude-x"},
		},
		{
			name: "system blocks, cache_control, tool_result content blocks, metadata, stream",
			body: `{"model":"claude-x","max_tokens":10,"stream":true,"metadata":{"user_id":"u-7"},"top_k":5,
				"system":[{"type":"text","text":"A","cache_control":{"type":"ephemeral"}},{"type":"text","text":"B"}],
				"tool_choice":{"type":"any","disable_parallel_tool_use":true},
				"messages":[
					{"role":"user","content":[{"type":"text","text":"go"}]},
					{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{ "a" : 1 }}]},
					{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]},
						{"type":"tool_result","tool_use_id":"t2"}]}]}`,
			want: &llm.Request{Model: "claude-x", MaxTokens: 10, System: "A\n\nB",
				ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAny},
				Messages: []llm.Message{
					{Role: llm.RoleUser, Content: []llm.Block{text("go")}},
					{Role: llm.RoleAssistant, Content: []llm.Block{{Type: llm.BlockToolUse, ToolUseID: "t1", ToolName: "f", Input: json.RawMessage(`{"a":1}`)}}},
					{Role: llm.RoleUser, Content: []llm.Block{
						{Type: llm.BlockToolResult, ToolUseID: "t1", Text: "xy"},
						{Type: llm.BlockToolResult, ToolUseID: "t2"},
					}},
				}},
			wantInfo: RequestInfo{Model: "claude-x", Stream: true, Metadata: json.RawMessage(`{"user_id":"u-7"}`),
				UserID: "u-7", DisableParallelToolUse: true, Ignored: []string{"top_k"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			info, got, err := DecodeRequest([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if d := wiretest.Diff(tt.want, got); d != "" {
				t.Errorf("request (-want +got):\n%s", d)
			}
			if d := wiretest.Diff(&tt.wantInfo, info); d != "" {
				t.Errorf("info (-want +got):\n%s", d)
			}
		})
	}
}

func TestDecodeRequestErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, want string
	}{
		{"not JSON", `{"model":`, "invalid JSON"},
		{"wrong type", `{"model":"m","max_tokens":"ten","messages":[]}`, "max_tokens: expected an integer, got string"},
		{"no model", `{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, "model: required"},
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens: required"},
		{"zero max_tokens", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "max_tokens: must be at least 1"},
		{"no messages", `{"model":"m","max_tokens":1,"messages":[]}`, "messages: at least one"},
		{"bad role", `{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"x"}]}`, `messages[0].role: must be "user" or "assistant"`},
		{"no content", `{"model":"m","max_tokens":1,"messages":[{"role":"user"}]}`, "messages[0].content: required"},
		{"content number", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":5}]}`, "messages[0].content: must be a string or an array"},
		{"image", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, `messages[0].content[0].type: "image" is not supported`},
		{"tool_use in user", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]}`, "messages[0].content[0]: tool_use blocks belong in assistant messages"},
		{"tool_use input array", `{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":[1]}]}]}`, "messages[0].content[0].input: must be a JSON object"},
		{"tool_result without id", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, "messages[0].content[0].tool_use_id: required"},
		{"server tool", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, `tools[0].type: "web_search_20250305" is not supported`},
		{"tool schema string", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":"x"}]}`, "tools[0].input_schema: must be a JSON object"},
		{"tool_choice bad", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"required"}}`, "tool_choice.type: must be auto, any, tool or none"},
		{"tool_choice tool without name", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"tool"}}`, "tool_choice.name: required"},
		{"system image", `{"model":"m","max_tokens":1,"system":[{"type":"image"}],"messages":[{"role":"user","content":"x"}]}`, `system[0].type: "image" is not supported`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := DecodeRequest([]byte(tt.body))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("DecodeRequest error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestEncodeRequestDefaults(t *testing.T) {
	t.Parallel()
	hot := 1.7
	body, err := EncodeRequest(&llm.Request{
		Model:       "m",
		Temperature: &hot,
		Messages:    []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "x"}}}},
		Tools:       []llm.Tool{{Name: "f"}},
		ToolChoice:  &llm.ToolChoice{},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, got, err := DecodeRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	if got.MaxTokens != DefaultMaxTokens || *got.Temperature != MaxTemperature {
		t.Errorf("max_tokens %d, temperature %v; want %d, %v", got.MaxTokens, *got.Temperature, DefaultMaxTokens, MaxTemperature)
	}
	if string(got.Tools[0].InputSchema) != `{"type":"object"}` || got.ToolChoice.Mode != llm.ToolChoiceAuto {
		t.Errorf("tool schema %s, tool choice %+v", got.Tools[0].InputSchema, got.ToolChoice)
	}

	if _, err := EncodeRequest(&llm.Request{Messages: []llm.Message{}}); err == nil {
		t.Error("EncodeRequest without a model succeeded")
	}
}

func TestDecodeResponseCachedTokensAndUnknownBlocks(t *testing.T) {
	t.Parallel()
	body := `{"id":"msg_1","type":"message","role":"assistant","model":"claude-x",
		"content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"text","text":"ok"}],
		"stop_reason":"end_turn","stop_sequence":null,
		"usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":3}}`
	got, err := DecodeResponse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := &llm.Response{ID: "msg_1", Model: "claude-x", StopReason: llm.StopEndTurn,
		Content: []llm.Block{{Type: llm.BlockText, Text: "ok"}},
		Usage:   llm.Usage{InputTokens: 1110, OutputTokens: 3}}
	if d := wiretest.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func TestEncodeError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status   int
		code     string
		wantType string
	}{
		{400, "", "invalid_request_error"},
		{401, "", "authentication_error"},
		{403, "", "permission_error"},
		{404, "", "not_found_error"},
		{413, "", "request_too_large"},
		{422, "", "invalid_request_error"},
		{429, "queue_full", "rate_limit_error"},
		{500, "", "api_error"},
		{503, "service_degraded", "overloaded_error"},
		{529, "", "overloaded_error"},
	}
	for _, tt := range tests {
		var w wireError
		if err := json.Unmarshal(EncodeError(tt.status, tt.code, "msg"), &w); err != nil {
			t.Fatal(err)
		}
		if w.Type != "error" || w.Error.Type != tt.wantType || w.Error.Message != "msg" {
			t.Errorf("EncodeError(%d) = %+v, want type %s", tt.status, w, tt.wantType)
		}
		if got := detailsOf(w); got != tt.code {
			t.Errorf("EncodeError(%d) error_code = %q, want %q", tt.status, got, tt.code)
		}
		// Our own error bodies classify as what their status says.
		if c := Classify(tt.status, w.Error.Type, detailsOf(w), "msg", nil); tt.status == 429 && c != llm.ClassRateLimited {
			t.Errorf("Classify(EncodeError(429)) = %s", c)
		}
	}
}

func detailsOf(w wireError) string {
	if w.Error.Details == nil {
		return ""
	}
	return w.Error.Details.ErrorCode
}
