package mockprovider

// A small server-sent events reader and the accumulation of each format's
// stream into its non-streamed answer, written from the providers' docs
// rather than with the mock's own types, so that a frame the mock gets
// wrong shows here.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// sseMsg is one event as the client read it, and when it arrived.
type sseMsg struct {
	event string
	data  string
	at    time.Time
}

// sseStream reads a streamed answer event by event.
type sseStream struct {
	resp *http.Response
	sent time.Time // when the request went out
	rd   *bufio.Reader
}

// next returns the next event: io.EOF at the clean end of the body,
// another error when the stream broke (io.ErrUnexpectedEOF for a dropped
// connection).
func (s *sseStream) next() (sseMsg, error) {
	var m sseMsg
	for {
		line, err := s.rd.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" && m.event == "" && m.data == "" {
				return m, io.EOF
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // an event cut short
			}
			return m, err
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if m.event == "" && m.data == "" {
				continue
			}
			m.at = time.Now()
			return m, nil
		}
		name, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch name {
		case "event":
			m.event = value
		case "data":
			if m.data != "" {
				m.data += "\n"
			}
			m.data += value
		}
	}
}

// rest reads the events up to the end of the stream, and the error that
// ended it (nil for a clean end).
func (s *sseStream) rest() ([]sseMsg, error) {
	var msgs []sseMsg
	for {
		m, err := s.next()
		if errors.Is(err, io.EOF) {
			return msgs, nil
		}
		if err != nil {
			return msgs, err
		}
		msgs = append(msgs, m)
	}
}

// all reads the whole stream, which must end cleanly.
func (s *sseStream) all(t *testing.T) []sseMsg {
	t.Helper()
	msgs, err := s.rest()
	if err != nil {
		t.Fatalf("reading the stream: %v after %d events", err, len(msgs))
	}
	return msgs
}

// stream sends a request expected to stream and returns it once its
// headers have arrived.
func (b *bundle) stream(t *testing.T, ctx context.Context, path string, header map[string]string, body map[string]any) *sseStream {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+path, strings.NewReader(mustJSON(t, body)))
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	sent := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: status %d, Content-Type %q, want 200 text/event-stream; body %s",
			path, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	return &sseStream{resp: resp, sent: sent, rd: bufio.NewReader(resp.Body)}
}

func (b *bundle) claudeStream(t *testing.T, ctx context.Context, key string, body map[string]any) *sseStream {
	t.Helper()
	return b.stream(t, ctx, "/v1/messages", claudeHeaders(key), with(body, "stream", true))
}

func (b *bundle) chatStream(t *testing.T, ctx context.Context, key string, body map[string]any) *sseStream {
	t.Helper()
	return b.stream(t, ctx, "/v1/chat/completions", openAIHeaders(key), with(body, "stream", true))
}

// claudeAnswer is what a Messages answer says, streamed or not (no id).
type claudeAnswer struct {
	Type         string        `json:"type"`
	Role         string        `json:"role"`
	Model        string        `json:"model"`
	Content      []claudeBlock `json:"content"`
	StopReason   string        `json:"stop_reason"`
	StopSequence *string       `json:"stop_sequence"`
	Usage        struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

type claudeBlock struct {
	Type  string `json:"type"`
	Text  string `json:"text"`
	ID    string `json:"id"`
	Name  string `json:"name"`
	Input string `json:"-"` // the tool input's JSON text
}

// decodeClaudeAnswer reads a non-streamed Messages answer.
func decodeClaudeAnswer(t *testing.T, r reply) claudeAnswer {
	t.Helper()
	var a claudeAnswer
	r.decode(t, &a)
	var raw struct {
		Content []struct {
			Input json.RawMessage `json:"input"`
		} `json:"content"`
	}
	r.decode(t, &raw)
	for i, c := range raw.Content {
		a.Content[i].Input = string(c.Input)
	}
	return a
}

// claudeEvent is the data of any Messages stream event.
type claudeEvent struct {
	Type         string          `json:"type"`
	Index        int             `json:"index"`
	Message      json.RawMessage `json:"message"`
	ContentBlock claudeBlock     `json:"content_block"`
	Delta        struct {
		Type         string  `json:"type"`
		Text         string  `json:"text"`
		PartialJSON  string  `json:"partial_json"`
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	} `json:"delta"`
	Usage struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// accumulateClaude builds the answer a Messages stream carries, checking
// the event flow "Streaming Messages" documents: message_start first,
// blocks started in index order, deltas and stops only for started blocks,
// message_stop last.
func accumulateClaude(t *testing.T, msgs []sseMsg) claudeAnswer {
	t.Helper()
	var a claudeAnswer
	if len(msgs) == 0 || msgs[0].event != "message_start" || msgs[len(msgs)-1].event != "message_stop" {
		t.Fatalf("stream does not run from message_start to message_stop: %v", msgs)
	}
	for _, m := range msgs {
		var e claudeEvent
		if err := json.Unmarshal([]byte(m.data), &e); err != nil {
			t.Fatalf("event %s: %v: %s", m.event, err, m.data)
		}
		if e.Type != m.event {
			t.Fatalf("event %q carries type %q", m.event, e.Type)
		}
		switch m.event {
		case "message_start":
			if err := json.Unmarshal(e.Message, &a); err != nil {
				t.Fatalf("message_start: %v", err)
			}
			if len(a.Content) != 0 || a.StopReason != "" {
				t.Fatalf("message_start carries content or a stop reason: %s", m.data)
			}
		case "content_block_start":
			if e.Index != len(a.Content) {
				t.Fatalf("block %d started after %d blocks", e.Index, len(a.Content))
			}
			if e.ContentBlock.Type == "tool_use" && !strings.Contains(m.data, `"input":{}`) {
				t.Fatalf("tool_use starts without input {}: %s", m.data)
			}
			a.Content = append(a.Content, e.ContentBlock)
		case "content_block_delta", "content_block_stop":
			if e.Index != len(a.Content)-1 {
				t.Fatalf("%s for block %d while block %d is open", m.event, e.Index, len(a.Content)-1)
			}
			b := &a.Content[e.Index]
			switch e.Delta.Type {
			case "text_delta":
				b.Text += e.Delta.Text
			case "input_json_delta":
				b.Input += e.Delta.PartialJSON
			}
		case "message_delta":
			a.StopReason, a.StopSequence = e.Delta.StopReason, e.Delta.StopSequence
			a.Usage.OutputTokens = e.Usage.OutputTokens // cumulative
		case "ping", "message_stop":
		default:
			t.Fatalf("unexpected event %s: %s", m.event, m.data)
		}
	}
	return a
}

// chatAnswer is what a Chat Completions answer says, streamed or not (no
// id).
type chatAnswer struct {
	Model        string
	Created      int64
	Content      *string
	ToolCalls    []chatToolCall
	FinishReason string
	Usage        map[string]int
}

func decodeChatAnswer(t *testing.T, r reply) chatAnswer {
	t.Helper()
	var got chatReply
	r.decode(t, &got)
	c := got.Choices[0]
	return chatAnswer{Model: got.Model, Created: got.Created, Content: c.Message.Content, ToolCalls: c.Message.ToolCalls,
		FinishReason: c.FinishReason, Usage: got.Usage}
}

// chatChunkReply is a chat.completion.chunk as a client reads it.
type chatChunkReply struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Usage   json.RawMessage `json:"usage"` // absent, null, or the usage
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role      string          `json:"role"`
			Content   json.RawMessage `json:"content"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

// chatChunks decodes a Chat Completions stream, which must end with
// data: [DONE], into its chunks.
func chatChunks(t *testing.T, msgs []sseMsg) []chatChunkReply {
	t.Helper()
	if len(msgs) == 0 || msgs[len(msgs)-1].data != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %v", msgs)
	}
	var chunks []chatChunkReply
	for _, m := range msgs[:len(msgs)-1] {
		var c chatChunkReply
		if err := json.Unmarshal([]byte(m.data), &c); err != nil {
			t.Fatalf("chunk: %v: %s", err, m.data)
		}
		if m.event != "" || c.Object != "chat.completion.chunk" || (len(chunks) > 0 && c.ID != chunks[0].ID) {
			t.Fatalf("chunk is not a chat.completion.chunk of the stream: event %q, %s", m.event, m.data)
		}
		chunks = append(chunks, c)
	}
	return chunks
}

// accumulateChat builds the answer a Chat Completions stream carries: the
// role chunk first, content and tool-call pieces appended by index, the
// finish reason, and the usage chunk's usage.
func accumulateChat(t *testing.T, chunks []chatChunkReply) chatAnswer {
	t.Helper()
	var a chatAnswer
	if len(chunks) == 0 || len(chunks[0].Choices) != 1 || chunks[0].Choices[0].Delta.Role != "assistant" {
		t.Fatalf("first chunk is not the role chunk: %+v", chunks)
	}
	a.Model, a.Created = chunks[0].Model, chunks[0].Created
	for _, c := range chunks {
		if len(c.Choices) == 0 {
			if err := json.Unmarshal(c.Usage, &a.Usage); err != nil {
				t.Fatalf("usage chunk: %v", err)
			}
			continue
		}
		ch := c.Choices[0]
		if raw := ch.Delta.Content; len(raw) > 0 && string(raw) != "null" {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatalf("content: %v", err)
			}
			if a.Content == nil {
				a.Content = new(string)
			}
			*a.Content += s
		}
		for _, tc := range ch.Delta.ToolCalls {
			if tc.Index == len(a.ToolCalls) {
				if tc.ID == "" || tc.Type != "function" || tc.Function.Name == "" {
					t.Fatalf("tool call %d starts without id, type or name: %+v", tc.Index, tc)
				}
				a.ToolCalls = append(a.ToolCalls, chatToolCall{ID: tc.ID, Type: tc.Type})
			}
			if tc.Index != len(a.ToolCalls)-1 {
				t.Fatalf("tool call %d piece while call %d is open", tc.Index, len(a.ToolCalls)-1)
			}
			f := &a.ToolCalls[tc.Index].Function
			f.Name += tc.Function.Name
			f.Arguments += tc.Function.Arguments
		}
		if ch.FinishReason != nil {
			a.FinishReason = *ch.FinishReason
		}
	}
	return a
}
