package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/internal/wiretest"
)

// created is the fixed timestamp of golden responses.
const created = 1767225600

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
			body, err := encodeResponse(tc.Value, "", created)
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

func TestStopReasons(t *testing.T) {
	t.Parallel()
	tests := []struct {
		reason llm.StopReason
		finish string
		back   llm.StopReason
	}{
		{llm.StopEndTurn, "stop", llm.StopEndTurn},
		{llm.StopStopSequence, "stop", llm.StopEndTurn}, // stop cannot tell
		{llm.StopMaxTokens, "length", llm.StopMaxTokens},
		{llm.StopToolUse, "tool_calls", llm.StopToolUse},
		{llm.StopRefusal, "content_filter", llm.StopRefusal},
		{"", "stop", llm.StopEndTurn},
	}
	for _, tt := range tests {
		if got := finishReasonOf(tt.reason); got != tt.finish {
			t.Errorf("finishReasonOf(%q) = %q, want %q", tt.reason, got, tt.finish)
		}
		if got := stopReasonOf(tt.finish); got != tt.back {
			t.Errorf("stopReasonOf(%q) = %q, want %q", tt.finish, got, tt.back)
		}
	}
	if got := stopReasonOf("function_call"); got != llm.StopToolUse {
		t.Errorf("function_call → %q", got)
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
			name: "string content, developer role, max_tokens, stop string",
			body: `{"model":"gpt-4o","max_tokens":77,"stop":"END","messages":[
				{"role":"developer","content":"Be brief."},
				{"role":"user","content":"hi"}]}`,
			want: &llm.Request{Model: "gpt-4o", MaxTokens: 77, System: "Be brief.", StopSequences: []string{"END"},
				Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{text("hi")}}}},
			wantInfo: RequestInfo{Model: "gpt-4o"},
		},
		{
			name: "parts content, two system messages, max_completion_tokens wins, stream options, tool calls with null content",
			body: `{"model":"gpt-4o","max_tokens":5,"max_completion_tokens":9,"stream":true,"stream_options":{"include_usage":true},
				"user":"u-1","metadata":{"team":"ota"},"parallel_tool_calls":false,"seed":3,"top_p":0.5,
				"tool_choice":"required",
				"tools":[{"type":"function","function":{"name":"f"}}],
				"messages":[
					{"role":"system","content":[{"type":"text","text":"A"}]},
					{"role":"system","content":"B"},
					{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]},
					{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":""}},
						{"id":"c2","type":"function","function":{"name":"f","arguments":"{ \"a\" : [1, 2] }"}}]},
					{"role":"tool","tool_call_id":"c1","content":"ok"},
					{"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"[tool error] "},{"type":"text","text":"boom"}]},
					{"role":"assistant","content":"","tool_calls":[{"id":"c3","type":"function","function":{"name":"f","arguments":"{}"}}]},
					{"role":"tool","tool_call_id":"c3","content":"done"}]}`,
			want: &llm.Request{Model: "gpt-4o", MaxTokens: 9, System: "A\n\nB",
				Tools:      []llm.Tool{{Name: "f"}},
				ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAny},
				Messages: []llm.Message{
					{Role: llm.RoleUser, Content: []llm.Block{text("x"), text("y")}},
					{Role: llm.RoleAssistant, Content: []llm.Block{
						{Type: llm.BlockToolUse, ToolUseID: "c1", ToolName: "f", Input: json.RawMessage(`{}`)},
						{Type: llm.BlockToolUse, ToolUseID: "c2", ToolName: "f", Input: json.RawMessage(`{"a":[1,2]}`)},
					}},
					{Role: llm.RoleUser, Content: []llm.Block{
						{Type: llm.BlockToolResult, ToolUseID: "c1", Text: "ok"},
						{Type: llm.BlockToolResult, ToolUseID: "c2", Text: "boom", IsError: true},
					}},
					{Role: llm.RoleAssistant, Content: []llm.Block{
						{Type: llm.BlockToolUse, ToolUseID: "c3", ToolName: "f", Input: json.RawMessage(`{}`)},
					}},
					{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockToolResult, ToolUseID: "c3", Text: "done"}}},
				}},
			wantInfo: RequestInfo{Model: "gpt-4o", Stream: true, IncludeUsage: true, User: "u-1",
				Metadata: json.RawMessage(`{"team":"ota"}`), ParallelToolCalls: new(false), Ignored: []string{"seed", "top_p"}},
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
		{"not JSON", `[`, "invalid JSON"},
		{"not an object", `[]`, "request body: expected an object"},
		{"wrong type", `{"model":"m","messages":"hi"}`, "messages: expected an array, got string"},
		{"no model", `{"messages":[{"role":"user","content":"x"}]}`, "model: required"},
		{"no messages", `{"model":"m","messages":[]}`, "messages: at least one"},
		{"only system", `{"model":"m","messages":[{"role":"system","content":"x"}]}`, "at least one user or assistant message"},
		{"n=2", `{"model":"m","n":2,"messages":[{"role":"user","content":"x"}]}`, "n: only 1 is supported"},
		{"negative max", `{"model":"m","max_completion_tokens":-1,"messages":[{"role":"user","content":"x"}]}`, "max_completion_tokens: must not be negative"},
		{"bad stop", `{"model":"m","stop":5,"messages":[{"role":"user","content":"x"}]}`, "stop: must be a string or an array"},
		{"function role", `{"model":"m","messages":[{"role":"function","content":"x"}]}`, `messages[0].role: "function" is not supported`},
		{"no role", `{"model":"m","messages":[{"content":"x"}]}`, "messages[0].role: required"},
		{"user null content", `{"model":"m","messages":[{"role":"user","content":null}]}`, "messages[0].content: required"},
		{"image part", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, `messages[0].content[0].type: "image_url" is not supported`},
		{"tool without id", `{"model":"m","messages":[{"role":"tool","content":"x"}]}`, "messages[0].tool_call_id: required"},
		{"bad arguments", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{oops"}}]}]}`, "messages[0].tool_calls[0].function.arguments: not valid JSON"},
		{"array arguments", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"[1]"}}]}]}`, "messages[0].tool_calls[0].function.arguments: must be a JSON object"},
		{"custom tool", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"custom","custom":{"name":"f"}}]}`, `tools[0].type: "custom" is not supported`},
		{"tool without name", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]}`, "tools[0].function.name: required"},
		{"bad tool_choice", `{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"any"}`, `tool_choice: must be "auto", "required", "none" or a function`},
		{"bad tool_choice object", `{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"allowed_tools"}}`, "tool_choice: an object must be"},
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

func TestDecodeResponseVariants(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		want *llm.Response
	}{
		{"refusal", `{"id":"c","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}`,
			&llm.Response{ID: "c", Model: "gpt-4o", StopReason: llm.StopRefusal, Content: []llm.Block{{Type: llm.BlockText, Text: "I can't help with that."}}}},
		{"tool calls with empty content and no usage", `{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"","tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":""}}]},"finish_reason":"tool_calls"}]}`,
			&llm.Response{ID: "c", Model: "m", StopReason: llm.StopToolUse, Content: []llm.Block{{Type: llm.BlockToolUse, ToolUseID: "t", ToolName: "f", Input: json.RawMessage(`{}`)}}}},
	}
	for _, tt := range tests {
		got, err := DecodeResponse([]byte(tt.body))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if d := wiretest.Diff(tt.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, d)
		}
	}
	for _, bad := range []string{`{"choices":[]}`, `{"choices":[{"message":{"content":5}}]}`, `nope`,
		`{"choices":[{"message":{"tool_calls":[{"id":"t","function":{"name":"f","arguments":"{"}}]}}]}`} {
		if _, err := DecodeResponse([]byte(bad)); err == nil {
			t.Errorf("DecodeResponse(%s) succeeded", bad)
		}
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
		{401, "invalid_api_key", "authentication_error"},
		{403, "", "permission_error"},
		{404, "", "invalid_request_error"},
		{429, "queue_full", "rate_limit_error"},
		{500, "", "server_error"},
		{503, "service_degraded", "service_unavailable_error"},
	}
	for _, tt := range tests {
		body := EncodeError(tt.status, tt.code, "msg")
		var raw map[string]map[string]any
		if err := json.Unmarshal(body, &raw); err != nil {
			t.Fatal(err)
		}
		e := raw["error"]
		if e["type"] != tt.wantType || e["message"] != "msg" {
			t.Errorf("EncodeError(%d) = %s", tt.status, body)
		}
		if _, ok := e["param"]; !ok {
			t.Errorf("EncodeError(%d) has no param: %s", tt.status, body)
		}
		if code, _ := e["code"].(string); code != tt.code {
			t.Errorf("EncodeError(%d) code = %v, want %q", tt.status, e["code"], tt.code)
		}
	}
}
