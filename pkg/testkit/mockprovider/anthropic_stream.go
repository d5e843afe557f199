package mockprovider

// Anthropic Messages streaming, as "Streaming Messages" documents it
// (https://platform.claude.com/docs/en/build-with-claude/streaming,
// formerly docs.anthropic.com/en/api/messages-streaming): named events
// ("event: <type>" and a "data:" line whose JSON carries the same type),
// in the documented flow
//
//	message_start        a Message with empty content, stop_reason null and
//	                     usage {input_tokens, output_tokens: 1}, as the
//	                     page's example shows it
//	content_block_start  per block, in index order: {"type":"text","text":""}
//	                     or {"type":"tool_use","id","name","input":{}}
//	ping                 once, after the first content_block_start
//	content_block_delta  text_delta {text} or input_json_delta {partial_json}
//	content_block_stop
//	message_delta        {stop_reason, stop_sequence} and usage
//	                     {output_tokens}, cumulative
//	message_stop
//
// and, when a stream fault breaks it, "event: error" with
// {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}},
// the page's example of an error sent after the 200 ("Error events").

import "encoding/json"

// anthropicStartMessage is the Message of message_start.
type anthropicStartMessage struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Content      []any          `json:"content"`
	Model        string         `json:"model"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

type anthropicMessageStart struct {
	Type    string                `json:"type"`
	Message anthropicStartMessage `json:"message"`
}

type anthropicBlockStart struct {
	Type         string `json:"type"`
	Index        int    `json:"index"`
	ContentBlock any    `json:"content_block"`
}

type anthropicBlockDelta struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
	Delta any    `json:"delta"`
}

type anthropicTextDelta struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicJSONDelta struct {
	Type        string `json:"type"`
	PartialJSON string `json:"partial_json"`
}

type anthropicBlockStop struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
}

type anthropicMessageDelta struct {
	Type  string                   `json:"type"`
	Delta anthropicStopDelta       `json:"delta"`
	Usage anthropicOutputUsageOnly `json:"usage"`
}

type anthropicStopDelta struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

type anthropicOutputUsageOnly struct {
	OutputTokens int `json:"output_tokens"`
}

// anthropicTypeOnly is an event whose data is its type alone: ping,
// message_stop.
type anthropicTypeOnly struct {
	Type string `json:"type"`
}

// anthropicStreamError is the data of "event: error": the error body
// without request_id, as the streaming page shows it.
type anthropicStreamError struct {
	Type  string               `json:"type"`
	Error anthropicErrorDetail `json:"error"`
}

// anthropicScript renders resp as a Messages stream whose content chunks
// carry at most chunkBytes bytes of text or tool input.
func anthropicScript(resp anthropicResponse, chunkBytes int) *script {
	out := resp.Usage.OutputTokens
	msg := anthropicStartMessage{
		ID: resp.ID, Type: resp.Type, Role: resp.Role, Content: []any{}, Model: resp.Model,
		Usage: anthropicUsage{InputTokens: resp.Usage.InputTokens, OutputTokens: min(1, out)},
	}
	sc := &script{
		head:         []frame{sseEvent("message_start", anthropicMessageStart{Type: "message_start", Message: msg})},
		outputTokens: out,
		fail: func(message string) frame {
			if message == "" {
				message = "Overloaded"
			}
			return sseEvent("error", anthropicStreamError{Type: "error",
				Error: anthropicErrorDetail{Type: "overloaded_error", Message: message}})
		},
	}
	streamed := 0 // bytes of output so far, as CountTokens counts them
	for i, block := range resp.Content {
		var start any
		var text string
		delta := func(p string) any { return anthropicTextDelta{Type: "text_delta", Text: p} }
		switch b := block.(type) {
		case anthropicTextBlock:
			start, text = anthropicTextBlock{Type: "text"}, b.Text
		case anthropicToolUseBlock:
			start, text = anthropicToolUseBlock{Type: "tool_use", ID: b.ID, Name: b.Name, Input: json.RawMessage("{}")}, string(b.Input)
			delta = func(p string) any { return anthropicJSONDelta{Type: "input_json_delta", PartialJSON: p} }
			streamed += len(b.Name) // the name is output too
		}
		sc.body = append(sc.body, sseEvent("content_block_start", anthropicBlockStart{Type: "content_block_start", Index: i, ContentBlock: start}))
		if i == 0 {
			sc.body = append(sc.body, sseEvent("ping", anthropicTypeOnly{Type: "ping"}))
		}
		for _, p := range pieces(text, chunkBytes) {
			streamed += len(p)
			f := sseEvent("content_block_delta", anthropicBlockDelta{Type: "content_block_delta", Index: i, Delta: delta(p)})
			f.content, f.tokens = true, produced(streamed, out)
			sc.body = append(sc.body, f)
		}
		sc.body = append(sc.body, sseEvent("content_block_stop", anthropicBlockStop{Type: "content_block_stop", Index: i}))
	}
	sc.body = append(sc.body,
		sseEvent("message_delta", anthropicMessageDelta{Type: "message_delta",
			Delta: anthropicStopDelta{StopReason: resp.StopReason, StopSequence: resp.StopSequence},
			Usage: anthropicOutputUsageOnly{OutputTokens: out}}),
		sseEvent("message_stop", anthropicTypeOnly{Type: "message_stop"}))
	return sc
}
