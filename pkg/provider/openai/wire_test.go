package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/wiretest"
)

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
		if got := StopReasonOf(tt.finish); got != tt.back {
			t.Errorf("StopReasonOf(%q) = %q, want %q", tt.finish, got, tt.back)
		}
	}
	if got := StopReasonOf("function_call"); got != llm.StopToolUse {
		t.Errorf("function_call → %q", got)
	}
}

// TestDecodeRequestShapes: the shapes only Chat Completions has.
func TestDecodeRequestShapes(t *testing.T) {
	t.Parallel()
	text := func(s string) llm.Block { return llm.Block{Type: llm.BlockText, Text: s} }
	providertest.DecodeRequests(t, DecodeRequest, []providertest.DecodeCase[*RequestInfo]{
		{
			Name: "string content, developer role, max_tokens, stop string",
			Body: `{"model":"gpt-4o","max_tokens":77,"stop":"END","messages":[
				{"role":"developer","content":"Be brief."},
				{"role":"user","content":"hi"}]}`,
			Want: &llm.Request{Model: "gpt-4o", MaxTokens: 77, System: "Be brief.", StopSequences: []string{"END"},
				Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{text("hi")}}}},
			WantInfo: &RequestInfo{Model: "gpt-4o", MaxTokensParam: "max_tokens"},
		},
		{
			Name: "parts content, two system messages, max_completion_tokens wins, stream options, tool calls with null content",
			Body: `{"model":"gpt-4o","max_tokens":5,"max_completion_tokens":9,"stream":true,"stream_options":{"include_usage":true},
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
			Want: &llm.Request{Model: "gpt-4o", MaxTokens: 9, System: "A\n\nB",
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
			WantInfo: &RequestInfo{Model: "gpt-4o", Stream: true, IncludeUsage: true, User: "u-1", MaxTokensParam: "max_completion_tokens",
				Metadata: json.RawMessage(`{"team":"ota"}`), ParallelToolCalls: new(false), Ignored: []string{"seed", "top_p"}},
		},
	})
}

// badRequests are bodies DecodeRequest refuses, for the conformance suite.
var badRequests = []providertest.BadRequest{
	{Name: "not an object", Body: `[]`, Want: "request body: expected an object"},
	{Name: "wrong type", Body: `{"model":"m","messages":"hi"}`, Want: "messages: expected an array, got string"},
	{Name: "no model", Body: `{"messages":[{"role":"user","content":"x"}]}`, Want: "model: required"},
	{Name: "no messages", Body: `{"model":"m","messages":[]}`, Want: "messages: at least one"},
	{Name: "only system", Body: `{"model":"m","messages":[{"role":"system","content":"x"}]}`, Want: "at least one user or assistant message"},
	{Name: "n=2", Body: `{"model":"m","n":2,"messages":[{"role":"user","content":"x"}]}`, Want: "n: only 1 is supported"},
	{Name: "negative max", Body: `{"model":"m","max_completion_tokens":-1,"messages":[{"role":"user","content":"x"}]}`, Want: "max_completion_tokens: must not be negative"},
	{Name: "bad stop", Body: `{"model":"m","stop":5,"messages":[{"role":"user","content":"x"}]}`, Want: "stop: must be a string or an array"},
	{Name: "function role", Body: `{"model":"m","messages":[{"role":"function","content":"x"}]}`, Want: `messages[0].role: "function" is not supported`},
	{Name: "no role", Body: `{"model":"m","messages":[{"content":"x"}]}`, Want: "messages[0].role: required"},
	{Name: "user null content", Body: `{"model":"m","messages":[{"role":"user","content":null}]}`, Want: "messages[0].content: required"},
	{Name: "image part", Body: `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, Want: `messages[0].content[0].type: "image_url" is not supported`},
	{Name: "tool without id", Body: `{"model":"m","messages":[{"role":"tool","content":"x"}]}`, Want: "messages[0].tool_call_id: required"},
	{Name: "bad arguments", Body: `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{oops"}}]}]}`, Want: "messages[0].tool_calls[0].function.arguments: not valid JSON"},
	{Name: "array arguments", Body: `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"[1]"}}]}]}`, Want: "messages[0].tool_calls[0].function.arguments: must be a JSON object"},
	{Name: "custom tool", Body: `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"custom","custom":{"name":"f"}}]}`, Want: `tools[0].type: "custom" is not supported`},
	{Name: "tool without name", Body: `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]}`, Want: "tools[0].function.name: required"},
	{Name: "bad tool_choice", Body: `{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"any"}`, Want: `tool_choice: must be "auto", "required", "none" or a function`},
	{Name: "bad tool_choice object", Body: `{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"allowed_tools"}}`, Want: "tool_choice: an object must be"},
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

// TestEncodeErrorShape: the Chat Completions error body (param and code
// always present), with and without a code of Bulwark's own; the type of
// each status (errorTypes) is checked by the conformance suite.
func TestEncodeErrorShape(t *testing.T) {
	t.Parallel()
	got := []string{string(EncodeError(400, "", "msg")), string(EncodeError(401, "invalid_api_key", "msg"))}
	want := []string{
		`{"error":{"message":"msg","type":"invalid_request_error","param":null,"code":null}}`,
		`{"error":{"message":"msg","type":"authentication_error","param":null,"code":"invalid_api_key"}}`,
	}
	if d := wiretest.Diff(want, got); d != "" {
		t.Errorf("EncodeError bodies (-want +got):\n%s", d)
	}
}

// errorTypes is the error.type EncodeError writes for each status, OpenAI's.
var errorTypes = map[int]string{
	400: "invalid_request_error",
	401: "authentication_error",
	403: "permission_error",
	404: "invalid_request_error",
	429: "rate_limit_error",
	500: "server_error",
	503: "service_unavailable_error",
	529: "server_error",
}

// A request whose caller set no max_tokens is sent none: the model's own
// limit applies, as when called directly, and OpenAI meters no limit
// nobody set. One that set it is sent max_completion_tokens.
func TestEncodeRequestWithoutMaxTokens(t *testing.T) {
	t.Parallel()
	req := &llm.Request{Model: "gpt-4o", MaxTokens: 1024, MaxTokensDefault: true,
		Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "hi"}}}}}
	for _, tt := range []struct {
		defaulted bool
		want      string
	}{{true, ""}, {false, `"max_completion_tokens":1024`}} {
		req.MaxTokensDefault = tt.defaulted
		b, err := EncodeRequest(req)
		if err != nil {
			t.Fatal(err)
		}
		has := strings.Contains(string(b), "max_completion_tokens") || strings.Contains(string(b), `"max_tokens"`)
		if tt.want == "" && has || tt.want != "" && !strings.Contains(string(b), tt.want) {
			t.Errorf("defaulted %v: sent %s, want %q", tt.defaulted, b, tt.want)
		}
	}
}
