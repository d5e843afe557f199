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

// Event types of a Responses stream.
const (
	evCreated    = "response.created"
	evInProgress = "response.in_progress"
	evItemAdded  = "response.output_item.added"
	evItemDone   = "response.output_item.done"
	evPartAdded  = "response.content_part.added"
	evPartDone   = "response.content_part.done"
	evTextDelta  = "response.output_text.delta"
	evTextDone   = "response.output_text.done"
	evArgsDelta  = "response.function_call_arguments.delta"
	evArgsDone   = "response.function_call_arguments.done"
	evCompleted  = "response.completed"
	evIncomplete = "response.incomplete"
	evFailed     = "response.failed"
	evError      = "error"
)

// respEvent is one event of a Responses stream; which fields it has
// depends on Type.
type respEvent struct {
	Type           string         `json:"type"`
	SequenceNumber int            `json:"sequence_number"`
	Response       *outRespObject `json:"response,omitempty"`
	OutputIndex    *int           `json:"output_index,omitempty"`
	Item           *outRespItem   `json:"item,omitempty"`
	ItemID         string         `json:"item_id,omitempty"`
	ContentIndex   *int           `json:"content_index,omitempty"`
	Part           *outRespPart   `json:"part,omitempty"`
	Delta          *string        `json:"delta,omitempty"`
	Text           *string        `json:"text,omitempty"`
	Arguments      *string        `json:"arguments,omitempty"`
	Logprobs       *[]struct{}    `json:"logprobs,omitempty"`
	// The error event's fields.
	Code    *string         `json:"code,omitempty"`
	Message *string         `json:"message,omitempty"`
	Param   json.RawMessage `json:"param,omitempty"`
}

// ResponsesStreamWriter writes an answer as a Responses API event stream
// while it is being written: deltas as they come (Delta), then the end
// (End), which also writes whatever of the final answer no delta carried.
// Each llm block is one output item: a text block a message with one
// output_text part, a tool_use block a function_call. The events are
// response.created and response.in_progress before the first item; per
// item output_item.added, (message) content_part.added, output_text.delta
// pieces, output_text.done and content_part.done, or (function call)
// function_call_arguments.delta pieces and .done, then output_item.done;
// and last response.completed, or response.incomplete for an answer cut
// short. Every event is named by its type and numbered by
// sequence_number. Not safe for concurrent use.
type ResponsesStreamWriter struct {
	w       io.Writer
	id      string
	model   string
	created int64

	seq     int
	started bool
	open    int      // index of the item under way, -1 for none
	written []string // per item: what its deltas carried so far
	blocks  []llm.Block
}

// NewResponsesStreamWriter returns a writer of one answer with response
// id id under model, the name the client asked for. The caller sets the
// Content-Type (text/event-stream) and flushes.
func NewResponsesStreamWriter(w io.Writer, id, model string) *ResponsesStreamWriter {
	if id == "" {
		id = provider.NewID("resp_")
	}
	return &ResponsesStreamWriter{w: w, id: id, model: model, created: time.Now().Unix(), open: -1}
}

// Delta writes one piece of the answer: the response's start before the
// first, an item's start before its first piece (and the end of the item
// before it), then the piece.
func (s *ResponsesStreamWriter) Delta(d llm.Delta) error {
	if err := s.start(); err != nil {
		return err
	}
	if d.Index != s.open {
		if d.Index != len(s.written) {
			return fmt.Errorf("openai: responses stream: delta for block %d, want block %d", d.Index, len(s.written))
		}
		if err := s.openItem(llm.Block{Type: d.Type, ToolUseID: d.ToolUseID, ToolName: d.ToolName}); err != nil {
			return err
		}
	}
	if d.Text == "" {
		return nil
	}
	return s.piece(d.Text)
}

// End writes what resp holds beyond the deltas written (all of it when
// there were none, in a few pieces per item), the last item's end, and
// response.completed (response.incomplete when the answer was cut) with
// the whole response.
func (s *ResponsesStreamWriter) End(resp *llm.Response) error {
	if err := s.start(); err != nil {
		return err
	}
	for i, b := range resp.Content {
		if err := s.finishItem(i, b); err != nil {
			return err
		}
	}
	status := respStatus(resp.StopReason)
	if err := s.closeItem(itemStatus(status, s.open, len(resp.Content))); err != nil {
		return err
	}
	now := time.Now().Unix()
	final, err := finalResponse(s.id, s.model, s.created, now, resp)
	if err != nil {
		return err
	}
	ev := evCompleted
	if status == respIncomplete {
		ev = evIncomplete
	}
	return s.emit(respEvent{Type: ev, Response: &final})
}

// Fail ends the stream on an error, as the Responses API does: an error
// event when no response was announced yet, else response.failed with the
// response's status failed and the error in it.
func (s *ResponsesStreamWriter) Fail(code, message string) error {
	if !s.started {
		return s.emit(respEvent{Type: evError, Code: &code, Message: &message, Param: json.RawMessage(nullJSON)})
	}
	failed := respShell(s.id, s.model, s.created)
	failed.Status = respFailed
	failed.Error = &outRespError{Code: code, Message: message}
	return s.emit(respEvent{Type: evFailed, Response: &failed})
}

// finishItem writes what block i of the final answer holds beyond what its
// deltas carried.
func (s *ResponsesStreamWriter) finishItem(i int, b llm.Block) error {
	full := b.Text
	if b.Type == llm.BlockToolUse {
		full = string(wirejson.ObjectOrEmpty(b.Input, "{}"))
	}
	if i >= len(s.written) {
		if err := s.openItem(b); err != nil {
			return err
		}
	}
	rest, ok := provider.Rest(full, s.written[i], b.Type == llm.BlockToolUse)
	if !ok {
		// The deltas and the answer disagree (a lost write): what was
		// sent cannot be taken back; say so rather than send garbage.
		return fmt.Errorf("openai: responses stream: content[%d]: the streamed part differs from the answer", i)
	}
	if rest == "" {
		return nil
	}
	if i != s.open {
		return fmt.Errorf("openai: responses stream: content[%d]: its item was closed before its end", i)
	}
	for _, p := range provider.SplitText(rest) {
		if err := s.piece(p); err != nil {
			return err
		}
	}
	return nil
}

func (s *ResponsesStreamWriter) start() error {
	if s.started {
		return nil
	}
	s.started = true
	shell := respShell(s.id, s.model, s.created)
	if err := s.emit(respEvent{Type: evCreated, Response: &shell}); err != nil {
		return err
	}
	return s.emit(respEvent{Type: evInProgress, Response: &shell})
}

// openItem ends the item under way and starts the next one, b's kind,
// empty.
func (s *ResponsesStreamWriter) openItem(b llm.Block) error {
	if err := s.closeItem(respCompleted); err != nil {
		return err
	}
	index := len(s.written)
	b.Text, b.Input = "", nil
	item, err := respItem(s.id, index, b, respInProgress)
	if err != nil {
		return err
	}
	s.written = append(s.written, "")
	s.blocks = append(s.blocks, b)
	s.open = index
	if b.Type == llm.BlockText {
		item.Content = []outRespPart{}
	} else {
		empty := ""
		item.Arguments = &empty
	}
	if err := s.emit(respEvent{Type: evItemAdded, OutputIndex: &index, Item: &item}); err != nil {
		return err
	}
	if b.Type != llm.BlockText {
		return nil
	}
	part := textPart("")
	return s.emit(respEvent{Type: evPartAdded, OutputIndex: &index, ItemID: item.ID, ContentIndex: new(int), Part: &part})
}

// piece writes p as the next delta of the open item.
func (s *ResponsesStreamWriter) piece(p string) error {
	i := s.open
	s.written[i] += p
	if s.blocks[i].Type == llm.BlockToolUse {
		return s.emit(respEvent{Type: evArgsDelta, OutputIndex: &i, ItemID: itemID(s.id, "fc_", i), Delta: &p})
	}
	return s.emit(respEvent{Type: evTextDelta, OutputIndex: &i, ItemID: itemID(s.id, "msg_", i),
		ContentIndex: new(int), Delta: &p, Logprobs: &[]struct{}{}})
}

// closeItem ends the item under way, if any, with status: its text or
// arguments in full, then the item itself.
func (s *ResponsesStreamWriter) closeItem(status string) error {
	if s.open < 0 {
		return nil
	}
	i := s.open
	s.open = -1
	b := s.blocks[i]
	full := s.written[i]
	if b.Type == llm.BlockToolUse {
		b.Input = []byte(full)
		item, err := respItem(s.id, i, b, status)
		if err != nil {
			return err
		}
		if err := s.emit(respEvent{Type: evArgsDone, OutputIndex: &i, ItemID: item.ID, Arguments: item.Arguments}); err != nil {
			return err
		}
		return s.emit(respEvent{Type: evItemDone, OutputIndex: &i, Item: &item})
	}
	b.Text = full
	item, err := respItem(s.id, i, b, status)
	if err != nil {
		return err
	}
	if err := s.emit(respEvent{Type: evTextDone, OutputIndex: &i, ItemID: item.ID, ContentIndex: new(int),
		Text: &full, Logprobs: &[]struct{}{}}); err != nil {
		return err
	}
	part := textPart(full)
	if err := s.emit(respEvent{Type: evPartDone, OutputIndex: &i, ItemID: item.ID, ContentIndex: new(int), Part: &part}); err != nil {
		return err
	}
	return s.emit(respEvent{Type: evItemDone, OutputIndex: &i, Item: &item})
}

// emit writes ev as an SSE event named by its type, numbered next.
func (s *ResponsesStreamWriter) emit(ev respEvent) error {
	ev.SequenceNumber = s.seq
	s.seq++
	return provider.WriteEvent(s.w, ev.Type, ev)
}
