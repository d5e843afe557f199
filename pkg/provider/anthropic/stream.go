package anthropic

import (
	"encoding/json"
	"fmt"
	"io"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
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
	streamUsage struct {
		OutputTokens int `json:"output_tokens"`
	}
)

// WriteStream writes a completed answer as a Messages API event stream:
// message_start (usage with the input tokens), ping, then for each block
// content_block_start, a few content_block_delta events (text_delta for
// text, input_json_delta for a tool's input JSON) and content_block_stop,
// then message_delta (stop reason, output tokens) and message_stop. model
// and the id follow EncodeResponse. The caller sets the Content-Type
// (text/event-stream) and flushes.
func WriteStream(w io.Writer, resp *llm.Response, model string) error {
	full, err := outResponseOf(resp, model)
	if err != nil {
		return err
	}
	start := *full
	start.Content = []outBlock{}
	start.StopReason = nil
	start.Usage = wireUsage{InputTokens: full.Usage.InputTokens}
	if err := provider.WriteEvent(w, "message_start", streamMessageStart{Type: "message_start", Message: start}); err != nil {
		return err
	}
	if err := provider.WriteEvent(w, "ping", streamPing{Type: "ping"}); err != nil {
		return err
	}
	for i, b := range full.Content {
		if err := writeBlock(w, i, b); err != nil {
			return err
		}
	}
	if err := provider.WriteEvent(w, "message_delta", streamMessageDelta{
		Type:  "message_delta",
		Delta: streamMessageState{StopReason: full.StopReason},
		Usage: streamUsage{OutputTokens: full.Usage.OutputTokens},
	}); err != nil {
		return err
	}
	return provider.WriteEvent(w, "message_stop", streamPing{Type: "message_stop"})
}

// writeBlock streams one content block: its start with empty content, the
// content in pieces, its stop.
func writeBlock(w io.Writer, index int, b outBlock) error {
	startBlock := b
	var pieces []string
	var deltaType string
	switch b.Type {
	case "text":
		empty := ""
		startBlock.Text = &empty
		pieces = provider.SplitText(*b.Text)
		deltaType = "text_delta"
	case "tool_use":
		startBlock.Input = json.RawMessage("{}")
		pieces = provider.SplitText(string(b.Input))
		deltaType = "input_json_delta"
	default:
		return fmt.Errorf("anthropic: write stream: content[%d]: cannot stream a %s block", index, b.Type)
	}
	if err := provider.WriteEvent(w, "content_block_start", streamBlockStart{Type: "content_block_start", Index: index, ContentBlock: startBlock}); err != nil {
		return err
	}
	for _, p := range pieces {
		d := streamDelta{Type: deltaType}
		if deltaType == "text_delta" {
			d.Text = &p
		} else {
			d.PartialJSON = &p
		}
		if err := provider.WriteEvent(w, "content_block_delta", streamBlockDelta{Type: "content_block_delta", Index: index, Delta: d}); err != nil {
			return err
		}
	}
	return provider.WriteEvent(w, "content_block_stop", streamBlockStop{Type: "content_block_stop", Index: index})
}
