package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/responses"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/wiretest"
)

func TestDecodeResponsesRequest(t *testing.T) {
	t.Parallel()
	text := func(s string) llm.Block { return llm.Block{Type: llm.BlockText, Text: s} }
	user := func(b ...llm.Block) llm.Message { return llm.Message{Role: llm.RoleUser, Content: b} }
	temp := 0.2
	providertest.DecodeRequests(t, DecodeResponsesRequest, []providertest.DecodeCase[*ResponsesInfo]{
		{
			Name: "string input, instructions, max_output_tokens, ignored and stateless-safe fields",
			Body: `{"model":"gpt-4o","input":"hi","instructions":"Be brief.","max_output_tokens":77,"temperature":0.2,
				"store":true,"stream":true,"metadata":{"team":"ota"},"top_p":0.5,"text":{"format":{"type":"text"}},"background":false}`,
			Want: &llm.Request{Model: "gpt-4o", MaxTokens: 77, System: "Be brief.", Temperature: &temp,
				Messages: []llm.Message{user(text("hi"))}},
			WantInfo: &ResponsesInfo{Model: "gpt-4o", Stream: true, Metadata: json.RawMessage(`{"team":"ota"}`),
				Ignored: []string{"text", "top_p"}},
		},
		{
			Name: "message items with and without type, parts, system and developer joined after instructions",
			Body: `{"model":"gpt-4o","instructions":"A.","input":[
				{"role":"system","content":"B."},
				{"type":"message","role":"user","content":[{"type":"input_text","text":"one"},{"type":"input_text","text":"two"}]},
				{"type":"message","role":"assistant","id":"msg_1","content":[{"type":"output_text","text":"ok","annotations":[]}]},
				{"role":"developer","content":[{"type":"input_text","text":"C."}]},
				{"role":"user","content":"three"}]}`,
			Want: &llm.Request{Model: "gpt-4o", System: "A.\n\nB.\n\nC.", Messages: []llm.Message{
				user(text("one"), text("two")),
				{Role: llm.RoleAssistant, Content: []llm.Block{text("ok")}},
				user(text("three"))}},
			WantInfo: &ResponsesInfo{Model: "gpt-4o"},
		},
		{
			Name: "function calls join the assistant turn, outputs and the next user text one user turn",
			Body: `{"model":"gpt-4o","tool_choice":"required",
				"tools":[{"type":"function","name":"fetch_logs","description":"logs","parameters":{"type":"object"},"strict":true}],
				"input":[
				{"role":"user","content":"run it"},
				{"role":"assistant","content":"checking"},
				{"type":"function_call","id":"fc_1","call_id":"call_1","name":"fetch_logs","arguments":"{\"car\": 7}"},
				{"type":"function_call","call_id":"call_2","name":"fetch_logs","arguments":""},
				{"type":"function_call_output","call_id":"call_1","output":"3 errors"},
				{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"[tool error] timeout"}]},
				{"role":"user","content":"and?"}]}`,
			Want: &llm.Request{Model: "gpt-4o",
				Tools:      []llm.Tool{{Name: "fetch_logs", Description: "logs", InputSchema: json.RawMessage(`{"type":"object"}`)}},
				ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAny},
				Messages: []llm.Message{
					user(text("run it")),
					{Role: llm.RoleAssistant, Content: []llm.Block{text("checking"),
						{Type: llm.BlockToolUse, ToolUseID: "call_1", ToolName: "fetch_logs", Input: json.RawMessage(`{"car":7}`)},
						{Type: llm.BlockToolUse, ToolUseID: "call_2", ToolName: "fetch_logs", Input: json.RawMessage(`{}`)}}},
					user(llm.Block{Type: llm.BlockToolResult, ToolUseID: "call_1", Text: "3 errors"},
						llm.Block{Type: llm.BlockToolResult, ToolUseID: "call_2", Text: "timeout", IsError: true},
						text("and?")),
				}},
			WantInfo: &ResponsesInfo{Model: "gpt-4o"},
		},
		{
			Name: "a function call with no assistant text before it, tool_choice by name",
			Body: `{"model":"gpt-4o","tool_choice":{"type":"function","name":"f"},"tools":[{"type":"function","name":"f"}],"input":[
				{"role":"user","content":"go"},
				{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
				{"type":"function_call_output","call_id":"c","output":"done"}]}`,
			Want: &llm.Request{Model: "gpt-4o", Tools: []llm.Tool{{Name: "f"}},
				ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "f"},
				Messages: []llm.Message{
					user(text("go")),
					{Role: llm.RoleAssistant, Content: []llm.Block{{Type: llm.BlockToolUse, ToolUseID: "c", ToolName: "f", Input: json.RawMessage(`{}`)}}},
					user(llm.Block{Type: llm.BlockToolResult, ToolUseID: "c", Text: "done"}),
				}},
			WantInfo: &ResponsesInfo{Model: "gpt-4o"},
		},
	})
}

// TestDecodeResponsesRequestRefusals: what needs state or OpenAI's own
// tools, and malformed input, is a 400 naming the parameter.
func TestDecodeResponsesRequestRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, want string
	}{
		{"previous_response_id", `{"model":"m","input":"x","previous_response_id":"resp_1"}`, "previous_response_id: not supported"},
		{"conversation", `{"model":"m","input":"x","conversation":"conv_1"}`, "conversation: not supported"},
		{"background", `{"model":"m","input":"x","background":true}`, "background: true is not supported"},
		{"prompt template", `{"model":"m","input":"x","prompt":{"id":"pmpt_1"}}`, "prompt: stored prompt templates"},
		{"built-in tool", `{"model":"m","input":"x","tools":[{"type":"web_search"}]}`, `tools[0].type: "web_search" is not supported`},
		{"chat-shaped tool", `{"model":"m","input":"x","tools":[{"type":"function","function":{"name":"f"}}]}`, "tools[0].name: required"},
		{"item_reference", `{"model":"m","input":[{"type":"item_reference","id":"msg_1"}]}`, "input[0].type: item_reference is not supported"},
		{"reasoning item", `{"model":"m","input":[{"role":"user","content":"x"},{"type":"reasoning","summary":[]}]}`, "input[1].type: reasoning items"},
		{"image part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, `input[0].content[0].type: "input_image" is not supported`},
		{"no model", `{"input":"x"}`, "model: required"},
		{"no input", `{"model":"m"}`, "input: required"},
		{"input a number", `{"model":"m","input":3}`, "input: must be a string or an array of items"},
		{"only system", `{"model":"m","input":[{"role":"system","content":"x"}]}`, "at least one user or assistant item"},
		{"bad role", `{"model":"m","input":[{"role":"tool","content":"x"}]}`, `input[0].role: "tool" is not supported`},
		{"call without id", `{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, "input[0]: call_id and name are required"},
		{"arguments not an object", `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"[1]"}]}`, "input[0].arguments: must be a JSON object"},
		{"output without call_id", `{"model":"m","input":[{"type":"function_call_output","output":"x"}]}`, "input[0].call_id: required"},
		{"bad tool_choice", `{"model":"m","input":"x","tool_choice":{"type":"function","function":{"name":"f"}}}`, "tool_choice: an object must be"},
		{"negative max_output_tokens", `{"model":"m","input":"x","max_output_tokens":-1}`, "max_output_tokens: must not be negative"},
		{"malformed JSON", `{"model":`, "invalid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := DecodeResponsesRequest([]byte(tt.body))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// TestEncodeResponsesResponse: the answer as a response object that
// openai-go decodes, with items in the answer's order and incomplete
// answers marked so.
func TestEncodeResponsesResponse(t *testing.T) {
	t.Parallel()
	answer := &llm.Response{ID: "resp_abc", Model: "gpt-4o-2024", StopReason: llm.StopToolUse,
		Usage: llm.Usage{InputTokens: 11, OutputTokens: 7},
		Content: []llm.Block{{Type: llm.BlockText, Text: "checking"},
			{Type: llm.BlockToolUse, ToolUseID: "call_1", ToolName: "fetch_logs", Input: json.RawMessage(`{"car": 7}`)}}}
	body, err := encodeResponsesResponse(answer, "gpt-4o", 1700000000)
	if err != nil {
		t.Fatal(err)
	}
	var got responses.Response
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != "resp_abc" || got.Object != "response" || got.Status != "completed" || got.Model != "gpt-4o" ||
		got.CreatedAt != 1700000000 || got.OutputText() != "checking" || got.JSON.ExtraFields["store"].Raw() != "false" {
		t.Errorf("response %s", body)
	}
	if len(got.Output) != 2 {
		t.Fatalf("output %s", body)
	}
	msg, fc := got.Output[0].AsMessage(), got.Output[1].AsFunctionCall()
	if msg.ID != "msg_abc_0" || msg.Status != "completed" || msg.Content[0].Type != "output_text" {
		t.Errorf("message item %+v", msg)
	}
	if fc.ID != "fc_abc_1" || fc.CallID != "call_1" || fc.Name != "fetch_logs" || fc.Arguments != `{"car":7}` || fc.Status != "completed" {
		t.Errorf("function_call item %+v", fc)
	}
	u := got.Usage
	if u.InputTokens != 11 || u.OutputTokens != 7 || u.TotalTokens != 18 || !u.JSON.InputTokensDetails.Valid() || !u.JSON.OutputTokensDetails.Valid() {
		t.Errorf("usage %s", u.RawJSON())
	}
	if got.JSON.IncompleteDetails.Raw() != "null" || got.JSON.Error.Raw() != "null" {
		t.Errorf("incomplete_details or error not null: %s", body)
	}

	cut := &llm.Response{ID: "resp_cut", StopReason: llm.StopMaxTokens, Content: []llm.Block{{Type: llm.BlockText, Text: "so"}}}
	body, err = encodeResponsesResponse(cut, "gpt-4o", 1)
	if err != nil {
		t.Fatal(err)
	}
	want := `"status":"incomplete","background":false,"completed_at":null,"error":null,"incomplete_details":{"reason":"max_output_tokens"}`
	if !strings.Contains(string(body), want) {
		t.Errorf("cut answer %s, want %s", body, want)
	}
	if !strings.Contains(string(body), `"id":"msg_cut_0","type":"message","status":"incomplete"`) {
		t.Errorf("the cut item is not incomplete: %s", body)
	}
}

// TestEncodeResponsesResponseShape pins the whole object, so that a field
// the SDKs read cannot go missing unnoticed.
func TestEncodeResponsesResponseShape(t *testing.T) {
	t.Parallel()
	body, err := encodeResponsesResponse(&llm.Response{ID: "resp_x", StopReason: llm.StopEndTurn,
		Usage: llm.Usage{InputTokens: 2, OutputTokens: 3}, Content: []llm.Block{{Type: llm.BlockText, Text: "hi"}}}, "gpt-4o", 5)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"resp_x","object":"response","created_at":5,"status":"completed","background":false,"completed_at":5,
		"error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4o",
		"output":[{"id":"msg_x_0","type":"message","status":"completed","role":"assistant",
			"content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"hi"}]}],
		"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":false,
		"temperature":1,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1,"truncation":"disabled",
		"usage":{"input_tokens":2,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,
			"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5},"user":null,"metadata":{}}`
	if d := wiretest.Diff(json.RawMessage(want), json.RawMessage(body)); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}
