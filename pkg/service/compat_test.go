package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"bulwark/pkg/testkit/mockprovider"
)

func openAIAt(api *apiProc, token string) openai.Client {
	return openai.NewClient(ooption.WithAPIKey(token), ooption.WithBaseURL(api.ts.URL+"/v1/"), ooption.WithMaxRetries(0))
}

func anthropicAt(api *apiProc, token string) anthropic.Client {
	return anthropic.NewClient(aoption.WithAPIKey(token), aoption.WithBaseURL(api.ts.URL), aoption.WithMaxRetries(0))
}

// The official OpenAI SDK, pointed at Bulwark, completes plain, tool-use
// and streaming requests; with OpenAI forced to 429 the answer comes from
// Claude, in OpenAI's format.
func TestOpenAISDK(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	c := openAIAt(api, devToken)
	ctx := context.Background()

	prompt := "summarise the OTA failure"
	var hdr *http.Response
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}, ooption.WithResponseInto(&hdr))
	if err != nil {
		t.Fatalf("plain: %v", err)
	}
	if got := resp.Choices[0].Message.Content; got != mockprovider.Reply(prompt) || resp.Model != "gpt-4o" {
		t.Fatalf("plain answer %q (model %s)", got, resp.Model)
	}
	if hdr.Header.Get("X-Bulwark-Request-Id") == "" || hdr.Header.Get("X-Bulwark-Provider") != "openai" {
		t.Fatalf("headers %v", hdr.Header)
	}

	// Tool use: parallel calls, then the results.
	params := openai.ChatCompletionNewParams{Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("diagnose"), openai.UserMessage("run fetch_logs and search_kb")},
		Tools: []openai.ChatCompletionToolUnionParam{
			openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "fetch_logs"}),
			openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "search_kb"}),
		}}
	resp, err = c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("tool round: %v", err)
	}
	calls := resp.Choices[0].Message.ToolCalls
	if resp.Choices[0].FinishReason != "tool_calls" || len(calls) != 2 || calls[0].Function.Name != "fetch_logs" {
		t.Fatalf("tool round: %s", resp.RawJSON())
	}
	params.Messages = append(params.Messages, resp.Choices[0].Message.ToParam(),
		openai.ToolMessage("log ok", calls[0].ID), openai.ToolMessage("kb ok", calls[1].ID))
	resp, err = c.Chat.Completions.New(ctx, params)
	if err != nil || resp.Choices[0].Message.Content != "tool results: log ok; kb ok" {
		t.Fatalf("result round: %v %s", err, resp.RawJSON())
	}

	// Streaming.
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("stream it")}})
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil || acc.Choices[0].Message.Content != mockprovider.Reply("stream it") {
		t.Fatalf("stream: %v %+v", err, acc.Choices)
	}

	// OpenAI is out of capacity: Claude answers, in OpenAI's format, tool calls included.
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "openai", Mode: mockprovider.FaultRateLimit, RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	params.Messages = params.Messages[:2]
	resp, err = c.Chat.Completions.New(ctx, params, ooption.WithResponseInto(&hdr))
	if err != nil {
		t.Fatalf("fallback: %v", err)
	}
	if hdr.Header.Get("X-Bulwark-Provider") != "claude" || len(resp.Choices[0].Message.ToolCalls) != 2 || resp.Model != "gpt-4o" {
		t.Fatalf("fallback answer from %s: %s", hdr.Header.Get("X-Bulwark-Provider"), resp.RawJSON())
	}

	// Unknown model: a 404 in OpenAI's error format.
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-9",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.Message, "gpt-9") {
		t.Fatalf("unknown model: %v", err)
	}
}

// The official Anthropic SDK likewise, with Claude forced to 429 at the end.
func TestAnthropicSDK(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	c := anthropicAt(api, devToken)
	ctx := context.Background()

	prompt := "why did car 7 fail its update?"
	msg, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-sonnet", MaxTokens: 300,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}})
	if err != nil {
		t.Fatalf("plain: %v", err)
	}
	if msg.Content[0].Text != mockprovider.Reply(prompt) {
		t.Fatalf("plain answer %+v", msg.Content)
	}

	params := anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 300,
		System:   []anthropic.TextBlockParam{{Text: "diagnose"}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("check fetch_logs for car 17"))},
		Tools: []anthropic.ToolUnionParam{anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{
			Properties: map[string]any{"query": map[string]any{"type": "string"}}}, "fetch_logs")}}
	msg, err = c.Messages.New(ctx, params)
	if err != nil || msg.StopReason != anthropic.StopReasonToolUse || msg.Content[0].Name != "fetch_logs" {
		t.Fatalf("tool round: %v %+v", err, msg)
	}
	use := msg.Content[0]
	params.Messages = append(params.Messages,
		anthropic.NewAssistantMessage(anthropic.NewToolUseBlock(use.ID, json.RawMessage(use.Input), use.Name)),
		anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, "3 errors found", false)))
	msg, err = c.Messages.New(ctx, params)
	if err != nil || msg.Content[0].Text != "tool results: 3 errors found" {
		t.Fatalf("result round: %v %+v", err, msg)
	}

	stream := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "claude/sonnet", MaxTokens: 300,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("stream please"))}})
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil || acc.Content[0].Text != mockprovider.Reply("stream please") {
		t.Fatalf("stream: %v %+v", err, acc.Content)
	}

	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultRateLimit, RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	params.Messages = params.Messages[:1]
	var hdr *http.Response
	msg, err = c.Messages.New(ctx, params, aoption.WithResponseInto(&hdr))
	if err != nil || hdr.Header.Get("X-Bulwark-Provider") != "openai" || msg.Content[0].Type != "tool_use" || msg.Content[0].Name != "fetch_logs" {
		t.Fatalf("fallback: %v %+v", err, msg)
	}

	_, err = c.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-opus-9", MaxTokens: 10,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("unknown model: %v", err)
	}
}

// Past sync_timeout a compat call answers 429 with the request id, and
// the caller fetches the result instead of resubmitting.
func TestCompatSyncTimeout(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}", mock: mockprovider.Config{Latency: 3 * time.Second}})
	s.cfg.Server.SyncTimeout = 300 * time.Millisecond
	api := s.startAPI()
	s.startWorker()
	code, out, hdr := call(t, "POST", api.ts.URL+"/v1/chat/completions", devToken,
		map[string]any{"model": "gpt-4o", "messages": []map[string]any{{"role": "user", "content": "slow one"}}})
	id := hdr.Get("X-Bulwark-Request-Id")
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" || id == "" {
		t.Fatalf("status %d, Retry-After %q, id %q: %v", code, hdr.Get("Retry-After"), id, out)
	}
	res := api.waitStatus(t, id, 20*time.Second, "completed")
	if res["result"].(map[string]any)["content"] != mockprovider.Reply("slow one") {
		t.Fatalf("fetched %v", res)
	}
}

// A streamed call that has to wait gets its headers at once and comment
// lines while it waits; the official SDKs' streaming helpers skip them
// and accumulate the answer, and the provider and cache headers come as
// trailers.
func TestSDKStreamsAWaitedAnswer(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}", mock: mockprovider.Config{Latency: 300 * time.Millisecond}})
	s.cfg.Server.StreamKeepAlive = 20 * time.Millisecond
	api := s.startAPI()
	s.startWorker()
	ctx := context.Background()

	body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"raw stream"}]}`
	resp, raw := send(t, "POST", api.ts.URL+"/v1/chat/completions", body, "Authorization", "Bearer "+devToken)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), ": waiting\n\n") ||
		!strings.HasSuffix(string(raw), "data: [DONE]\n\n") || resp.Trailer.Get("X-Bulwark-Provider") != "openai" {
		t.Fatalf("raw stream: %d %v trailers %v\n%s", resp.StatusCode, resp.Header, resp.Trailer, raw)
	}

	oc := openAIAt(api, devToken)
	stream := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("openai stream while waiting")}})
	oacc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		oacc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil || oacc.Choices[0].Message.Content != mockprovider.Reply("openai stream while waiting") {
		t.Fatalf("openai-go: %v %+v", err, oacc.Choices)
	}

	ac := anthropicAt(api, devToken)
	astream := ac.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "claude/sonnet", MaxTokens: 300,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("anthropic stream while waiting"))}})
	var aacc anthropic.Message
	for astream.Next() {
		if err := aacc.Accumulate(astream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := astream.Err(); err != nil || aacc.Content[0].Text != mockprovider.Reply("anthropic stream while waiting") {
		t.Fatalf("anthropic-sdk-go: %v %+v", err, aacc.Content)
	}
}
