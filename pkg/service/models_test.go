package service_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/mockprovider"
)

// Both official SDKs list the model names the compat endpoints accept
// (every alias, tier model name and provider/tier), fetch one, a name
// with a slash included, and get their own 404 for an unknown one; the
// Anthropic SDK pages through the list and reads each model's max_tokens.
func TestSDKModels(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI()
	ctx := context.Background()
	want := []string{"claude-haiku-4-5", "claude-sonnet", "claude-sonnet-4-5", "claude/haiku", "claude/sonnet",
		"gpt-4o", "gpt-4o-mini", "openai/gpt4o", "openai/gpt4o-mini"}

	oa := openAIAt(api, devToken)
	page, err := oa.Models.List(ctx)
	if err != nil {
		t.Fatalf("openai list: %v", err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
		if m.ID == "claude-sonnet" && m.OwnedBy != "claude" {
			t.Errorf("claude-sonnet owned by %q, want claude", m.OwnedBy)
		}
	}
	if !slices.Equal(ids, want) {
		t.Errorf("openai list %v, want %v", ids, want)
	}
	if m, err := oa.Models.Get(ctx, "claude/sonnet"); err != nil || m.ID != "claude/sonnet" {
		t.Errorf("openai get claude/sonnet: %v %+v", err, m)
	}
	var oaErr *openai.Error
	if _, err := oa.Models.Get(ctx, "gpt-9"); !errors.As(err, &oaErr) || oaErr.StatusCode != 404 || oaErr.Code != "model_not_found" {
		t.Errorf("openai get gpt-9: %v", err)
	}

	an := anthropicAt(api, devToken)
	pager := an.Models.ListAutoPaging(ctx, anthropic.ModelListParams{Limit: anthropic.Int(2)})
	ids = nil
	limits := map[string]int64{}
	for pager.Next() {
		m := pager.Current()
		ids, limits[m.ID] = append(ids, m.ID), m.MaxTokens
	}
	if err := pager.Err(); err != nil || !slices.Equal(ids, want) {
		t.Errorf("anthropic pages: %v %v, want %v", err, ids, want)
	}
	if limits["claude-sonnet"] != 64_000 || limits["gpt-4o"] != 16_384 {
		t.Errorf("max_tokens of the models %v", limits)
	}
	if m, err := an.Models.Get(ctx, "claude-sonnet-4-5", anthropic.ModelGetParams{}); err != nil || m.MaxTokens != 64_000 {
		t.Errorf("anthropic get: %v %+v", err, m)
	}
	var anErr *anthropic.Error
	if _, err := an.Models.Get(ctx, "claude-opus-9", anthropic.ModelGetParams{}); !errors.As(err, &anErr) || anErr.StatusCode != 404 {
		t.Errorf("anthropic get claude-opus-9: %v", err)
	}
	wrong := anthropicAt(api, "wrong")
	if _, err := wrong.Models.List(ctx, anthropic.ModelListParams{}); !errors.As(err, &anErr) || anErr.StatusCode != 401 {
		t.Errorf("anthropic list with a wrong key: %v", err)
	}
}

// The Anthropic SDK's CountTokens gets Bulwark's estimate of the prompt
// (the key pool's: four bytes a token) without any provider call or
// queued request, and the 400 of /v1/messages for what it refuses.
func TestSDKCountTokens(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{})
	api := s.startAPI() // no worker: nothing may need one
	c := anthropicAt(api, devToken)
	ctx := context.Background()
	prompt := "why did car 7 fail its update?"
	res, err := c.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "claude-sonnet",
		System:   anthropic.MessageCountTokensParamsSystemUnion{OfString: anthropic.String("diagnose")},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}})
	if err != nil {
		t.Fatalf("count: %v", err)
	}
	want := llm.EstimateRequest(&llm.Request{System: "diagnose", Messages: []llm.Message{{Role: llm.RoleUser,
		Content: []llm.Block{{Type: llm.BlockText, Text: prompt}}}}}).Input
	if res.InputTokens != int64(want) || want == 0 {
		t.Errorf("input_tokens %d, want %d", res.InputTokens, want)
	}
	_, err = c.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "claude-sonnet",
		Messages: []anthropic.MessageParam{anthropic.NewAssistantMessage(anthropic.NewTextBlock("a"))}})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(err.Error(), "the last message must come from the user") {
		t.Errorf("last message from the assistant: %v", err)
	}
	if st := s.mock.Stats().Total(); st.Requests != 0 {
		t.Errorf("the provider was called %d times", st.Requests)
	}
	if n, err := s.inspector().Queues(); err != nil || len(n) != 0 {
		t.Errorf("queues %v (%v), want none created", n, err)
	}
}

// Each tier takes its model's own max_tokens: the Anthropic SDK's 64,000
// for Sonnet (above the old global 32,000; the SDK streams a call that
// large) is answered, 64,001 gets Anthropic's own 400; OpenAI's gpt-4o
// stops at 16,384 with OpenAI's.
func TestSDKMaxTokensPerTier(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	ctx := context.Background()
	an := anthropicAt(api, devToken)
	ask := func(n int64) error {
		stream := an.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "claude-sonnet", MaxTokens: n,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("a long report"))}})
		var acc anthropic.Message
		for stream.Next() {
			if err := acc.Accumulate(stream.Current()); err != nil {
				return err
			}
		}
		if err := stream.Err(); err != nil {
			return err
		}
		if len(acc.Content) == 0 || acc.Content[0].Text != mockprovider.Reply("a long report") {
			return fmt.Errorf("answer %+v", acc.Content)
		}
		return nil
	}
	if err := ask(64_000); err != nil {
		t.Fatalf("max_tokens 64000 on Sonnet: %v", err)
	}
	var anErr *anthropic.Error
	err := ask(64_001)
	if !errors.As(err, &anErr) || anErr.StatusCode != 400 || !strings.Contains(err.Error(),
		"max_tokens: 64001 > 64000, which is the maximum allowed number of output tokens for claude-sonnet") {
		t.Fatalf("max_tokens 64001 on Sonnet: %v", err)
	}

	oa := openAIAt(api, devToken)
	chat := func(n int64) error {
		_, err := oa.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o", MaxCompletionTokens: openai.Int(n),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a long report")}})
		return err
	}
	if err := chat(16_384); err != nil {
		t.Fatalf("max_completion_tokens 16384 on gpt-4o: %v", err)
	}
	var oaErr *openai.Error
	err = chat(16_385)
	if !errors.As(err, &oaErr) || oaErr.StatusCode != 400 || oaErr.Param != "max_completion_tokens" || oaErr.Type != "invalid_request_error" ||
		!strings.Contains(oaErr.Message, "This model supports at most 16384 completion tokens, whereas you provided 16385.") {
		t.Fatalf("max_completion_tokens 16385 on gpt-4o: %v", err)
	}
}

// A Sonnet call for 64,000 tokens that falls back to gpt-4o is sent there
// with gpt-4o's 16,384 (the mock, like OpenAI, refuses more) and says so
// in X-Bulwark-Max-Tokens-Clamped, a trailer when streamed; one that
// Sonnet answers carries no such header.
func TestFallbackClampsMaxTokens(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	c := anthropicAt(api, devToken)
	ctx := context.Background()
	call := func(prompt string) (*http.Response, error) {
		var hdr *http.Response
		// A timeout of its own: the SDK streams a call this large otherwise.
		_, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-sonnet", MaxTokens: 64_000,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}},
			aoption.WithResponseInto(&hdr), aoption.WithRequestTimeout(time.Minute))
		return hdr, err
	}
	hdr, err := call("answered by sonnet")
	if err != nil || hdr.Header.Get("X-Bulwark-Provider") != "claude" || hdr.Header.Get("X-Bulwark-Max-Tokens-Clamped") != "" {
		t.Fatalf("on its own route: %v %v", err, hdr.Header)
	}
	if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultRateLimit, RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	hdr, err = call("answered by the fallback")
	if err != nil {
		t.Fatalf("fallback: %v", err)
	}
	if hdr.Header.Get("X-Bulwark-Provider") != "openai" || hdr.Header.Get("X-Bulwark-Max-Tokens-Clamped") != "64000->16384" {
		t.Fatalf("fallback headers %v", hdr.Header)
	}

	var resp *http.Response
	stream := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "claude-sonnet", MaxTokens: 64_000,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("streamed by the fallback"))}},
		aoption.WithResponseInto(&resp))
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("streamed fallback: %v", err)
	}
	if got := resp.Header.Get("X-Bulwark-Max-Tokens-Clamped") + resp.Trailer.Get("X-Bulwark-Max-Tokens-Clamped"); got != "64000->16384" {
		t.Fatalf("streamed fallback: clamped %q (headers %v, trailers %v)", got, resp.Header, resp.Trailer)
	}
	if st := s.mock.Stats().Providers["openai"]; st.Invalid != 0 || st.OK != 2 {
		t.Errorf("openai: %+v, want two answers and no refusal", st)
	}
}
