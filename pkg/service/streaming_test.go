package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"bulwark/pkg/testkit/mockprovider"
)

// streamPace is the mock's pace in these tests: each content chunk a
// token, this far apart.
const streamPace = 30 * time.Millisecond

func streamingSystem(t *testing.T) (*system, *apiProc) {
	t.Helper()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}", mock: mockprovider.Config{
		StreamFirstToken: 100 * time.Millisecond, StreamChunkInterval: streamPace, StreamChunkTokens: 1}})
	api := s.startAPI()
	s.startWorker()
	return s, api
}

// spread checks that content arrived as it was written, not in one burst
// at the end: n chunks over at least half the time the mock took to write
// them.
func spread(t *testing.T, who string, at []time.Time) {
	t.Helper()
	if len(at) < 4 {
		t.Fatalf("%s: %d content chunks, want the answer in many", who, len(at))
	}
	if took, want := at[len(at)-1].Sub(at[0]), time.Duration(len(at)-1)*streamPace/2; took < want {
		t.Fatalf("%s: %d chunks within %s (the provider wrote them over %s): replayed at the end, not streamed",
			who, len(at), took, time.Duration(len(at)-1)*streamPace)
	}
}

// The official OpenAI SDK's streaming helper gets the answer chunk by
// chunk as the provider writes it, and its accumulator ends with what the
// same call answers unstreamed: text, tool calls, finish reason, usage.
func TestOpenAISDKStreamsAsTheProviderWrites(t *testing.T) {
	t.Parallel()
	_, api := streamingSystem(t)
	c := openAIAt(api, devToken)
	ctx := context.Background()

	params := openai.ChatCompletionNewParams{Model: "gpt-4o",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("describe the brake fault of car 12 in detail")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}
	acc, at := openAIStream(t, c, params)
	spread(t, "openai-go text", at)
	plain, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != plain.Choices[0].Message.Content || acc.Choices[0].FinishReason != plain.Choices[0].FinishReason ||
		acc.Usage.PromptTokens != plain.Usage.PromptTokens || acc.Usage.CompletionTokens != plain.Usage.CompletionTokens {
		t.Fatalf("streamed %+v usage %+v\nplain %+v usage %+v", acc.Choices[0], acc.Usage, plain.Choices[0], plain.Usage)
	}

	tools := openai.ChatCompletionNewParams{Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("run fetch_logs and search_kb for car 12")},
		Tools: []openai.ChatCompletionToolUnionParam{
			openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "fetch_logs"}),
			openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "search_kb"}),
		}}
	acc, _ = openAIStream(t, c, tools)
	plain, err = c.Chat.Completions.New(ctx, tools)
	if err != nil {
		t.Fatal(err)
	}
	got, want := acc.Choices[0].Message.ToolCalls, plain.Choices[0].Message.ToolCalls
	if len(got) != 2 || len(want) != 2 || acc.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("streamed tool calls %+v (finish %s), plain %+v", got, acc.Choices[0].FinishReason, want)
	}
	for i := range got {
		if got[i].Function.Name != want[i].Function.Name || !sameJSONText(got[i].Function.Arguments, want[i].Function.Arguments) {
			t.Fatalf("tool call %d: streamed %+v, plain %+v", i, got[i], want[i])
		}
	}
}

// openAIStream runs a streaming call and returns the accumulated answer
// and when each content chunk arrived.
func openAIStream(t *testing.T, c openai.Client, params openai.ChatCompletionNewParams) (openai.ChatCompletionAccumulator, []time.Time) {
	t.Helper()
	acc, at, err := openAIStreamErr(c, params)
	if err != nil {
		t.Fatal(err)
	}
	return acc, at
}

func openAIStreamErr(c openai.Client, params openai.ChatCompletionNewParams) (openai.ChatCompletionAccumulator, []time.Time, error) {
	stream := c.Chat.Completions.NewStreaming(context.Background(), params)
	acc := openai.ChatCompletionAccumulator{}
	var at []time.Time
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		if len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			at = append(at, time.Now())
		}
	}
	if err := stream.Err(); err != nil {
		return acc, at, fmt.Errorf("openai-go stream: %w", err)
	}
	return acc, at, nil
}

func sameJSONText(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

// The official Anthropic SDK likewise, and when Claude is overloaded
// before the first token the answer streams from OpenAI, translated into
// Anthropic's events: the fallback is invisible but for the trailer.
func TestAnthropicSDKStreamsAsTheProviderWrites(t *testing.T) {
	t.Parallel()
	s, api := streamingSystem(t)
	c := anthropicAt(api, devToken)
	ctx := context.Background()

	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 300,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("describe the brake fault of car 14 in detail"))}}
	msg, at, _ := anthropicStream(t, c, params)
	spread(t, "anthropic-sdk-go text", at)
	plain, err := c.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Content[0].Text != plain.Content[0].Text || msg.StopReason != plain.StopReason || msg.Usage.InputTokens != plain.Usage.InputTokens ||
		msg.Usage.OutputTokens != plain.Usage.OutputTokens {
		t.Fatalf("streamed %+v usage %+v\nplain %+v usage %+v", msg.Content, msg.Usage, plain.Content, plain.Usage)
	}

	tools := anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 300,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("check fetch_logs for car 17"))},
		Tools: []anthropic.ToolUnionParam{anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{
			Properties: map[string]any{"query": map[string]any{"type": "string"}}}, "fetch_logs")}}
	msg, _, _ = anthropicStream(t, c, tools)
	plain, err = c.Messages.New(ctx, tools)
	if err != nil {
		t.Fatal(err)
	}
	if msg.StopReason != anthropic.StopReasonToolUse || len(msg.Content) != len(plain.Content) ||
		msg.Content[0].Name != "fetch_logs" || !sameJSONText(string(msg.Content[0].Input), string(plain.Content[0].Input)) {
		t.Fatalf("streamed tool use %+v, plain %+v", msg.Content, plain.Content)
	}

	// Claude refuses before the first token: OpenAI streams the answer.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	prompt := "describe the brake fault of car 15 in detail"
	params.Messages = []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}
	msg, at, hdr := anthropicStream(t, c, params)
	spread(t, "anthropic-sdk-go after a fallback", at)
	if msg.Content[0].Text != mockprovider.Reply(prompt) || msg.StopReason != anthropic.StopReasonEndTurn || hdr.Trailer.Get("X-Bulwark-Provider") != "openai" {
		t.Fatalf("after a fallback: %+v stop %s, provider %q", msg.Content, msg.StopReason, hdr.Trailer.Get("X-Bulwark-Provider"))
	}
}

// anthropicStream runs a streaming call and returns the accumulated
// message, when each text delta arrived, and the HTTP response.
func anthropicStream(t *testing.T, c anthropic.Client, params anthropic.MessageNewParams) (anthropic.Message, []time.Time, *http.Response) {
	t.Helper()
	var hdr *http.Response
	stream := c.Messages.NewStreaming(context.Background(), params, aoption.WithResponseInto(&hdr))
	var msg anthropic.Message
	var at []time.Time
	for stream.Next() {
		ev := stream.Current()
		if err := msg.Accumulate(ev); err != nil {
			t.Fatalf("accumulate: %v", err)
		}
		if ev.Type == "content_block_delta" && ev.Delta.Text != "" {
			at = append(at, time.Now())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("anthropic-sdk-go stream: %v", err)
	}
	return msg, at, hdr
}

// A provider's error after the first token ends the caller's stream with
// the dialect's error event; the record says stream_interrupted, and
// nothing is called again behind the caller's back.
func TestStreamBrokenMidwayEndsWithTheDialectsError(t *testing.T) {
	t.Parallel()
	s, api := streamingSystem(t)
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "openai", Mode: mockprovider.FaultStreamError, AfterChunks: 3}); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"describe the brake fault of car 16 in detail"}]}`
	resp, raw := send(t, "POST", api.ts.URL+"/v1/chat/completions", body, "Authorization", "Bearer "+devToken, "X-Bulwark-Priority", "high")
	text := string(raw)
	if resp.StatusCode != http.StatusOK || strings.Count(text, `"content":"`) < 3 || !strings.Contains(text, `"code":"stream_interrupted"`) ||
		strings.Contains(text, "[DONE]") || !strings.HasSuffix(text, "\n\n") {
		t.Fatalf("stream broken midway: %d\n%s", resp.StatusCode, text)
	}
	id := resp.Header.Get("X-Bulwark-Request-Id")
	out := api.waitStatus(t, id, 10*time.Second, "failed")
	if e, _ := out["error"].(string); !strings.HasPrefix(e, "stream_interrupted: ") {
		t.Fatalf("record %v", out)
	}
	if n := s.mock.Stats().Providers["openai"].Requests; n != 1 {
		t.Fatalf("the provider was called %d times, want once: nothing is retried after the first token", n)
	}

	// The Anthropic dialect ends with its own error event.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultStreamError, AfterChunks: 2}); err != nil {
		t.Fatal(err)
	}
	body = `{"model":"claude-sonnet-4-5","max_tokens":300,"stream":true,"messages":[{"role":"user","content":"describe the brake fault of car 17 in detail"}]}`
	resp, raw = send(t, "POST", api.ts.URL+"/v1/messages", body, "x-api-key", devToken, "anthropic-version", "2023-06-01")
	text = string(raw)
	if resp.StatusCode != http.StatusOK || !strings.Contains(text, "event: content_block_delta") ||
		!strings.Contains(text, "event: error\ndata: {\"type\":\"error\"") || strings.Contains(text, "message_stop") {
		t.Fatalf("anthropic stream broken midway: %d\n%s", resp.StatusCode, text)
	}
}

// stream: true on the async API adds delta events to the request's event
// stream, which replay from Last-Event-ID like the others; the completed
// event still carries the whole answer.
func TestAsyncStreamCarriesDeltas(t *testing.T) {
	t.Parallel()
	_, api := streamingSystem(t)
	prompt := "describe the brake fault of car 18 in detail"
	body := ask(prompt)
	body["stream"] = true
	id := api.submit(t, body)
	ch, stop := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, "")
	first := next(t, ch, 10*time.Second, "delta")
	stop()
	var text strings.Builder
	addDeltas(t, &text, first)
	// Reconnect after the first delta: exactly the rest comes.
	ch, stop = stream(t, api.ts.URL+"/v1/requests/"+id+"/events", devToken, first.ID)
	defer stop()
	for {
		ev := next(t, ch, 10*time.Second, "delta", "completed", "failed")
		if ev.Type != "delta" {
			if ev.Type != "completed" || ev.Data["result"].(map[string]any)["content"] != mockprovider.Reply(prompt) {
				t.Fatalf("end %s %v", ev.Type, ev.Data)
			}
			break
		}
		addDeltas(t, &text, ev)
	}
	if text.String() != mockprovider.Reply(prompt) {
		t.Fatalf("deltas carry %q, want %q", text.String(), mockprovider.Reply(prompt))
	}
}

func addDeltas(t *testing.T, b *strings.Builder, ev sseEvent) {
	t.Helper()
	ds, ok := ev.Data["delta"].([]any)
	if !ok || len(ds) == 0 {
		t.Fatalf("delta event without deltas: %v", ev.Data)
	}
	for _, d := range ds {
		if s, ok := d.(map[string]any)["text"].(string); ok {
			b.WriteString(s)
		}
	}
}

// Identical streaming calls in flight share one provider call, and every
// caller gets the answer streamed, the one that joined late from its
// first delta.
func TestCoalescedStreamsShareTheDeltas(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{mock: mockprovider.Config{
		StreamFirstToken: 300 * time.Millisecond, StreamChunkInterval: streamPace, StreamChunkTokens: 1}})
	api := s.startAPI()
	s.startWorker()
	c := openAIAt(api, devToken)
	prompt := "describe the brake fault of car 19 in detail"
	params := openai.ChatCompletionNewParams{Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
	type got struct {
		text string
		at   []time.Time
		err  error
	}
	out := make(chan got, 2)
	for range 2 {
		go func() {
			acc, at, err := openAIStreamErr(c, params)
			if err != nil {
				out <- got{err: err}
				return
			}
			out <- got{acc.Choices[0].Message.Content, at, nil}
		}()
	}
	for range 2 {
		g := <-out
		// Whole (from the first delta), and in pieces: a caller that joined
		// late on a loaded machine gets what it missed in one piece, so
		// two pieces are what streaming guarantees.
		if g.err != nil || g.text != mockprovider.Reply(prompt) || len(g.at) < 2 {
			t.Fatalf("a caller got %q in %d chunks (%v)", g.text, len(g.at), g.err)
		}
	}
	if n := s.mock.Stats().Providers["openai"].Requests; n != 1 {
		t.Fatalf("%d provider calls for two identical calls in flight, want 1", n)
	}

	// Asked again: answered at once from what the stream assembled (the
	// cache, or the request just ended), streamed in pieces.
	body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	resp, raw := send(t, "POST", api.ts.URL+"/v1/chat/completions", body, "Authorization", "Bearer "+devToken)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Bulwark-Cache") == "none" || resp.Header.Get("X-Bulwark-Provider") == "" ||
		strings.Count(string(raw), `"content":"`) < 3 || s.mock.Stats().Providers["openai"].Requests != 1 {
		t.Fatalf("asked again: %d %v\n%s", resp.StatusCode, resp.Header, raw)
	}
}
