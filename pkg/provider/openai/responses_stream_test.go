package openai

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/responses"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/wiretest"
)

// respSSE is one event of a Responses stream as written.
type respSSE struct {
	name string // the event: line
	data string
	typ  string
	seq  int
}

// readRespStream splits a stream into its events and checks what every
// event must have: an event: line naming its type, and sequence numbers
// 0, 1, 2, … in order.
func readRespStream(t *testing.T, stream string) []respSSE {
	t.Helper()
	var out []respSSE
	for chunk := range strings.SplitSeq(strings.TrimSuffix(stream, "\n\n"), "\n\n") {
		name, rest, ok := strings.Cut(chunk, "\n")
		name, ok2 := strings.CutPrefix(name, "event: ")
		data, ok3 := strings.CutPrefix(rest, "data: ")
		if !ok || !ok2 || !ok3 {
			t.Fatalf("event %q is not an event: line and a data: line", chunk)
		}
		var head struct {
			Type string `json:"type"`
			Seq  *int   `json:"sequence_number"`
		}
		if err := json.Unmarshal([]byte(data), &head); err != nil || head.Seq == nil {
			t.Fatalf("event data %s: %v (or no sequence_number)", data, err)
		}
		if head.Type != name {
			t.Errorf("event: %s carries type %s", name, head.Type)
		}
		if *head.Seq != len(out) {
			t.Errorf("sequence_number %d, want %d", *head.Seq, len(out))
		}
		out = append(out, respSSE{name: name, data: data, typ: head.Type, seq: *head.Seq})
	}
	return out
}

// TestResponsesStreamWriter writes each shared answer live (its deltas,
// then End) and replayed (End alone), and hands the events to openai-go's
// own accumulator, which checks their fields and rebuilds the response.
func TestResponsesStreamWriter(t *testing.T) {
	t.Parallel()
	for _, tc := range wiretest.Responses() {
		for _, live := range []bool{true, false} {
			name := tc.Name + "/replayed"
			if live {
				name = tc.Name + "/live"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				var b bytes.Buffer
				sw := NewResponsesStreamWriter(&b, "resp_"+tc.Name, "gpt-4o")
				if live {
					for _, d := range providertest.DeltasOf(tc.Value) {
						if err := sw.Delta(d); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := sw.End(tc.Value); err != nil {
					t.Fatal(err)
				}
				events := readRespStream(t, b.String())
				var acc responses.ResponseAccumulator
				for _, ev := range events {
					var u responses.ResponsesServerEventUnion
					if err := json.Unmarshal([]byte(ev.data), &u); err != nil {
						t.Fatalf("%s: %v", ev.typ, err)
					}
					if err := acc.AddEvent(u); err != nil {
						t.Fatalf("accumulator refuses %s: %v", ev.data, err)
					}
				}
				got, err := acc.ReconstructedResponse()
				if err != nil {
					t.Fatal(err)
				}
				checkRespOutput(t, tc.Value, got)
				// The deltas add up to what the final response says.
				snap := acc.Snapshot()
				for i, b := range tc.Value.Content {
					o := snap.Output[i]
					switch b.Type {
					case llm.BlockText:
						if o.Text[0] != b.Text {
							t.Errorf("output %d: streamed %q, want %q", i, o.Text[0], b.Text)
						}
					case llm.BlockToolUse:
						if d := wiretest.Diff(b.Input, json.RawMessage(o.Arguments)); d != "" {
							t.Errorf("output %d arguments (-want +got):\n%s", i, d)
						}
					}
				}
			})
		}
	}
}

// checkRespOutput compares a response's output items with the answer's
// blocks, and its status with the stop reason.
func checkRespOutput(t *testing.T, want *llm.Response, got *responses.Response) {
	t.Helper()
	if len(got.Output) != len(want.Content) {
		t.Fatalf("%d output items, want %d: %s", len(got.Output), len(want.Content), got.RawJSON())
	}
	for i, b := range want.Content {
		switch it := got.Output[i]; b.Type {
		case llm.BlockText:
			if m := it.AsMessage(); len(m.Content) != 1 || m.Content[0].Text != b.Text {
				t.Errorf("output %d: %s, want text %q", i, it.RawJSON(), b.Text)
			}
		case llm.BlockToolUse:
			fc := it.AsFunctionCall()
			if fc.CallID != b.ToolUseID || fc.Name != b.ToolName || wiretest.Diff(b.Input, json.RawMessage(fc.Arguments)) != "" {
				t.Errorf("output %d: %s, want %+v", i, it.RawJSON(), b)
			}
		}
	}
	status := "completed"
	if want.StopReason == llm.StopMaxTokens {
		status = "incomplete"
	}
	if string(got.Status) != status || got.Usage.InputTokens != int64(want.Usage.InputTokens) || got.Usage.OutputTokens != int64(want.Usage.OutputTokens) {
		t.Errorf("status %s usage %s, want %s and %+v", got.Status, got.Usage.RawJSON(), status, want.Usage)
	}
}

// TestResponsesStreamEventSequence pins the documented order of events for
// an answer of text then a function call, and for one cut at max tokens.
func TestResponsesStreamEventSequence(t *testing.T) {
	t.Parallel()
	types := func(resp *llm.Response) []string {
		var b bytes.Buffer
		sw := NewResponsesStreamWriter(&b, "resp_x", "gpt-4o")
		for _, d := range providertest.DeltasOf(resp) {
			if err := sw.Delta(d); err != nil {
				t.Fatal(err)
			}
		}
		if err := sw.End(resp); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ev := range readRespStream(t, b.String()) {
			if len(out) == 0 || out[len(out)-1] != ev.typ || !strings.HasSuffix(ev.typ, ".delta") {
				out = append(out, ev.typ) // runs of deltas as one
			}
		}
		return out
	}
	tool := &llm.Response{StopReason: llm.StopToolUse, Content: []llm.Block{{Type: llm.BlockText, Text: "checking the logs"},
		{Type: llm.BlockToolUse, ToolUseID: "call_1", ToolName: "fetch_logs", Input: json.RawMessage(`{"car":7}`)}}}
	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.completed",
	}
	if got := types(tool); !slices.Equal(got, want) {
		t.Errorf("text and call:\n got %v\nwant %v", got, want)
	}
	cut := &llm.Response{StopReason: llm.StopMaxTokens, Content: []llm.Block{{Type: llm.BlockText, Text: "so far"}}}
	if got := types(cut); got[len(got)-1] != "response.incomplete" {
		t.Errorf("cut answer ends with %s, want response.incomplete", got[len(got)-1])
	}
}

// TestResponsesStreamFail: an error before the response was announced is
// an error event; after it, response.failed with the error in the
// response; both numbered in the stream's sequence.
func TestResponsesStreamFail(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	sw := NewResponsesStreamWriter(&b, "resp_x", "gpt-4o")
	if err := sw.Fail("upstream_failed", "the providers could not answer"); err != nil {
		t.Fatal(err)
	}
	evs := readRespStream(t, b.String())
	var e responses.ResponseErrorEvent
	if err := json.Unmarshal([]byte(evs[0].data), &e); err != nil || len(evs) != 1 || e.Type != "error" ||
		e.Code != "upstream_failed" || e.Message != "the providers could not answer" || e.JSON.Param.Raw() != "null" {
		t.Errorf("before the start: %s (%v)", b.String(), err)
	}

	b.Reset()
	sw = NewResponsesStreamWriter(&b, "resp_x", "gpt-4o")
	if err := sw.Delta(llm.Delta{Index: 0, Type: llm.BlockText, Text: "Hel"}); err != nil {
		t.Fatal(err)
	}
	if err := sw.Fail("stream_interrupted", "cut"); err != nil {
		t.Fatal(err)
	}
	evs = readRespStream(t, b.String())
	last := evs[len(evs)-1]
	var f responses.ResponseFailedEvent
	if err := json.Unmarshal([]byte(last.data), &f); err != nil || f.Type != "response.failed" ||
		f.Response.Status != "failed" || f.Response.Error.Code != "stream_interrupted" || f.Response.Error.Message != "cut" {
		t.Errorf("after the start: %s (%v)", last.data, err)
	}
}
