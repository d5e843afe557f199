package openai

import (
	"fmt"
	"io"

	"bulwark/pkg/llm"
)

// StreamOption adjusts one WriteStream call.
type StreamOption func(*streamOptions)

type streamOptions struct {
	includeUsage bool
	created      int64
}

// WithUsage makes the stream end with an extra chunk whose choices are
// empty and whose usage is set, as OpenAI does when the request says
// stream_options.include_usage (RequestInfo.IncludeUsage). Without it no
// usage is sent, since clients that did not ask may not expect a chunk
// without choices.
func WithUsage(include bool) StreamOption {
	return func(o *streamOptions) { o.includeUsage = include }
}

// withCreated fixes the created timestamp, for golden tests.
func withCreated(unix int64) StreamOption {
	return func(o *streamOptions) { o.created = unix }
}

// WriteStream writes a completed answer as a Chat Completions event stream
// of chat.completion.chunk objects: a first chunk with the assistant role,
// the text in a few content chunks, each tool call as a chunk with its
// index, id and name followed by chunks of its arguments, a last chunk with
// an empty delta and the finish_reason, the usage chunk if WithUsage asked
// for it, and "data: [DONE]". model and the id follow EncodeResponse. It
// is StreamWriter.End with no delta written. The caller sets the
// Content-Type (text/event-stream) and flushes.
func WriteStream(w io.Writer, resp *llm.Response, model string, opts ...StreamOption) error {
	if resp == nil {
		return fmt.Errorf("openai: write stream: nil response")
	}
	if model == "" {
		model = resp.Model
	}
	return NewStreamWriter(w, resp.ID, model, opts...).End(resp)
}
