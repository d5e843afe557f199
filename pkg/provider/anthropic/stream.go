package anthropic

import (
	"fmt"
	"io"

	"bulwark/pkg/llm"
)

// Stream event payloads, in the order the Messages API sends them.
type (
	streamMessageStart struct {
		Type    string      `json:"type"`
		Message outResponse `json:"message"`
	}
	streamPing struct {
		Type string `json:"type"`
	}
	streamBlockStart struct {
		Type         string   `json:"type"`
		Index        int      `json:"index"`
		ContentBlock outBlock `json:"content_block"`
	}
	streamBlockDelta struct {
		Type  string      `json:"type"`
		Index int         `json:"index"`
		Delta streamDelta `json:"delta"`
	}
	streamDelta struct {
		Type        string  `json:"type"`
		Text        *string `json:"text,omitempty"`
		PartialJSON *string `json:"partial_json,omitempty"`
	}
	streamBlockStop struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
	streamMessageDelta struct {
		Type  string             `json:"type"`
		Delta streamMessageState `json:"delta"`
		Usage streamUsage        `json:"usage"`
	}
	streamMessageState struct {
		StopReason   *string `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	// streamUsage is message_delta's usage: whole-message totals. The
	// input tokens are there only for a stream whose message_start went
	// out before they were known (the SDKs' accumulators take them from
	// message_delta when present).
	streamUsage struct {
		InputTokens  *int `json:"input_tokens,omitempty"`
		OutputTokens int  `json:"output_tokens"`
	}
)

// WriteStream writes a completed answer as a Messages API event stream:
// message_start (usage with the input tokens), ping, then for each block
// content_block_start, a few content_block_delta events (text_delta for
// text, input_json_delta for a tool's input JSON) and content_block_stop,
// then message_delta (stop reason, output tokens) and message_stop. model
// and the id follow EncodeResponse. It is StreamWriter.End with no delta
// written. The caller sets the Content-Type (text/event-stream) and
// flushes.
func WriteStream(w io.Writer, resp *llm.Response, model string) error {
	if resp == nil {
		return fmt.Errorf("anthropic: write stream: nil response")
	}
	if model == "" {
		model = resp.Model
	}
	return NewStreamWriter(w, resp.ID, model).End(resp)
}
