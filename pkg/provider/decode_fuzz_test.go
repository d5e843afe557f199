package provider_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/testkit/wiretest"
)

// FuzzDecodeOpenAIRequest fuzzes the body decoder of the OpenAI-compatible
// POST /v1/chat/completions (see fuzzDecode).
func FuzzDecodeOpenAIRequest(f *testing.F) {
	fuzzDecode(f, "openai", []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"model":"gpt-4o","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":""}}]},{"role":"tool","tool_call_id":"c1","content":"[tool error] boom"},{"role":"user","content":[]}]}`,
		`{"model":"m","messages":[{"role":"developer","content":"d"},{"role":"system","content":[]},{"role":"user","content":"u"}],"n":1,"stop":"x","stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]}`,
		`{"model":"m","messages":[{"role":"user","content":"u"}],"tool_choice":{"type":"function","function":{"name":"f"}},"max_tokens":-1}`,
		`{"model":"m","messages":[{"role":"assistant","refusal":"no"},{"role":"user","content":"u"}],"n":2}`,
		`{"model":"m","messages":[]}`,
		`[]`,
	})
}

// FuzzDecodeAnthropicRequest fuzzes the body decoder of the
// Anthropic-compatible POST /v1/messages (see fuzzDecode).
func FuzzDecodeAnthropicRequest(f *testing.F) {
	fuzzDecode(f, "claude", []string{
		`{"model":"claude-sonnet","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":1,"system":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":null}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}],"is_error":true}]}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"u"}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":true}}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"u"}],"temperature":1.5,"metadata":{"user_id":"x"},"top_k":3}`,
		`{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"u"}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"u"}]}`,
		`null`,
	})
}

// FuzzDecodeResponsesRequest fuzzes the body decoder of the
// OpenAI-compatible POST /v1/responses (see fuzzDecode), from its own
// seeds: it has no golden requests, being no provider's wire.
func FuzzDecodeResponsesRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4o","input":"hi"}`,
		`{"model":"gpt-4o","instructions":"be brief","max_output_tokens":10,"input":[{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"}]}]}`,
		`{"model":"m","input":[{"role":"user","content":"u"},{"role":"assistant","content":[{"type":"output_text","text":"t"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":""},{"type":"function_call_output","call_id":"c1","output":"[tool error] boom"},{"role":"user","content":"more"}]}`,
		`{"model":"m","input":[{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"r"}]}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true}],"tool_choice":{"type":"function","name":"f"}}`,
		`{"model":"m","input":"x","tools":[{"type":"web_search"}],"tool_choice":"required"}`,
		`{"model":"m","input":[{"type":"item_reference","id":"msg_1"}],"previous_response_id":null,"background":false,"store":true}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"[]"}],"max_output_tokens":-1}`,
		`{"model":"m","input":[]}`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	fuzzDecodeWith(f, "responses", func(b []byte) (*llm.Request, error) {
		_, r, err := openai.DecodeResponsesRequest(b)
		return r, err
	})
}

// fuzzDecode fuzzes one compat endpoint's decoder. It returns an error or a
// request that the rest of Bulwark can carry: at least one message, only
// user and assistant turns, only text, tool_use (in assistant turns, with an
// id, a name and a JSON object as input) and tool_result (in user turns,
// with the id of its call) blocks, tools with names and object schemas.
// Either provider's encoder (fallback sends it to the other provider) must
// take it, and its own decoder must take what the encoder wrote, reaching
// a fixed point after one round trip.
func fuzzDecode(f *testing.F, name string, extra []string) {
	var from codec
	for _, c := range codecs {
		if c.name == name {
			from = c
		}
	}
	goldens, err := filepath.Glob(filepath.Join(dirOf(name), "testdata", "request_*.json"))
	if err != nil || len(goldens) == 0 {
		f.Fatalf("no golden requests: %v", err)
	}
	for _, g := range goldens {
		b, err := os.ReadFile(g)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range extra {
		f.Add([]byte(s))
	}
	fuzzDecodeWith(f, name, from.decodeRequest)
}

// fuzzDecodeWith is fuzzDecode's test, of decode, from the seeds f has.
func fuzzDecodeWith(f *testing.F, name string, decode func([]byte) (*llm.Request, error)) {
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decode(body)
		if err != nil {
			if req != nil || err.Error() == "" {
				t.Fatalf("decode: a request %v with the error %q", req, err)
			}
			return
		}
		checkRequest(t, name, req)
		for _, to := range codecs {
			wire, err := to.encodeRequest(req)
			if err != nil {
				t.Fatalf("%s cannot encode what %s decoded: %v", to.name, name, err)
			}
			if !json.Valid(wire) {
				t.Fatalf("%s encoded invalid JSON: %s", to.name, wire)
			}
			once, err := to.decodeRequest(wire)
			if err != nil {
				t.Fatalf("%s cannot decode what it encoded: %v\n%s", to.name, err, wire)
			}
			checkRequest(t, to.name, once)
			again, err := to.encodeRequest(once)
			if err != nil {
				t.Fatal(err)
			}
			twice, err := to.decodeRequest(again)
			if err != nil {
				t.Fatal(err)
			}
			if d := wiretest.Diff(once, twice); d != "" {
				t.Fatalf("%s round trips do not settle (-once +twice):\n%s", to.name, d)
			}
		}
	})
}

// checkRequest checks what every decoded request holds.
func checkRequest(t *testing.T, name string, r *llm.Request) {
	t.Helper()
	if r == nil || r.Model == "" || len(r.Messages) == 0 || r.MaxTokens < 0 || name == "claude" && r.MaxTokens < 1 {
		t.Fatalf("%s: decoded request without model, messages or max_tokens: %+v", name, r)
	}
	for i, m := range r.Messages {
		if m.Role != llm.RoleUser && m.Role != llm.RoleAssistant {
			t.Fatalf("%s: messages[%d].role %q", name, i, m.Role)
		}
		for k, b := range m.Content {
			switch b.Type {
			case llm.BlockText:
			case llm.BlockToolUse:
				if m.Role != llm.RoleAssistant || b.ToolUseID == "" || b.ToolName == "" || !isObject(b.Input) {
					t.Fatalf("%s: messages[%d].content[%d]: tool_use %+v in a %s turn", name, i, k, b, m.Role)
				}
			case llm.BlockToolResult:
				if m.Role != llm.RoleUser || b.ToolUseID == "" {
					t.Fatalf("%s: messages[%d].content[%d]: tool_result %+v in a %s turn", name, i, k, b, m.Role)
				}
			default:
				t.Fatalf("%s: messages[%d].content[%d]: block type %q", name, i, k, b.Type)
			}
		}
	}
	for i, tool := range r.Tools {
		if tool.Name == "" || len(tool.InputSchema) > 0 && !isObject(tool.InputSchema) {
			t.Fatalf("%s: tools[%d] = %+v", name, i, tool)
		}
	}
	if tc := r.ToolChoice; tc != nil {
		switch tc.Mode {
		case llm.ToolChoiceAuto, llm.ToolChoiceAny, llm.ToolChoiceNone:
		case llm.ToolChoiceTool:
			if tc.Name == "" {
				t.Fatalf("%s: tool_choice tool without a name", name)
			}
		default:
			t.Fatalf("%s: tool_choice mode %q", name, tc.Mode)
		}
	}
}

func isObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && m != nil
}
