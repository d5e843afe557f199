package anthropic

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"strings"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/internal/wirejson"
)

// ReadStream reads a Messages API event stream into the answer
// DecodeResponse would have made of the same message, calling emit with
// each delta as it arrives (see llm.Delta):
//
//   - message_start gives the id, the model and the input tokens.
//   - content_block_start opens a block and emits its first delta (type,
//     and a tool_use block's id and name); text_delta and input_json_delta
//     pieces follow as its text or input JSON. Block types the neutral
//     model cannot carry (thinking, server tools) are skipped, as
//     DecodeResponse drops them, and the blocks after them renumbered.
//   - message_delta gives the stop reason and the usage, whose counts are
//     cumulative: each field it carries (output tokens, and input and
//     cache tokens when present) replaces the earlier one. InputTokens
//     counts cached prompt tokens too, as in DecodeResponse.
//   - message_stop ends the stream. ping and event types added later are
//     ignored, as Anthropic's versioning policy asks.
//
// An "error" event is a *provider.ErrorEvent holding its data, which the
// adapter's error table classifies (a mid-stream overloaded_error is
// overloaded). A stream that ends before message_stop, an event that is
// not JSON, a delta for a block that did not start or a tool input that is
// not a JSON object are errors.
func ReadStream(body io.Reader, emit func(llm.Delta)) (*llm.Response, error) {
	if emit == nil {
		emit = func(llm.Delta) {}
	}
	r := &messageReader{emit: emit, places: map[int]int{}}
	events := provider.NewEventReader(body)
	for {
		ev, err := events.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("anthropic: read stream: the stream ended before message_stop")
		}
		if err != nil {
			return nil, fmt.Errorf("anthropic: read stream: %w", err)
		}
		done, err := r.event(ev)
		if err != nil {
			return nil, err
		}
		if done {
			return r.response()
		}
	}
}

// messageReader assembles one stream. It is used by one goroutine.
type messageReader struct {
	emit func(llm.Delta)
	// resp holds the id, model and stop reason read so far.
	resp llm.Response
	// usage is the latest count of each kind.
	usage wireEventUsage
	// blocks are the answer's blocks in order.
	blocks []*readBlock
	// places maps a wire index to its place in blocks, or skipped.
	places map[int]int
}

// skipped is the place of a block the neutral model cannot carry.
const skipped = -1

// readBlock is one block being assembled.
type readBlock struct {
	typ      llm.BlockType
	id, name string
	// text is the text, or a tool_use block's input JSON.
	text strings.Builder
}

// event reads one event; done reports message_stop.
func (r *messageReader) event(ev provider.Event) (done bool, err error) {
	if ev.Name == "error" {
		return false, &provider.ErrorEvent{Body: ev.Data}
	}
	if len(bytes.TrimSpace(ev.Data)) == 0 {
		return false, nil
	}
	var e wireEvent
	if err := wirejson.Unmarshal(ev.Data, &e); err != nil {
		return false, fmt.Errorf("anthropic: read stream: %s event: %w", ev.Name, err)
	}
	switch e.Type {
	case "error":
		return false, &provider.ErrorEvent{Body: ev.Data}
	case "message_start":
		r.resp.ID, r.resp.Model = e.Message.ID, e.Message.Model
		r.count(e.Message.Usage)
	case "content_block_start":
		return false, r.start(e)
	case "content_block_delta":
		return false, r.delta(e)
	case "message_delta":
		if e.Delta.StopReason != nil {
			r.resp.StopReason = llm.StopReason(*e.Delta.StopReason)
		}
		r.count(e.Usage)
	case "message_stop":
		return true, nil
	}
	return false, nil
}

// count takes the counts u carries, each replacing the one before.
func (r *messageReader) count(u wireEventUsage) {
	r.usage.InputTokens = cmp.Or(u.InputTokens, r.usage.InputTokens)
	r.usage.OutputTokens = cmp.Or(u.OutputTokens, r.usage.OutputTokens)
	r.usage.CacheCreationInputTokens = cmp.Or(u.CacheCreationInputTokens, r.usage.CacheCreationInputTokens)
	r.usage.CacheReadInputTokens = cmp.Or(u.CacheReadInputTokens, r.usage.CacheReadInputTokens)
}

// start opens the block content_block_start e announces.
func (r *messageReader) start(e wireEvent) error {
	if _, dup := r.places[e.Index]; dup {
		return fmt.Errorf("anthropic: read stream: content block %d started twice", e.Index)
	}
	cb := e.ContentBlock
	var b *readBlock
	switch cb.Type {
	case "text":
		b = &readBlock{typ: llm.BlockText}
		b.text.WriteString(cb.Text)
	case "tool_use":
		// Its input starts as {} and streams whole in the deltas.
		b = &readBlock{typ: llm.BlockToolUse, id: cb.ID, name: cb.Name}
	default:
		r.places[e.Index] = skipped
		return nil
	}
	i := len(r.blocks)
	r.places[e.Index] = i
	r.blocks = append(r.blocks, b)
	r.emit(llm.Delta{Index: i, Type: b.typ, ToolUseID: b.id, ToolName: b.name, Text: b.text.String()})
	return nil
}

// delta adds the piece content_block_delta e carries.
func (r *messageReader) delta(e wireEvent) error {
	i, ok := r.places[e.Index]
	if !ok {
		return fmt.Errorf("anthropic: read stream: a delta for content block %d, which did not start", e.Index)
	}
	if i == skipped {
		return nil
	}
	var piece string
	switch e.Delta.Type {
	case "text_delta":
		piece = e.Delta.Text
	case "input_json_delta":
		piece = e.Delta.PartialJSON
	default:
		return nil // citations and other additions
	}
	if piece == "" {
		return nil
	}
	r.blocks[i].text.WriteString(piece)
	r.emit(llm.Delta{Index: i, Text: piece})
	return nil
}

// response is the answer once message_stop came.
func (r *messageReader) response() (*llm.Response, error) {
	resp := r.resp
	resp.Content = make([]llm.Block, 0, len(r.blocks))
	for i, b := range r.blocks {
		if b.typ == llm.BlockText {
			resp.Content = append(resp.Content, llm.Block{Type: llm.BlockText, Text: b.text.String()})
			continue
		}
		input, err := wirejson.Object(fmt.Sprintf("content[%d].input", i), []byte(b.text.String()))
		if err != nil {
			return nil, fmt.Errorf("anthropic: read stream: %w", err)
		}
		resp.Content = append(resp.Content, llm.Block{Type: llm.BlockToolUse, ToolUseID: b.id, ToolName: b.name, Input: input})
	}
	u := r.usage
	resp.Usage = llm.Usage{InputTokens: orZero(u.InputTokens) + orZero(u.CacheCreationInputTokens) + orZero(u.CacheReadInputTokens),
		OutputTokens: orZero(u.OutputTokens)}
	return &resp, nil
}

// orZero is *p, 0 when p is nil.
func orZero(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
