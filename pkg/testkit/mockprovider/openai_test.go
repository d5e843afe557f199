package mockprovider

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

type chatReply struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role      string         `json:"role"`
			Content   *string        `json:"content"`
			ToolCalls []chatToolCall `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage map[string]int `json:"usage"`
}

func TestChatResponseShape(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 600, TPM: 60000}})
	prompt := "Why did the OTA update fail on car 17?"
	r := b.chat(t, "sk-openai-1", map[string]any{
		"model":       "gpt-test",
		"max_tokens":  100,
		"temperature": 0.5,
		"messages": []any{
			map[string]any{"role": "system", "content": "be brief"},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": prompt}}},
		},
	})
	wantStatus(t, r, http.StatusOK)
	var got chatReply
	r.decode(t, &got)
	if !strings.HasPrefix(got.ID, "chatcmpl-") {
		t.Errorf("id = %q, want chatcmpl- prefix", got.ID)
	}
	text := Reply(prompt)
	in, out := CountTokens("be brief"+prompt), CountTokens(text)
	if len(got.Choices) != 1 {
		t.Fatalf("choices = %d, want 1: %s", len(got.Choices), r.body)
	}
	c := got.Choices[0]
	if diff := cmp.Diff(
		[]any{"chat.completion", b.clock.Now().Unix(), "gpt-test", 0, "assistant", text, "stop", 0,
			map[string]int{"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out}},
		[]any{got.Object, got.Created, got.Model, c.Index, c.Message.Role, deref(c.Message.Content), c.FinishReason, len(c.Message.ToolCalls), got.Usage},
	); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}

	wantHeaders := map[string]string{
		"x-ratelimit-limit-requests":     "600",
		"x-ratelimit-remaining-requests": "599",
		"x-ratelimit-reset-requests":     "100ms", // 1 request at 10/s
		"x-ratelimit-limit-tokens":       "60000",
		// OpenAI keeps the admission charge, prompt + max_tokens: no refund.
		"x-ratelimit-remaining-tokens": itoa(60000 - in - 100),
		"x-ratelimit-reset-tokens":     formatOpenAIDuration(msFor(in+100, 1000)),
	}
	for name, want := range wantHeaders {
		if got := r.header.Get(name); got != want {
			t.Errorf("header %s = %q, want %q", name, got, want)
		}
	}
	if id := r.header.Get("x-request-id"); !strings.HasPrefix(id, "req_") {
		t.Errorf("x-request-id = %q", id)
	}
}

func TestChatMaxTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{TPM: 100000}})
	prompt := "a long enough prompt to be cut by a small max_tokens"
	full := Reply(prompt)
	tests := []struct {
		name       string
		body       map[string]any
		wantText   string
		wantFinish string
		reserve    int // tokens held at admission beyond the input
	}{
		{"max_tokens cuts", chatText(prompt, 4), full[:16], "length", 4},
		{"max_completion_tokens wins", with(chatText(prompt, 100), "max_completion_tokens", 2), full[:8], "length", 2},
		{"stop string", with(chatText(prompt, 100), "stop", ": "), full[:strings.Index(full, ": ")], "stop", 100},
		{"stop list", with(chatText(prompt, 100), "stop", []string{"zzz", "answer"}), "mock ", "stop", 100},
		{"no limit: default reserve, no cut", map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": prompt}}},
			full, "stop", OpenAIMaxTokensDefault},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.chat(t, "k-"+tt.name, tt.body)
			wantStatus(t, r, http.StatusOK)
			var got chatReply
			r.decode(t, &got)
			c := got.Choices[0]
			if deref(c.Message.Content) != tt.wantText || c.FinishReason != tt.wantFinish || got.Usage["completion_tokens"] != CountTokens(tt.wantText) {
				t.Errorf("got %q %s %d, want %q %s %d", deref(c.Message.Content), c.FinishReason, got.Usage["completion_tokens"],
					tt.wantText, tt.wantFinish, CountTokens(tt.wantText))
			}
		})
	}
}

func TestChatInvalidRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	user := []any{map[string]any{"role": "user", "content": "x"}}
	tests := []struct {
		name    string
		key     string
		body    any
		status  int
		errType string
		msg     string
		param   string // "": null
	}{
		{"no key", "", chatText("x", 5), 401, "invalid_request_error", "API key", ""},
		{"no model", "k", map[string]any{"messages": user}, 400, "invalid_request_error", "model", ""},
		{"no messages", "k", map[string]any{"model": "m", "messages": []any{}}, 400, "invalid_request_error", "messages", ""},
		{"bad role", "k", map[string]any{"model": "m", "messages": []any{map[string]any{"role": "robot", "content": "x"}}}, 400, "invalid_request_error", "role", ""},
		{"tool without id", "k", map[string]any{"model": "m", "messages": []any{map[string]any{"role": "tool", "content": "x"}}}, 400, "invalid_request_error", "tool_call_id", ""},
		{"max_tokens 0", "k", map[string]any{"model": "m", "max_tokens": 0, "messages": user}, 400, "invalid_request_error", "max_tokens", ""},
		{"temperature", "k", map[string]any{"model": "m", "temperature": 2.5, "messages": user}, 400, "invalid_request_error", "temperature", ""},
		{"stream not a boolean", "k", map[string]any{"model": "m", "stream": "yes", "messages": user}, 400, "invalid_request_error", "stream", ""},
		{"bad tool type", "k", map[string]any{"model": "m", "messages": user, "tools": []any{map[string]any{"type": "web"}}}, 400, "invalid_request_error", "tools", ""},
		{"bad json", "k", "[", 400, "invalid_request_error", "JSON", ""},
		{"max_tokens above gpt-4o's", "k", map[string]any{"model": "gpt-4o-2024-08-06", "max_tokens": 16_385, "messages": user}, 400, "invalid_request_error",
			"max_tokens is too large: 16385. This model supports at most 16384 completion tokens", "max_tokens"},
		{"max_completion_tokens above gpt-4o-mini's", "k", map[string]any{"model": "gpt-4o-mini", "max_completion_tokens": 20_000, "messages": user}, 400,
			"invalid_request_error", "max_completion_tokens is too large: 20000.", "max_completion_tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.chat(t, tt.key, tt.body)
			wantStatus(t, r, tt.status)
			var e openAIErrorBody
			r.decode(t, &e)
			if e.Error.Type != tt.errType || !strings.Contains(e.Error.Message, tt.msg) {
				t.Errorf("body = %s, want %s mentioning %q", r.body, tt.errType, tt.msg)
			}
			param := "null"
			if tt.param != "" {
				param = `"` + tt.param + `"`
			}
			if !strings.Contains(string(r.body), `"param":`+param) {
				t.Errorf("body lacks param:%s: %s", param, r.body)
			}
		})
	}
}

// chatTools is a Chat Completions request offering the named tools.
func chatTools(prompt string, tools ...string) map[string]any {
	body := chatText(prompt, 200)
	var list []any
	for _, name := range tools {
		list = append(list, map[string]any{"type": "function", "function": map[string]any{
			"name": name, "description": "d", "parameters": map[string]any{"type": "object"}}})
	}
	body["tools"] = list
	return body
}

func TestChatToolCalls(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	type call struct{ ID, Name, Args string }
	args := func(q string) string { return string(ToolCallInput(q)) }

	tests := []struct {
		name string
		body map[string]any
		want []call
	}{
		{"first tool", chatTools("diagnose", "fetch_logs", "search_kb"), []call{{"call_1", "fetch_logs", args("diagnose")}}},
		{"named tool", chatTools("try search_kb", "fetch_logs", "search_kb"), []call{{"call_1", "search_kb", args("try search_kb")}}},
		{"parallel", chatTools("fetch_logs then search_kb", "fetch_logs", "search_kb"),
			[]call{{"call_1", "fetch_logs", args("fetch_logs then search_kb")}, {"call_2", "search_kb", args("fetch_logs then search_kb")}}},
		{"parallel_tool_calls false", with(chatTools("fetch_logs then search_kb", "fetch_logs", "search_kb"), "parallel_tool_calls", false),
			[]call{{"call_1", "fetch_logs", args("fetch_logs then search_kb")}}},
		{"tool_choice function", with(chatTools("fetch_logs", "fetch_logs", "search_kb"), "tool_choice",
			map[string]any{"type": "function", "function": map[string]any{"name": "search_kb"}}),
			[]call{{"call_1", "search_kb", args("fetch_logs")}}},
		{"tool_choice required", with(chatTools("x", "fetch_logs"), "tool_choice", "required"), []call{{"call_1", "fetch_logs", args("x")}}},
		{"tool_choice none", with(chatTools("fetch_logs", "fetch_logs"), "tool_choice", "none"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.chat(t, "k", tt.body)
			wantStatus(t, r, http.StatusOK)
			var got chatReply
			r.decode(t, &got)
			c := got.Choices[0]
			if tt.want == nil {
				if c.FinishReason != "stop" || c.Message.Content == nil {
					t.Fatalf("want a text answer, got %s", r.body)
				}
				return
			}
			if c.FinishReason != "tool_calls" || c.Message.Content != nil {
				t.Errorf("finish_reason %q content %v, want tool_calls and null content", c.FinishReason, c.Message.Content)
			}
			var calls []call
			for _, tc := range c.Message.ToolCalls {
				if tc.Type != "function" {
					t.Errorf("type = %q, want function", tc.Type)
				}
				calls = append(calls, call{tc.ID, tc.Function.Name, tc.Function.Arguments})
			}
			if diff := cmp.Diff(tt.want, calls); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestChatToolResults(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	body := chatTools("", "fetch_logs", "search_kb")
	body["messages"] = []any{
		map[string]any{"role": "user", "content": "fetch_logs and search_kb"},
		map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{
			map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "fetch_logs", "arguments": `{"query":"q"}`}},
			map[string]any{"id": "call_2", "type": "function", "function": map[string]any{"name": "search_kb", "arguments": `{"query":"q"}`}},
		}},
		map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "log line"},
		map[string]any{"role": "tool", "tool_call_id": "call_2", "content": []any{map[string]any{"type": "text", "text": "kb entry"}}},
	}
	r := b.chat(t, "k", body)
	wantStatus(t, r, http.StatusOK)
	var got chatReply
	r.decode(t, &got)
	if c := got.Choices[0]; deref(c.Message.Content) != "tool results: log line; kb entry" || c.FinishReason != "stop" {
		t.Errorf("answer = %s", r.body)
	}
	want := CountTokens("fetch_logs and search_kb" + `{"query":"q"}` + `{"query":"q"}` + "log line" + "kb entry")
	if got.Usage["prompt_tokens"] != want {
		t.Errorf("prompt_tokens = %d, want %d", got.Usage["prompt_tokens"], want)
	}

	// A new user question after the tool round is answered with tool calls
	// again, numbered on from the earlier ones.
	body["messages"] = append(body["messages"].([]any),
		map[string]any{"role": "assistant", "content": "tool results: log line; kb entry"},
		map[string]any{"role": "user", "content": "now search_kb"})
	r = b.chat(t, "k", body)
	var again chatReply
	r.decode(t, &again)
	if tc := again.Choices[0].Message.ToolCalls; len(tc) != 1 || tc[0].ID != "call_3" || tc[0].Function.Name != "search_kb" {
		t.Errorf("tool_calls = %+v, want one call_3 to search_kb", tc)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// msFor is how long n tokens take to refill at perSecond.
func msFor(n, perSecond int) time.Duration {
	return time.Duration(float64(n) / float64(perSecond) * float64(time.Second))
}
