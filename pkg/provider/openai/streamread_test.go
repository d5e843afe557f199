package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/wiretest"
)

// readStream reads stream with ReadStream and returns what it emitted.
func readStream(t *testing.T, stream string) (*llm.Response, []llm.Delta, error) {
	t.Helper()
	var deltas []llm.Delta
	resp, err := ReadStream(strings.NewReader(stream), func(d llm.Delta) { deltas = append(deltas, d) })
	return resp, deltas, err
}

// The streams of OpenAI's documentation ("Streaming API responses", the
// function calling guide's streaming example), with usage asked for, and
// the golden file of our own writer.
func TestReadStreamGolden(t *testing.T) {
	t.Parallel()
	tool := wiretest.Responses()[1].Value
	tool.Model = "gpt-4o"
	tests := []struct {
		file   string
		want   *llm.Response
		deltas []llm.Delta
	}{
		{"stream_docs_text.sse", &llm.Response{
			ID: "chatcmpl-123", Model: "gpt-4o-mini",
			Content:    []llm.Block{{Type: llm.BlockText, Text: "Hello! How can I assist you today?"}},
			StopReason: llm.StopEndTurn,
			Usage:      llm.Usage{InputTokens: 9, OutputTokens: 9},
		}, []llm.Delta{
			{Index: 0, Type: llm.BlockText, Text: "Hello"},
			{Index: 0, Text: "!"},
			{Index: 0, Text: " How can I assist you today?"},
		}},
		{"stream_docs_tool_calls.sse", &llm.Response{
			ID: "chatcmpl-9b3kPq", Model: "gpt-4o-2024-08-06",
			Content: []llm.Block{
				{Type: llm.BlockToolUse, ToolUseID: "call_DdmO9pD3xa9XTPNJ32zg2hcA", ToolName: "get_weather", Input: json.RawMessage(`{"location":"Paris, France"}`)},
				{Type: llm.BlockToolUse, ToolUseID: "call_7Bq0yGZ2kLrW5sXhN3eJ1mVt", ToolName: "get_weather", Input: json.RawMessage(`{"location":"Bogotá, Colombia"}`)},
			},
			StopReason: llm.StopToolUse,
			Usage:      llm.Usage{InputTokens: 86, OutputTokens: 44},
		}, []llm.Delta{
			{Index: 0, Type: llm.BlockToolUse, ToolUseID: "call_DdmO9pD3xa9XTPNJ32zg2hcA", ToolName: "get_weather"},
			{Index: 0, Text: `{"`},
			{Index: 0, Text: "location"},
			{Index: 0, Text: `":"`},
			{Index: 0, Text: "Paris"},
			{Index: 0, Text: `, France"}`},
			{Index: 1, Type: llm.BlockToolUse, ToolUseID: "call_7Bq0yGZ2kLrW5sXhN3eJ1mVt", ToolName: "get_weather"},
			{Index: 1, Text: `{"location":`},
			{Index: 1, Text: ` "Bogotá, Colombia"}`},
		}},
		{"stream_tool_use_parallel.sse", tool, nil},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			stream, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			got, deltas, err := readStream(t, string(stream))
			if err != nil {
				t.Fatal(err)
			}
			if d := wiretest.Diff(tt.want, got); d != "" {
				t.Errorf("answer (-want +got):\n%s", d)
			}
			if tt.deltas != nil {
				if d := wiretest.Diff(tt.deltas, deltas); d != "" {
					t.Errorf("deltas (-want +got):\n%s", d)
				}
			}
			providertest.CheckDeltas(t, deltas, got.Content)
		})
	}
}

// What WriteStream writes (the compat endpoint's replays) reads back as
// the answer it was written from; without the usage chunk, without usage.
func TestReadStreamRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Responses() {
		for _, usage := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s usage=%t", tc.Name, usage), func(t *testing.T) {
				t.Parallel()
				var b bytes.Buffer
				if err := WriteStream(&b, tc.Value, "", WithUsage(usage)); err != nil {
					t.Fatal(err)
				}
				// A byte at a time: no piece may depend on how reads split.
				var deltas []llm.Delta
				got, err := ReadStream(iotest.OneByteReader(&b), func(d llm.Delta) { deltas = append(deltas, d) })
				if err != nil {
					t.Fatal(err)
				}
				want := *tc.Value
				if !usage {
					want.Usage = llm.Usage{}
				}
				if d := wiretest.Diff(&want, got); d != "" {
					t.Errorf("ReadStream(WriteStream(x)) != x (-want +got):\n%s", d)
				}
				providertest.CheckDeltas(t, deltas, got.Content)
			})
		}
	}
}

// What the compat endpoint writes while an answer streams in (StreamWriter:
// the deltas as they come, then End) reads back as that answer, with
// deltas that add up to it.
func TestReadStreamOfStreamWriter(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Responses() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			sw := NewStreamWriter(&b, tc.Value.ID, tc.Value.Model, WithUsage(true))
			for _, d := range providertest.DeltasOf(tc.Value) {
				if err := sw.Delta(d); err != nil {
					t.Fatal(err)
				}
			}
			if err := sw.End(tc.Value); err != nil {
				t.Fatal(err)
			}
			got, deltas, err := readStream(t, b.String())
			if err != nil {
				t.Fatal(err)
			}
			if d := wiretest.Diff(tc.Value, got); d != "" {
				t.Errorf("answer (-want +got):\n%s", d)
			}
			// A block's start may come apart from its first piece, so the
			// deltas compare by what they add up to.
			providertest.CheckDeltas(t, deltas, got.Content)
		})
	}
}

// What OpenAI-compatible hosts send differently, and corners of OpenAI's
// own streams.
func TestReadStreamVariants(t *testing.T) {
	t.Parallel()
	chunk := func(delta, finish string) string {
		return `data: {"id":"c1","model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + "}]}\n\n"
	}
	done := "data: [DONE]\n\n"
	tests := []struct {
		name   string
		stream string
		want   *llm.Response
	}{
		{"tool calls without an index, each whole (a compatible host)",
			chunk(`{"role":"assistant"}`, "null") +
				chunk(`{"tool_calls":[{"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]}`, "null") +
				chunk(`{"tool_calls":[{"id":"call_b","type":"function","function":{"name":"g","arguments":"{}"}}]}`, `"tool_calls"`) + done,
			&llm.Response{ID: "c1", Model: "m", StopReason: llm.StopToolUse, Content: []llm.Block{
				{Type: llm.BlockToolUse, ToolUseID: "call_a", ToolName: "f", Input: json.RawMessage(`{"x":1}`)},
				{Type: llm.BlockToolUse, ToolUseID: "call_b", ToolName: "g", Input: json.RawMessage(`{}`)},
			}}},
		{"usage on the finish chunk, no usage chunk",
			`data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}` + "\n\n" + done,
			&llm.Response{ID: "c1", Model: "m", StopReason: llm.StopMaxTokens, Usage: llm.Usage{InputTokens: 3, OutputTokens: 1},
				Content: []llm.Block{{Type: llm.BlockText, Text: "Hi"}}}},
		{"a refusal",
			chunk(`{"role":"assistant","content":null,"refusal":""}`, "null") +
				chunk(`{"refusal":"I can't help with that."}`, "null") + chunk(`{}`, `"stop"`) + done,
			&llm.Response{ID: "c1", Model: "m", StopReason: llm.StopRefusal,
				Content: []llm.Block{{Type: llm.BlockText, Text: "I can't help with that."}}}},
		{"an empty answer has an empty text block, as DecodeResponse gives it",
			chunk(`{"role":"assistant","content":""}`, "null") + chunk(`{}`, `"stop"`) + done,
			&llm.Response{ID: "c1", Model: "m", StopReason: llm.StopEndTurn, Content: []llm.Block{{Type: llm.BlockText}}}},
		{"content \"\" before tool calls opens no text block",
			chunk(`{"role":"assistant","content":""}`, "null") +
				chunk(`{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"f","arguments":"{}"}}]}`, `"tool_calls"`) + done,
			&llm.Response{ID: "c1", Model: "m", StopReason: llm.StopToolUse, Content: []llm.Block{
				{Type: llm.BlockToolUse, ToolUseID: "call_a", ToolName: "f", Input: json.RawMessage(`{}`)},
			}}},
		{"only the first choice is the answer",
			`data: {"id":"c1","model":"m","choices":[{"index":1,"delta":{"content":"other"}},{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n" +
				chunk(`{}`, `"stop"`) + done,
			&llm.Response{ID: "c1", Model: "m", StopReason: llm.StopEndTurn, Content: []llm.Block{{Type: llm.BlockText, Text: "Hi"}}}},
		{"CRLF lines, keep-alive comments, an unnamed event field",
			": keep-alive\r\n\r\n" + strings.ReplaceAll(chunk(`{"content":"Hi"}`, `"stop"`), "\n", "\r\n") + "event: message\r\n" + done,
			&llm.Response{ID: "c1", Model: "m", StopReason: llm.StopEndTurn, Content: []llm.Block{{Type: llm.BlockText, Text: "Hi"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, deltas, err := readStream(t, tt.stream)
			if err != nil {
				t.Fatal(err)
			}
			if d := wiretest.Diff(tt.want, got); d != "" {
				t.Errorf("answer (-want +got):\n%s", d)
			}
			providertest.CheckDeltas(t, deltas, got.Content)
		})
	}
}

// A host that sends a tool's name in pieces: the answer has the whole
// name, appended as OpenAI's SDK does; the block's first delta, sent
// before the rest came, only its first piece.
func TestReadStreamNameInPieces(t *testing.T) {
	t.Parallel()
	stream := `data: {"choices":[{"index":0,"delta":{"content":"Let me check."}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"get_","arguments":""}}]}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"weather"}}]},"finish_reason":"tool_calls"}]}` + "\n\n" +
		"data: [DONE]\n\n"
	got, deltas, err := readStream(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	want := &llm.Response{StopReason: llm.StopToolUse, Content: []llm.Block{
		{Type: llm.BlockText, Text: "Let me check."},
		{Type: llm.BlockToolUse, ToolUseID: "call_a", ToolName: "get_weather", Input: json.RawMessage(`{}`)},
	}}
	if d := wiretest.Diff(want, got); d != "" {
		t.Errorf("answer (-want +got):\n%s", d)
	}
	wantDeltas := []llm.Delta{
		{Index: 0, Type: llm.BlockText, Text: "Let me check."},
		{Index: 1, Type: llm.BlockToolUse, ToolUseID: "call_a", ToolName: "get_"},
	}
	if d := wiretest.Diff(wantDeltas, deltas); d != "" {
		t.Errorf("deltas (-want +got):\n%s", d)
	}
}

func TestReadStreamFailures(t *testing.T) {
	t.Parallel()
	text := `data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n"
	errorBody := `{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}`
	tests := []struct {
		name, stream string
		// event is the error event's data, or want a part of the error.
		event, want string
	}{
		{name: "ends before [DONE]", stream: text, want: "ended before data: [DONE]"},
		{name: "ends in the middle of an event", stream: text + "data: [DO", want: "ended before data: [DONE]"},
		{name: "empty", stream: "", want: "ended before data: [DONE]"},
		{name: "a chunk that is not JSON", stream: text + "data: <html>\n\n", want: "chunk: invalid JSON"},
		{name: "arguments that are not an object", want: "tool_calls[0].function.arguments",
			stream: `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"[1]"}}]}}]}` + "\n\ndata: [DONE]\n\n"},
		{name: "an error line mid-stream", stream: text + "data: " + errorBody + "\n\n", event: errorBody},
		{name: "an error object of a compatible host", stream: text + `data: {"object":"error","message":"boom","code":500}` + "\n\n",
			event: `{"object":"error","message":"boom","code":500}`},
		{name: "an event named error", stream: text + "event: error\ndata: upstream failed\n\n", event: "upstream failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := readStream(t, tt.stream)
			var ev *provider.ErrorEvent
			switch {
			case tt.event != "":
				if !errors.As(err, &ev) || string(ev.Body) != tt.event {
					t.Errorf("error %v, want an ErrorEvent of %s", err, tt.event)
				}
			case err == nil || errors.As(err, &ev) || !strings.Contains(err.Error(), tt.want):
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}

	t.Run("a failed read", func(t *testing.T) {
		t.Parallel()
		boom := errors.New("connection reset")
		_, err := ReadStream(iotest.ErrReader(boom), nil)
		if !errors.Is(err, boom) {
			t.Errorf("error %v, want it to wrap %v", err, boom)
		}
	})
}

// EncodeStreamRequest is EncodeRequest plus the two stream fields; the
// compat endpoint's decoder reads them.
func TestEncodeStreamRequest(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Requests() {
		plain, err := EncodeRequest(tc.Value)
		if err != nil {
			t.Fatal(err)
		}
		body, err := EncodeStreamRequest(tc.Value)
		if err != nil {
			t.Fatal(err)
		}
		want := strings.TrimSuffix(string(plain), "}") + `,"stream":true,"stream_options":{"include_usage":true}}`
		if string(body) != want {
			t.Errorf("%s: stream body\n%s\nwant\n%s", tc.Name, body, want)
		}
		info, req, err := DecodeRequest(body)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Stream || !info.IncludeUsage || len(info.Ignored) != 0 {
			t.Errorf("%s: info %+v", tc.Name, info)
		}
		if d := wiretest.Diff(tc.Value, req); d != "" {
			t.Errorf("%s: request (-want +got):\n%s", tc.Name, d)
		}
	}
}
