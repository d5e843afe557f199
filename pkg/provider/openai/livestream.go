package openai

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/internal/wirejson"
)

// StreamWriter writes an answer as a Chat Completions event stream while
// it is being written: deltas as they come (Delta), then the end (End),
// which also writes whatever of the final answer no delta carried.
// Replaying a finished answer is End alone (WriteStream). Text blocks go
// to delta.content, tool_use blocks to delta.tool_calls numbered in their
// order. Not safe for concurrent use.
type StreamWriter struct {
	w       io.Writer
	id      string
	model   string
	created int64
	usage   bool

	started bool
	written []string // per block: what its deltas carried so far
	types   []llm.BlockType
	calls   []int // per block: its tool call's index, -1 for text
	nCalls  int
}

// NewStreamWriter returns a writer of one answer with id under model,
// the name the client asked for; WithUsage adds the usage chunk. The
// caller sets the Content-Type (text/event-stream) and flushes.
func NewStreamWriter(w io.Writer, id, model string, opts ...StreamOption) *StreamWriter {
	o := streamOptions{created: time.Now().Unix()}
	for _, opt := range opts {
		opt(&o)
	}
	if id == "" {
		id = provider.NewID("chatcmpl-")
	}
	return &StreamWriter{w: w, id: id, model: model, created: o.created, usage: o.includeUsage}
}

// Delta writes one piece of the answer: the first chunk (the assistant's
// role) before the first piece, a tool call's id and name before its
// arguments, then the piece.
func (s *StreamWriter) Delta(d llm.Delta) error {
	if err := s.start(); err != nil {
		return err
	}
	if d.Index >= len(s.written) {
		if d.Index != len(s.written) {
			return fmt.Errorf("openai: stream: delta for block %d, want block %d", d.Index, len(s.written))
		}
		if err := s.openBlock(llm.Block{Type: d.Type, ToolUseID: d.ToolUseID, ToolName: d.ToolName}); err != nil {
			return err
		}
	}
	if d.Text == "" {
		return nil
	}
	return s.piece(d.Index, d.Text)
}

// End writes what resp holds beyond the deltas written (all of it when
// there were none, in a few pieces per block), the finish reason, the
// usage chunk when asked for, and [DONE].
func (s *StreamWriter) End(resp *llm.Response) error {
	if err := s.start(); err != nil {
		return err
	}
	for i, b := range resp.Content {
		if err := s.finishBlock(i, b); err != nil {
			return err
		}
	}
	finish := finishReasonOf(resp.StopReason)
	if err := provider.WriteEvent(s.w, "", s.chunk(chunkDelta{}, &finish)); err != nil {
		return err
	}
	if s.usage {
		u := usageOf(resp.Usage)
		last := outChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model, Choices: []chunkChoice{}, Usage: &u}
		if err := provider.WriteEvent(s.w, "", last); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(s.w, "data: [DONE]\n\n"); err != nil {
		return fmt.Errorf("sse: write [DONE]: %w", err)
	}
	return nil
}

// finishBlock writes what block i of the final answer holds beyond what
// its deltas carried.
func (s *StreamWriter) finishBlock(i int, b llm.Block) error {
	full := b.Text
	if b.Type == llm.BlockToolUse {
		full = string(wirejson.ObjectOrEmpty(b.Input, "{}"))
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
		return fmt.Errorf("openai: write stream: content[%d]: the streamed part differs from the answer", i)
	}
	for _, p := range provider.SplitText(rest) {
		if err := s.piece(i, p); err != nil {
			return err
		}
	}
	return nil
}

func (s *StreamWriter) start() error {
	if s.started {
		return nil
	}
	s.started = true
	empty := ""
	return provider.WriteEvent(s.w, "", s.chunk(chunkDelta{Role: "assistant", Content: &empty}, nil))
}

// openBlock registers the next block; a tool call's first chunk (index,
// id, name, no arguments) goes out at once.
func (s *StreamWriter) openBlock(b llm.Block) error {
	index := len(s.written)
	s.written = append(s.written, "")
	s.types = append(s.types, b.Type)
	switch b.Type {
	case llm.BlockText:
		s.calls = append(s.calls, -1)
		return nil
	case llm.BlockToolUse:
		n := s.nCalls
		s.nCalls++
		s.calls = append(s.calls, n)
		first := wireToolCall{Index: &n, ID: b.ToolUseID, Type: "function", Function: wireFunctionCall{Name: b.ToolName}}
		return provider.WriteEvent(s.w, "", s.chunk(chunkDelta{ToolCalls: []wireToolCall{first}}, nil))
	default:
		return fmt.Errorf("openai: write stream: content[%d]: a %q block cannot be part of an answer", index, b.Type)
	}
}

// piece writes p as the next part of block i: content, or its call's
// arguments.
func (s *StreamWriter) piece(i int, p string) error {
	s.written[i] += p
	if n := s.calls[i]; n >= 0 {
		d := wireToolCall{Index: &n, Function: wireFunctionCall{Arguments: p}}
		return provider.WriteEvent(s.w, "", s.chunk(chunkDelta{ToolCalls: []wireToolCall{d}}, nil))
	}
	return provider.WriteEvent(s.w, "", s.chunk(chunkDelta{Content: &p}, nil))
}

func (s *StreamWriter) chunk(d chunkDelta, finish *string) outChunk {
	return outChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model,
		Choices: []chunkChoice{{Delta: d, Logprobs: json.RawMessage(nullJSON), FinishReason: finish}}}
}
