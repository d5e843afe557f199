package mockprovider

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestAnthropicResponseShape(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 60, TPM: 6000}})

	system := "You diagnose OTA failures."   // 26 bytes
	prompt := "Why did the OTA update fail?" // 28 bytes
	r := b.claude(t, "sk-test-1", map[string]any{
		"model":          "claude-sonnet-test",
		"system":         system,
		"max_tokens":     100,
		"temperature":    0.2,
		"stop_sequences": []string{"NEVER-IN-REPLY"},
		"messages": []any{
			map[string]any{"role": "user", "content": "earlier question"},                                                   // 16
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "earlier answer"}}}, // 14
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": prompt}}},
		},
	})
	wantStatus(t, r, http.StatusOK)

	var got struct {
		ID           string            `json:"id"`
		Type         string            `json:"type"`
		Role         string            `json:"role"`
		Model        string            `json:"model"`
		Content      []json.RawMessage `json:"content"`
		StopReason   string            `json:"stop_reason"`
		StopSequence *string           `json:"stop_sequence"`
		Usage        map[string]int    `json:"usage"`
	}
	r.decode(t, &got)
	if !strings.HasPrefix(got.ID, "msg_") {
		t.Errorf("id = %q, want msg_ prefix", got.ID)
	}
	// Every field of the real shape is present, stop_sequence as null.
	for _, field := range []string{"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"} {
		if _, ok := r.json(t)[field]; !ok {
			t.Errorf("response lacks %q: %s", field, r.body)
		}
	}
	wantInput := CountTokens(system + "earlier question" + "earlier answer" + prompt)
	wantText := Reply(prompt)
	if diff := cmp.Diff(
		[]any{"message", "assistant", "claude-sonnet-test", "end_turn", (*string)(nil), map[string]int{
			"input_tokens": wantInput, "output_tokens": CountTokens(wantText),
			"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
		}},
		[]any{got.Type, got.Role, got.Model, got.StopReason, got.StopSequence, got.Usage},
	); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}
	if len(got.Content) != 1 || string(got.Content[0]) != `{"type":"text","text":`+mustJSON(t, wantText)+`}` {
		t.Errorf("content = %s, want one text block %q", got.Content, wantText)
	}

	// Rate-limit headers on a 200: RPM 60 with one used; TPM 6000 minus
	// input and output (the unused max_tokens went back).
	remainingTokens := 6000 - wantInput - CountTokens(wantText)
	wantHeaders := map[string]string{
		"anthropic-ratelimit-requests-limit":          "60",
		"anthropic-ratelimit-requests-remaining":      "59",
		"anthropic-ratelimit-requests-reset":          "2026-03-01T12:00:01Z", // 1 request at 1/s
		"anthropic-ratelimit-tokens-limit":            "6000",
		"anthropic-ratelimit-tokens-remaining":        itoa(remainingTokens),
		"anthropic-ratelimit-input-tokens-limit":      "6000",
		"anthropic-ratelimit-input-tokens-remaining":  itoa(remainingTokens),
		"anthropic-ratelimit-output-tokens-limit":     "6000",
		"anthropic-ratelimit-output-tokens-remaining": itoa(remainingTokens),
		"anthropic-ratelimit-tokens-reset":            "2026-03-01T12:00:01Z", // < 100 tokens at 100/s
		"anthropic-ratelimit-output-tokens-reset":     "2026-03-01T12:00:01Z",
		"anthropic-ratelimit-input-tokens-reset":      "2026-03-01T12:00:01Z",
		"content-type":                                "application/json",
	}
	for name, want := range wantHeaders {
		if got := r.header.Get(name); got != want {
			t.Errorf("header %s = %q, want %q", name, got, want)
		}
	}
	if id := r.header.Get("request-id"); !strings.HasPrefix(id, "req_") {
		t.Errorf("request-id = %q, want req_ prefix", id)
	}
}

func TestAnthropicSystemBlocksAndToolTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	input := map[string]any{"query": "fault code E42"}
	r := b.claude(t, "k", map[string]any{
		"model":      "m",
		"max_tokens": 50,
		"system":     []any{map[string]any{"type": "text", "text": "part one "}, map[string]any{"type": "text", "text": "part two"}},
		"messages": []any{
			map[string]any{"role": "user", "content": "look up E42"},
			map[string]any{"role": "assistant", "content": []any{
				map[string]any{"type": "tool_use", "id": "toolu_1", "name": "search", "input": input},
			}},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "E42 means battery low"},
				map[string]any{"type": "text", "text": "thanks"},
			}},
		},
	})
	wantStatus(t, r, http.StatusOK)
	var got struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	r.decode(t, &got)
	want := CountTokens("part one " + "part two" + "look up E42" + `{"query":"fault code E42"}` + "E42 means battery low" + "thanks")
	if got.Usage.InputTokens != want {
		t.Errorf("input_tokens = %d, want %d", got.Usage.InputTokens, want)
	}
}

func TestAnthropicInvalidRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	tests := []struct {
		name    string
		headers map[string]string
		body    any
		status  int
		errType string
		msg     string
	}{
		{"no key", claudeHeaders(""), claudeText("x", 10), 401, "authentication_error", "x-api-key"},
		{"no version", map[string]string{"x-api-key": "k"}, claudeText("x", 10), 400, "invalid_request_error", "anthropic-version"},
		{"no max_tokens", claudeHeaders("k"), map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 400, "invalid_request_error", "max_tokens"},
		{"zero max_tokens", claudeHeaders("k"), claudeText("x", 0), 400, "invalid_request_error", "max_tokens"},
		{"max_tokens above the model's", claudeHeaders("k"), map[string]any{"model": "claude-sonnet-4-5-20250929", "max_tokens": 64_001,
			"messages": []any{map[string]any{"role": "user", "content": "x"}}}, 400, "invalid_request_error",
			"max_tokens: 64001 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-4-5-20250929"},
		{"no model", claudeHeaders("k"), map[string]any{"max_tokens": 5, "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 400, "invalid_request_error", "model"},
		{"no messages", claudeHeaders("k"), map[string]any{"model": "m", "max_tokens": 5, "messages": []any{}}, 400, "invalid_request_error", "messages"},
		{"bad role", claudeHeaders("k"), map[string]any{"model": "m", "max_tokens": 5, "messages": []any{map[string]any{"role": "system", "content": "x"}}}, 400, "invalid_request_error", "role"},
		{"bad json", claudeHeaders("k"), "{", 400, "invalid_request_error", "JSON"},
		{"stream not a boolean", claudeHeaders("k"), map[string]any{"model": "m", "max_tokens": 5, "stream": "yes", "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 400, "invalid_request_error", "stream"},
		{"temperature", claudeHeaders("k"), map[string]any{"model": "m", "max_tokens": 5, "temperature": 1.5, "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 400, "invalid_request_error", "temperature"},
		{"unknown tool_choice tool", claudeHeaders("k"), map[string]any{"model": "m", "max_tokens": 5, "tools": []any{map[string]any{"name": "a", "input_schema": map[string]any{}}},
			"tool_choice": map[string]any{"type": "tool", "name": "b"}, "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 400, "invalid_request_error", "tool_choice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.do(t, http.MethodPost, "/v1/messages", tt.headers, tt.body)
			wantStatus(t, r, tt.status)
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
				RequestID string `json:"request_id"`
			}
			r.decode(t, &e)
			if e.Type != "error" || e.Error.Type != tt.errType || !strings.Contains(e.Error.Message, tt.msg) {
				t.Errorf("body = %s, want error %s mentioning %q", r.body, tt.errType, tt.msg)
			}
			if e.RequestID == "" || e.RequestID != r.header.Get("request-id") {
				t.Errorf("request_id %q, request-id header %q: want equal and set", e.RequestID, r.header.Get("request-id"))
			}
		})
	}
	st := b.srv.Stats()
	if got := st.Providers["claude"]; got.Unauthorized != 1 || got.Invalid != int64(len(tests)-1) || got.OK != 0 {
		t.Errorf("claude totals = %+v, want 1 unauthorized and %d invalid", got, len(tests)-1)
	}
}

func TestAnthropicMaxTokensAndStopSequence(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	prompt := "Explain the brake warning on car 17 in detail please"
	full := Reply(prompt)

	tests := []struct {
		name      string
		maxTokens int
		stops     []string
		wantText  string
		wantStop  string
		wantSeq   any
	}{
		{"fits", 1000, nil, full, "end_turn", nil},
		{"cut at max_tokens", 3, nil, full[:12], "max_tokens", nil},
		{"stop sequence", 1000, []string{"brake", ": "}, full[:strings.Index(full, ": ")], "stop_sequence", ": "},
		{"stop after the cut", 3, []string{"brake"}, full[:12], "max_tokens", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := claudeText(prompt, tt.maxTokens)
			if tt.stops != nil {
				body["stop_sequences"] = tt.stops
			}
			r := b.claude(t, "k", body)
			wantStatus(t, r, http.StatusOK)
			m := r.json(t)
			text := m["content"].([]any)[0].(map[string]any)["text"]
			usage := m["usage"].(map[string]any)
			if diff := cmp.Diff(
				[]any{tt.wantText, tt.wantStop, tt.wantSeq, float64(CountTokens(tt.wantText))},
				[]any{text, m["stop_reason"], m["stop_sequence"], usage["output_tokens"]},
			); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// claudeTools is a Messages request offering the named tools.
func claudeTools(prompt string, tools ...string) map[string]any {
	body := claudeText(prompt, 200)
	var list []any
	for _, name := range tools {
		list = append(list, map[string]any{"name": name, "description": "d", "input_schema": map[string]any{"type": "object"}})
	}
	body["tools"] = list
	return body
}

func TestAnthropicToolUse(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	type call struct{ ID, Name, Query string }

	tests := []struct {
		name   string
		body   map[string]any
		want   []call
		noTool bool
	}{
		{"no tool named: first tool", claudeTools("diagnose car 17", "fetch_logs", "search_kb"),
			[]call{{"toolu_1", "fetch_logs", "diagnose car 17"}}, false},
		{"one tool named", claudeTools("use search_kb for E42", "fetch_logs", "search_kb"),
			[]call{{"toolu_1", "search_kb", "use search_kb for E42"}}, false},
		{"two named: parallel calls", claudeTools("run fetch_logs and search_kb", "fetch_logs", "search_kb", "other"),
			[]call{{"toolu_1", "fetch_logs", "run fetch_logs and search_kb"}, {"toolu_2", "search_kb", "run fetch_logs and search_kb"}}, false},
		{"parallel disabled", with(claudeTools("run fetch_logs and search_kb", "fetch_logs", "search_kb"),
			"tool_choice", map[string]any{"type": "auto", "disable_parallel_tool_use": true}),
			[]call{{"toolu_1", "fetch_logs", "run fetch_logs and search_kb"}}, false},
		{"tool_choice names one", with(claudeTools("run fetch_logs", "fetch_logs", "search_kb"),
			"tool_choice", map[string]any{"type": "tool", "name": "search_kb"}),
			[]call{{"toolu_1", "search_kb", "run fetch_logs"}}, false},
		{"tool_choice none: text", with(claudeTools("run fetch_logs", "fetch_logs"), "tool_choice", map[string]any{"type": "none"}), nil, true},
		{"ids continue after earlier calls", map[string]any{
			"model": "m", "max_tokens": 200,
			"tools": claudeTools("", "search_kb")["tools"],
			"messages": []any{
				map[string]any{"role": "user", "content": "first"},
				map[string]any{"role": "assistant", "content": []any{
					map[string]any{"type": "tool_use", "id": "toolu_1", "name": "search_kb", "input": map[string]any{}},
					map[string]any{"type": "tool_use", "id": "toolu_2", "name": "search_kb", "input": map[string]any{}},
				}},
				map[string]any{"role": "user", "content": []any{
					map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"},
					map[string]any{"type": "tool_result", "tool_use_id": "toolu_2", "content": "b"},
				}},
				map[string]any{"role": "assistant", "content": "tool results: a; b"},
				map[string]any{"role": "user", "content": "search_kb again"},
			},
		}, []call{{"toolu_3", "search_kb", "search_kb again"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.claude(t, "k", tt.body)
			wantStatus(t, r, http.StatusOK)
			var got struct {
				Content []struct {
					Type  string          `json:"type"`
					ID    string          `json:"id"`
					Name  string          `json:"name"`
					Input json.RawMessage `json:"input"`
				} `json:"content"`
				StopReason string `json:"stop_reason"`
				Usage      struct {
					OutputTokens int `json:"output_tokens"`
				} `json:"usage"`
			}
			r.decode(t, &got)
			if tt.noTool {
				if got.StopReason != "end_turn" || len(got.Content) != 1 || got.Content[0].Type != "text" {
					t.Fatalf("want a text answer, got %s", r.body)
				}
				return
			}
			if got.StopReason != "tool_use" {
				t.Errorf("stop_reason = %q, want tool_use", got.StopReason)
			}
			var calls []call
			var out strings.Builder
			for _, c := range got.Content {
				if c.Type != "tool_use" {
					t.Fatalf("block type %q, want tool_use only: %s", c.Type, r.body)
				}
				var in struct{ Query string }
				if err := json.Unmarshal(c.Input, &in); err != nil {
					t.Fatalf("input %s: %v", c.Input, err)
				}
				calls = append(calls, call{c.ID, c.Name, in.Query})
				out.WriteString(c.Name)
				out.Write(c.Input)
			}
			if diff := cmp.Diff(tt.want, calls); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if got.Usage.OutputTokens != CountTokens(out.String()) {
				t.Errorf("output_tokens = %d, want %d", got.Usage.OutputTokens, CountTokens(out.String()))
			}
		})
	}
}

func TestAnthropicToolResults(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	body := claudeTools("", "fetch_logs", "search_kb")
	body["messages"] = []any{
		map[string]any{"role": "user", "content": "use fetch_logs and search_kb"},
		map[string]any{"role": "assistant", "content": []any{
			map[string]any{"type": "tool_use", "id": "toolu_1", "name": "fetch_logs", "input": map[string]any{"query": "q"}},
			map[string]any{"type": "tool_use", "id": "toolu_2", "name": "search_kb", "input": map[string]any{"query": "q"}},
		}},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "log line 1"},
			map[string]any{"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
				"content": []any{map[string]any{"type": "text", "text": "kb down"}}},
		}},
	}
	r := b.claude(t, "k", body)
	wantStatus(t, r, http.StatusOK)
	m := r.json(t)
	want := ToolResultsReply([]ToolResult{{Content: "log line 1"}, {Content: "kb down", IsError: true}})
	if want != "tool results: log line 1; error: kb down" {
		t.Fatalf("ToolResultsReply = %q", want)
	}
	if got := m["content"].([]any)[0].(map[string]any)["text"]; got != want || m["stop_reason"] != "end_turn" {
		t.Errorf("answer = %s, want text %q and end_turn", r.body, want)
	}
}

func with(m map[string]any, k string, v any) map[string]any {
	m[k] = v
	return m
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func itoa(n int) string { return strconv.Itoa(n) }
