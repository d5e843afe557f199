package openai

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
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
// for it, and "data: [DONE]". model and the id follow EncodeResponse. The
// caller sets the Content-Type (text/event-stream) and flushes.
func WriteStream(w io.Writer, resp *llm.Response, model string, opts ...StreamOption) error {
	o := streamOptions{created: time.Now().Unix()}
	for _, opt := range opts {
		opt(&o)
	}
	a, err := answerOf(resp, model)
	if err != nil {
		return err
	}
	chunk := func(d chunkDelta, finish *string) outChunk {
		return outChunk{
			ID:      a.id,
			Object:  "chat.completion.chunk",
			Created: o.created,
			Model:   a.model,
			Choices: []chunkChoice{{Delta: d, Logprobs: json.RawMessage(nullJSON), FinishReason: finish}},
		}
	}
	empty := ""
	if err := provider.WriteEvent(w, "", chunk(chunkDelta{Role: "assistant", Content: &empty}, nil)); err != nil {
		return err
	}
	if a.content != nil {
		for _, p := range provider.SplitText(*a.content) {
			if err := provider.WriteEvent(w, "", chunk(chunkDelta{Content: &p}, nil)); err != nil {
				return err
			}
		}
	}
	for i, call := range a.calls {
		first := call
		first.Index = &i
		first.Function.Arguments = ""
		if err := provider.WriteEvent(w, "", chunk(chunkDelta{ToolCalls: []wireToolCall{first}}, nil)); err != nil {
			return err
		}
		for _, p := range provider.SplitText(call.Function.Arguments) {
			d := wireToolCall{Index: &i, Function: wireFunctionCall{Arguments: p}}
			if err := provider.WriteEvent(w, "", chunk(chunkDelta{ToolCalls: []wireToolCall{d}}, nil)); err != nil {
				return err
			}
		}
	}
	if err := provider.WriteEvent(w, "", chunk(chunkDelta{}, &a.finish)); err != nil {
		return err
	}
	if o.includeUsage {
		u := usageOf(resp.Usage)
		last := outChunk{ID: a.id, Object: "chat.completion.chunk", Created: o.created, Model: a.model, Choices: []chunkChoice{}, Usage: &u}
		if err := provider.WriteEvent(w, "", last); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil {
		return fmt.Errorf("sse: write [DONE]: %w", err)
	}
	return nil
}
