package anthropic

import (
	"errors"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
)

// StreamReader assembles a Messages stream an event at a time, as
// ReadStream does, for a transport that carries Anthropic's events in a
// framing of its own rather than as server-sent events: Bedrock's
// InvokeModelWithResponseStream wraps each event's JSON in an AWS
// event-stream message. What each event means, and what is an error, is
// ReadStream's. A StreamReader is used by one goroutine.
type StreamReader struct {
	r    *messageReader
	done bool
}

// NewStreamReader returns a StreamReader that calls emit (nil: nothing)
// with each delta as its event is read.
func NewStreamReader(emit func(llm.Delta)) *StreamReader {
	if emit == nil {
		emit = func(llm.Delta) {}
	}
	return &StreamReader{r: &messageReader{emit: emit, places: map[int]int{}}}
}

// Event reads one event: its name where the transport carries one ("" when
// it does not; the JSON's "type" decides either way) and its JSON data. It
// reports done at message_stop, after which Response returns the answer.
// An "error" event is a *provider.ErrorEvent holding data.
func (s *StreamReader) Event(name string, data []byte) (done bool, err error) {
	if s.done {
		return true, nil // nothing follows message_stop
	}
	s.done, err = s.r.event(provider.Event{Name: name, Data: data})
	return s.done, err
}

// Response returns the assembled answer once Event has reported done.
func (s *StreamReader) Response() (*llm.Response, error) {
	if !s.done {
		return nil, errors.New("anthropic: read stream: the stream ended before message_stop")
	}
	return s.r.response()
}
