package anthropic

import (
	"encoding/json"
	"fmt"
	"io"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
)

// StreamWriter writes an answer as a Messages API event stream while it
// is being written: deltas as they come (Delta), then the end (End), which
// also writes whatever of the final answer no delta carried. Replaying a
// finished answer is End alone (WriteStream). Not safe for concurrent use.
type StreamWriter struct {
	w     io.Writer
	id    string
	model string

	started bool
	open    int      // index of the block under way, -1 for none
	written []string // per block: what its deltas carried so far
	types   []llm.BlockType
	// liveUsage: message_start went out before the usage was known, so
	// message_delta carries the input tokens too (the SDKs' accumulators
	// take them from there: its counts are whole-message totals).
	liveUsage bool
}

// NewStreamWriter returns a writer of one answer with message id id under
// model, the name the client asked for. The caller sets the Content-Type
// (text/event-stream) and flushes.
func NewStreamWriter(w io.Writer, id, model string) *StreamWriter {
	return &StreamWriter{w: w, id: id, model: model, open: -1}
}

// Delta writes one piece of the answer: the message's start before the
// first, a block's start before its first piece (and the end of the block
// before it), then the piece.
func (s *StreamWriter) Delta(d llm.Delta) error {
	if !s.started {
		s.liveUsage = true
		if err := s.start(0); err != nil {
			return err
		}
	}
	if d.Index != s.open {
		if d.Index != len(s.written) {
			return fmt.Errorf("anthropic: stream: delta for block %d, want block %d", d.Index, len(s.written))
		}
		if err := s.openBlock(llm.Block{Type: d.Type, ToolUseID: d.ToolUseID, ToolName: d.ToolName}); err != nil {
			return err
		}
	}
	if d.Text == "" {
		return nil
	}
	return s.piece(d.Text)
}

// End writes what resp holds beyond the deltas written (all of it when
// there were none, in a few pieces per block), the stop reason and usage,
// and message_stop.
func (s *StreamWriter) End(resp *llm.Response) error {
	if !s.started {
		if err := s.start(resp.Usage.InputTokens); err != nil {
			return err
		}
	}
	for i, b := range resp.Content {
		if err := s.finishBlock(i, b); err != nil {
			return err
		}
	}
	if err := s.closeBlock(); err != nil {
		return err
	}
	u := streamUsage{OutputTokens: resp.Usage.OutputTokens}
	if s.liveUsage {
		in := resp.Usage.InputTokens
		u.InputTokens = &in
	}
	if err := provider.WriteEvent(s.w, "message_delta", streamMessageDelta{
		Type: "message_delta", Delta: streamMessageState{StopReason: stopReasonOf(resp.StopReason)}, Usage: u,
	}); err != nil {
		return err
	}
	return provider.WriteEvent(s.w, "message_stop", streamPing{Type: "message_stop"})
}

// finishBlock writes what block i of the final answer holds beyond what
// its deltas carried.
func (s *StreamWriter) finishBlock(i int, b llm.Block) error {
	if b.Type != llm.BlockText && b.Type != llm.BlockToolUse {
		return fmt.Errorf("anthropic: write stream: content[%d]: cannot stream a %s block", i, b.Type)
	}
	full := b.Text
	if b.Type == llm.BlockToolUse {
		full = string(b.Input)
	}
	if i >= len(s.written) {
		if err := s.openBlock(b); err != nil {
			return err
		}
	}
	rest, ok := provider.Rest(full, s.written[i], b.Type == llm.BlockToolUse)
	if !ok {
		// The deltas and the answer disagree (a lost write): what was
		// sent cannot be taken back; say so rather than send garbage.
		return fmt.Errorf("anthropic: write stream: content[%d]: the streamed part differs from the answer", i)
	}
	if rest == "" {
		return nil
	}
	if i != s.open {
		return fmt.Errorf("anthropic: write stream: content[%d]: its block was closed before its end", i)
	}
	for _, p := range provider.SplitText(rest) {
		if err := s.piece(p); err != nil {
			return err
		}
	}
	return nil
}

func (s *StreamWriter) start(inputTokens int) error {
	s.started = true
	id := s.id
	if id == "" {
		id = provider.NewID("msg_")
	}
	start := outResponse{ID: id, Type: "message", Role: "assistant", Model: s.model, Content: []outBlock{},
		Usage: wireUsage{InputTokens: inputTokens}}
	if err := provider.WriteEvent(s.w, "message_start", streamMessageStart{Type: "message_start", Message: start}); err != nil {
		return err
	}
	return provider.WriteEvent(s.w, "ping", streamPing{Type: "ping"})
}

// openBlock ends the block under way and starts the next one, b's kind,
// empty.
func (s *StreamWriter) openBlock(b llm.Block) error {
	if err := s.closeBlock(); err != nil {
		return err
	}
	index := len(s.written)
	var ob outBlock
	switch b.Type {
	case llm.BlockText:
		empty := ""
		ob = outBlock{Type: "text", Text: &empty}
	case llm.BlockToolUse:
		ob = outBlock{Type: "tool_use", ID: b.ToolUseID, Name: b.ToolName, Input: json.RawMessage("{}")}
	default:
		return fmt.Errorf("anthropic: write stream: content[%d]: cannot stream a %q block", index, b.Type)
	}
	s.written = append(s.written, "")
	s.types = append(s.types, b.Type)
	s.open = index
	return provider.WriteEvent(s.w, "content_block_start", streamBlockStart{Type: "content_block_start", Index: index, ContentBlock: ob})
}

// piece writes p as the next delta of the open block.
func (s *StreamWriter) piece(p string) error {
	d := streamDelta{Type: "text_delta", Text: &p}
	if s.types[s.open] == llm.BlockToolUse {
		d = streamDelta{Type: "input_json_delta", PartialJSON: &p}
	}
	s.written[s.open] += p
	return provider.WriteEvent(s.w, "content_block_delta", streamBlockDelta{Type: "content_block_delta", Index: s.open, Delta: d})
}

func (s *StreamWriter) closeBlock() error {
	if s.open < 0 {
		return nil
	}
	i := s.open
	s.open = -1
	return provider.WriteEvent(s.w, "content_block_stop", streamBlockStop{Type: "content_block_stop", Index: i})
}
