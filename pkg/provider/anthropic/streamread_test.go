package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/secret"
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

// The streams of Anthropic's "Streaming Messages" (a basic request, one
// with tool use, one with extended thinking) and the golden file of our
// own writer.
func TestReadStreamGolden(t *testing.T) {
	t.Parallel()
	tool := wiretest.Responses()[1].Value
	tool.Model = "claude-sonnet-4-5"
	tests := []struct {
		file   string
		want   *llm.Response
		deltas []llm.Delta
	}{
		{"stream_docs_text.sse", &llm.Response{
			ID: "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", Model: "claude-opus-4-6",
			Content:    []llm.Block{{Type: llm.BlockText, Text: "Hello!"}},
			StopReason: llm.StopEndTurn,
			// output_tokens is cumulative: message_delta's replaces
			// message_start's.
			Usage: llm.Usage{InputTokens: 25, OutputTokens: 15},
		}, []llm.Delta{
			{Index: 0, Type: llm.BlockText},
			{Index: 0, Text: "Hello"},
			{Index: 0, Text: "!"},
		}},
		{"stream_docs_tool_use.sse", &llm.Response{
			ID: "msg_014p7gG3wDgGV9EUtLvnow3U", Model: "claude-opus-4-6",
			Content: []llm.Block{
				{Type: llm.BlockText, Text: "Okay, let's check the weather for San Francisco, CA:"},
				{Type: llm.BlockToolUse, ToolUseID: "toolu_01T1x1fJ34qAmk2tNTrN7Up6", ToolName: "get_weather",
					Input: json.RawMessage(`{"location":"San Francisco, CA","unit":"fahrenheit"}`)},
			},
			StopReason: llm.StopToolUse,
			Usage:      llm.Usage{InputTokens: 472, OutputTokens: 89},
		}, nil},
		// The thinking block is dropped, as DecodeResponse drops it, and
		// the text after it becomes block 0; cached prompt tokens count as
		// input.
		{"stream_docs_thinking.sse", &llm.Response{
			ID: "msg_01AbCdEfGhIjKlMnOpQrStUv", Model: "claude-sonnet-4-5",
			Content:    []llm.Block{{Type: llm.BlockText, Text: "27 * 453 = 12,231"}},
			StopReason: llm.StopEndTurn,
			Usage:      llm.Usage{InputTokens: 2088, OutputTokens: 112},
		}, []llm.Delta{
			{Index: 0, Type: llm.BlockText},
			{Index: 0, Text: "27 * 453 = 12,231"},
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
// the answer it was written from, and as DecodeResponse reads
// EncodeResponse's body.
func TestReadStreamRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Responses() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			if err := WriteStream(&b, tc.Value, ""); err != nil {
				t.Fatal(err)
			}
			// A byte at a time: no piece may depend on how reads split.
			var deltas []llm.Delta
			got, err := ReadStream(iotest.OneByteReader(&b), func(d llm.Delta) { deltas = append(deltas, d) })
			if err != nil {
				t.Fatal(err)
			}
			if d := wiretest.Diff(tc.Value, got); d != "" {
				t.Errorf("ReadStream(WriteStream(x)) != x (-want +got):\n%s", d)
			}
			providertest.CheckDeltas(t, deltas, got.Content)
		})
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
			sw := NewStreamWriter(&b, tc.Value.ID, tc.Value.Model)
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

// message_delta may carry every count (the API does today); each replaces
// message_start's, which a stream that starts before the prompt was
// counted reports as 0.
func TestReadStreamUsage(t *testing.T) {
	t.Parallel()
	stream := "event: message_start\n" +
		`data: {"type":"message_start","message":{"id":"msg_1","model":"m","usage":{"input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}}}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":849,"cache_creation_input_tokens":100,"cache_read_input_tokens":50,"output_tokens":47}}` + "\n\n" +
		"event: message_stop\n" + `data: {"type":"message_stop"}` + "\n\n"
	got, _, err := readStream(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	want := &llm.Response{ID: "msg_1", Model: "m", Content: []llm.Block{}, StopReason: llm.StopMaxTokens,
		Usage: llm.Usage{InputTokens: 999, OutputTokens: 47}}
	if d := wiretest.Diff(want, got); d != "" {
		t.Errorf("answer (-want +got):\n%s", d)
	}
}

func TestReadStreamFailures(t *testing.T) {
	t.Parallel()
	start := "event: message_start\n" + `data: {"type":"message_start","message":{"id":"msg_1","model":"m","usage":{"input_tokens":5}}}` + "\n\n" +
		"event: content_block_start\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
		"event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}` + "\n\n"
	stop := "event: message_stop\n" + `data: {"type":"message_stop"}` + "\n\n"
	overloaded := `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
	tests := []struct {
		name, stream string
		// event is the error event's data, or want a part of the error.
		event, want string
	}{
		{name: "ends before message_stop", stream: start, want: "ended before message_stop"},
		{name: "ends in the middle of an event", stream: start + "event: message_stop\ndata: {\"ty", want: "ended before message_stop"},
		{name: "an event that is not JSON", stream: start + "event: content_block_delta\ndata: {oops\n\n", want: "content_block_delta event: invalid JSON"},
		{name: "a delta for a block that did not start", want: "content block 3, which did not start",
			stream: start + `data: {"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"x"}}` + "\n\n" + stop},
		{name: "a block started twice", want: "content block 0 started twice",
			stream: start + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" + stop},
		{name: "a tool input that is not an object", want: "content[1].input",
			stream: start + `data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}` + "\n\n" +
				`data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"[1,"}}` + "\n\n" + stop},
		{name: "an error event mid-stream", stream: start + "event: error\ndata: " + overloaded + "\n\n", event: overloaded},
		{name: "an error without its event name", stream: start + "data: " + overloaded + "\n\n", event: overloaded},
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

// An error event is classified by the same table as an error answer: a
// mid-stream overloaded_error is overloaded, as a 529 is.
func TestStreamErrorEventClass(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		event string
		want  llm.Class
	}{
		{`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, llm.ClassOverloaded},
		{`{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`, llm.ClassTransient},
		{`{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your rate limit"}}`, llm.ClassRateLimited},
		{`{"type":"error","error":{"type":"something_new","message":"?"}}`, llm.ClassTransient},
	} {
		err := wire(secret.String{}).Failure(&provider.Reply{Status: 200, Body: []byte(tt.event)}, time.Now())
		if class, _ := llm.ClassOf(err); class != tt.want {
			t.Errorf("%s: class %s, want %s", tt.event, class, tt.want)
		}
	}
}

// EncodeStreamRequest is EncodeRequest plus "stream": true, which the
// compat endpoint's decoder reads.
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
		if want := strings.TrimSuffix(string(plain), "}") + `,"stream":true}`; string(body) != want {
			t.Errorf("%s: stream body\n%s\nwant\n%s", tc.Name, body, want)
		}
		info, req, err := DecodeRequest(body)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Stream {
			t.Errorf("%s: info %+v", tc.Name, info)
		}
		if d := wiretest.Diff(tc.Value, req); d != "" {
			t.Errorf("%s: request (-want +got):\n%s", tc.Name, d)
		}
	}
}
