package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/internal/wirejson"
)

// doneData is the data of the event that ends a Chat Completions stream.
var doneData = []byte("[DONE]")

// ReadStream reads a Chat Completions event stream (data lines of
// chat.completion.chunk objects, ended by "data: [DONE]") into the answer
// DecodeResponse would have made of the same completion, calling emit with
// each delta as it arrives (see llm.Delta):
//
//   - delta.content pieces are the text block's, delta.tool_calls pieces
//     (by their index) a tool_use block's: its first piece carries id and
//     function.name, the function.arguments pieces are its input JSON.
//     Blocks are numbered in the order they first appear, so the text
//     comes first when it does on the wire (as OpenAI sends it).
//   - A text block opens with its first non-empty piece, so that an answer
//     of tool calls with content "" has no text block; an answer with
//     neither text nor tool calls gets an empty one at the end, as
//     DecodeResponse gives it.
//   - delta.refusal pieces stream as text and make the stop reason
//     refusal.
//   - finish_reason maps through StopReasonOf; the usage is the last
//     chunk's that has one (the final "choices": [] chunk that
//     stream_options.include_usage asks for; some compatible hosts put it
//     on the finish chunk).
//   - Only the first choice is read (n is always 1). The id and model are
//     the first non-empty ones: Azure opens with a chunk of prompt filter
//     results that has neither.
//
// An error sent in the stream ("data: {"error":{…}}", or an event named
// error) is a *provider.ErrorEvent holding its data. A stream that ends
// before [DONE], a chunk that is not JSON or tool arguments that are not a
// JSON object are errors.
//
// Unlike DecodeResponse, a tool name sent in pieces is only complete in
// the answer (the first delta carries the first piece), and a refusal
// that comes with text is kept with it.
func ReadStream(body io.Reader, emit func(llm.Delta)) (*llm.Response, error) {
	if emit == nil {
		emit = func(llm.Delta) {}
	}
	r := &chunkReader{emit: emit, text: -1, calls: map[int]int{}, last: -1}
	events := provider.NewEventReader(body)
	for {
		ev, err := events.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("openai: read stream: the stream ended before data: [DONE]")
		}
		if err != nil {
			return nil, fmt.Errorf("openai: read stream: %w", err)
		}
		data := bytes.TrimSpace(ev.Data)
		if bytes.Equal(data, doneData) {
			return r.response()
		}
		if err := r.chunk(ev.Name, data); err != nil {
			return nil, err
		}
	}
}

// chunkReader assembles one stream. It is used by one goroutine.
type chunkReader struct {
	emit func(llm.Delta)
	// resp holds the id, model, stop reason and usage read so far.
	resp llm.Response
	// blocks are the answer's blocks in the order they opened.
	blocks []*readBlock
	// text is the text block's place in blocks, -1 before one opened.
	text int
	// calls maps a tool call's key (see callKey) to its place in blocks.
	calls map[int]int
	// last is the key of the last tool call seen, -1 before any.
	last int
	// sawContent says a content field came, if only "".
	sawContent bool
	// refused says a refusal came.
	refused bool
}

// readBlock is one block being assembled.
type readBlock struct {
	typ      llm.BlockType
	id, name string
	// text is the text, or a tool call's arguments.
	text strings.Builder
}

// chunk reads one event's data.
func (r *chunkReader) chunk(event string, data []byte) error {
	if event == "error" {
		return &provider.ErrorEvent{Body: data}
	}
	if len(data) == 0 {
		return nil
	}
	var c wireChunk
	if err := wirejson.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("openai: read stream: chunk: %w", err)
	}
	if wirejson.Present(c.Error) || c.Object == "error" {
		return &provider.ErrorEvent{Body: data}
	}
	if r.resp.ID == "" {
		r.resp.ID = c.ID
	}
	if r.resp.Model == "" {
		r.resp.Model = c.Model
	}
	if c.Usage != nil {
		r.resp.Usage = llm.Usage{InputTokens: c.Usage.PromptTokens, OutputTokens: c.Usage.CompletionTokens}
	}
	for _, ch := range c.Choices {
		if ch.Index == 0 {
			r.choice(ch)
		}
	}
	return nil
}

// choice reads one piece of the answer's choice.
func (r *chunkReader) choice(ch wireChunkChoice) {
	d := ch.Delta
	if d.Content != nil {
		r.sawContent = true
		r.appendText(*d.Content)
	}
	if d.Refusal != nil && *d.Refusal != "" {
		r.refused = true
		r.appendText(*d.Refusal)
	}
	for _, tc := range d.ToolCalls {
		r.toolCall(tc)
	}
	if ch.FinishReason != nil && *ch.FinishReason != "" {
		r.resp.StopReason = StopReasonOf(*ch.FinishReason)
	}
}

// appendText adds a piece of text, opening the text block with the first
// non-empty one.
func (r *chunkReader) appendText(piece string) {
	switch {
	case piece == "":
	case r.text < 0:
		r.text = r.open(&readBlock{typ: llm.BlockText}, piece)
	default:
		r.extend(r.text, piece)
	}
}

// toolCall adds a piece of a tool call, opening its block with the first.
func (r *chunkReader) toolCall(tc wireToolCall) {
	key, known := r.callKey(tc)
	r.last = key
	if !known {
		r.calls[key] = r.open(&readBlock{typ: llm.BlockToolUse, id: tc.ID, name: tc.Function.Name}, tc.Function.Arguments)
		return
	}
	i := r.calls[key]
	b := r.blocks[i]
	if b.id == "" {
		b.id = tc.ID
	}
	// Names are appended, as OpenAI's SDK does: a host may send one in
	// pieces; OpenAI sends it whole in the first and null after.
	b.name += tc.Function.Name
	if tc.Function.Arguments != "" {
		r.extend(i, tc.Function.Arguments)
	}
}

// callKey returns the key of tool call piece tc, and whether its call is
// known: its index. Some compatible hosts send no index, each call whole;
// then a new id is a new call and a piece without one belongs to the last
// call. Their keys are negative, so they never meet an index.
func (r *chunkReader) callKey(tc wireToolCall) (key int, known bool) {
	if tc.Index != nil {
		_, known = r.calls[*tc.Index]
		return *tc.Index, known
	}
	if i, ok := r.calls[r.last]; ok && (tc.ID == "" || tc.ID == r.blocks[i].id) {
		return r.last, true
	}
	return -2 - len(r.calls), false // -1 is "none" (last)
}

// open appends b as the next block with its first piece and emits the
// block's first delta; it returns the block's index.
func (r *chunkReader) open(b *readBlock, piece string) int {
	i := len(r.blocks)
	b.text.WriteString(piece)
	r.blocks = append(r.blocks, b)
	r.emit(llm.Delta{Index: i, Type: b.typ, ToolUseID: b.id, ToolName: b.name, Text: piece})
	return i
}

// extend adds piece to block i and emits it.
func (r *chunkReader) extend(i int, piece string) {
	r.blocks[i].text.WriteString(piece)
	r.emit(llm.Delta{Index: i, Text: piece})
}

// response is the answer once [DONE] came.
func (r *chunkReader) response() (*llm.Response, error) {
	if len(r.blocks) == 0 && r.sawContent {
		r.open(&readBlock{typ: llm.BlockText}, "")
	}
	resp := r.resp
	resp.Content = make([]llm.Block, 0, len(r.blocks))
	calls := 0
	for _, b := range r.blocks {
		if b.typ == llm.BlockText {
			resp.Content = append(resp.Content, llm.Block{Type: llm.BlockText, Text: b.text.String()})
			continue
		}
		input, err := decodeArguments(fmt.Sprintf("tool_calls[%d].function.arguments", calls), b.text.String())
		if err != nil {
			return nil, fmt.Errorf("openai: read stream: %w", err)
		}
		resp.Content = append(resp.Content, llm.Block{Type: llm.BlockToolUse, ToolUseID: b.id, ToolName: b.name, Input: input})
		calls++
	}
	if r.refused {
		resp.StopReason = llm.StopRefusal
	}
	return &resp, nil
}
