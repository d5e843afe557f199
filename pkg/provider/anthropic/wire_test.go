package anthropic

import (
	"encoding/json"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/wiretest"
)

// TestDecodeRequestShapes: the shapes only the Messages API has.
func TestDecodeRequestShapes(t *testing.T) {
	t.Parallel()
	text := func(s string) llm.Block { return llm.Block{Type: llm.BlockText, Text: s} }
	providertest.DecodeRequests(t, DecodeRequest, []providertest.DecodeCase[*RequestInfo]{
		{
			Name: "string content and string system",
			Body: `{"model":"claude-x","max_tokens":10,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`,
			Want: &llm.Request{Model: "claude-x", MaxTokens: 10, System: "Be brief.",
				Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{text("hi")}}}},
			WantInfo: &RequestInfo{Model: "claude-x"},
		},
		{
			Name: "system blocks, cache_control, tool_result content blocks, metadata, stream",
			Body: `{"model":"claude-x","max_tokens":10,"stream":true,"metadata":{"user_id":"u-7"},"top_k":5,
				"system":[{"type":"text","text":"A","cache_control":{"type":"ephemeral"}},{"type":"text","text":"B"}],
				"tool_choice":{"type":"any","disable_parallel_tool_use":true},
				"messages":[
					{"role":"user","content":[{"type":"text","text":"go"}]},
					{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{ "a" : 1 }}]},
					{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]},
						{"type":"tool_result","tool_use_id":"t2"}]}]}`,
			Want: &llm.Request{Model: "claude-x", MaxTokens: 10, System: "A\n\nB",
				ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAny},
				Messages: []llm.Message{
					{Role: llm.RoleUser, Content: []llm.Block{text("go")}},
					{Role: llm.RoleAssistant, Content: []llm.Block{{Type: llm.BlockToolUse, ToolUseID: "t1", ToolName: "f", Input: json.RawMessage(`{"a":1}`)}}},
					{Role: llm.RoleUser, Content: []llm.Block{
						{Type: llm.BlockToolResult, ToolUseID: "t1", Text: "xy"},
						{Type: llm.BlockToolResult, ToolUseID: "t2"},
					}},
				}},
			WantInfo: &RequestInfo{Model: "claude-x", Stream: true, Metadata: json.RawMessage(`{"user_id":"u-7"}`),
				UserID: "u-7", DisableParallelToolUse: true, Ignored: []string{"top_k"}},
		},
	})
}

// badRequests are bodies DecodeRequest refuses, for the conformance suite.
var badRequests = []providertest.BadRequest{
	{Name: "wrong type", Body: `{"model":"m","max_tokens":"ten","messages":[]}`, Want: "max_tokens: expected an integer, got string"},
	{Name: "no model", Body: `{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, Want: "model: required"},
	{Name: "no max_tokens", Body: `{"model":"m","messages":[{"role":"user","content":"x"}]}`, Want: "max_tokens: required"},
	{Name: "zero max_tokens", Body: `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, Want: "max_tokens: must be at least 1"},
	{Name: "no messages", Body: `{"model":"m","max_tokens":1,"messages":[]}`, Want: "messages: at least one"},
	{Name: "bad role", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"x"}]}`, Want: `messages[0].role: must be "user" or "assistant"`},
	{Name: "no content", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"user"}]}`, Want: "messages[0].content: required"},
	{Name: "content number", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":5}]}`, Want: "messages[0].content: must be a string or an array"},
	{Name: "image", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, Want: `messages[0].content[0].type: "image" is not supported`},
	{Name: "tool_use in user", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]}`, Want: "messages[0].content[0]: tool_use blocks belong in assistant messages"},
	{Name: "tool_use input array", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":[1]}]}]}`, Want: "messages[0].content[0].input: must be a JSON object"},
	{Name: "tool_result without id", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, Want: "messages[0].content[0].tool_use_id: required"},
	{Name: "server tool", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, Want: `tools[0].type: "web_search_20250305" is not supported`},
	{Name: "tool schema string", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":"x"}]}`, Want: "tools[0].input_schema: must be a JSON object"},
	{Name: "tool_choice bad", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"required"}}`, Want: "tool_choice.type: must be auto, any, tool or none"},
	{Name: "tool_choice tool without name", Body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"tool"}}`, Want: "tool_choice.name: required"},
	{Name: "system image", Body: `{"model":"m","max_tokens":1,"system":[{"type":"image"}],"messages":[{"role":"user","content":"x"}]}`, Want: `system[0].type: "image" is not supported`},
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

// TestEncodeErrorShape: the Messages API error body, with and without a
// code of Bulwark's own; the type of each status (errorTypes) is checked by
// the conformance suite.
func TestEncodeErrorShape(t *testing.T) {
	t.Parallel()
	got := []string{string(EncodeError(400, "", "msg")), string(EncodeError(503, "service_degraded", "msg"))}
	want := []string{
		`{"type":"error","error":{"type":"invalid_request_error","message":"msg"}}`,
		`{"type":"error","error":{"type":"overloaded_error","message":"msg","details":{"error_code":"service_degraded"}}}`,
	}
	if d := wiretest.Diff(want, got); d != "" {
		t.Errorf("EncodeError bodies (-want +got):\n%s", d)
	}
}

// errorTypes is the error.type EncodeError writes for each status, Anthropic's.
var errorTypes = map[int]string{
	400: "invalid_request_error",
	401: "authentication_error",
	402: "billing_error",
	403: "permission_error",
	404: "not_found_error",
	413: "request_too_large",
	422: "invalid_request_error",
	429: "rate_limit_error",
	500: "api_error",
	503: "overloaded_error",
	504: "timeout_error",
	529: "overloaded_error",
}
