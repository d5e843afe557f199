package service_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"bulwark/pkg/testkit/mockprovider"
)

// The client matrix: each official Go SDK, built with nothing but Bulwark's
// base URL and a tenant token — its own retries, timeouts and max_tokens
// left at their defaults, as a team switching its agents over would — calls
// each endpoint Bulwark speaks, plain and streamed, and gets the answer.
// (The README's client section lists what was checked.)
func TestClientMatrix(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	oc := openai.NewClient(ooption.WithBaseURL(api.ts.URL+"/v1/"), ooption.WithAPIKey(devToken))
	ac := anthropic.NewClient(aoption.WithBaseURL(api.ts.URL), aoption.WithAPIKey(devToken))
	ctx := t.Context()
	user := func(p string) []anthropic.MessageParam {
		return []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(p))}
	}
	for _, tt := range []struct {
		name string
		call func(ctx context.Context, prompt string) (string, error)
	}{
		{"openai-go Chat Completions", func(ctx context.Context, p string) (string, error) {
			r, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(p)}})
			if err != nil {
				return "", err
			}
			return r.Choices[0].Message.Content, nil
		}},
		{"openai-go Chat Completions, streamed", func(ctx context.Context, p string) (string, error) {
			st := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(p)}})
			defer st.Close()
			acc := openai.ChatCompletionAccumulator{}
			for st.Next() {
				acc.AddChunk(st.Current())
			}
			if err := st.Err(); err != nil || len(acc.Choices) == 0 {
				return "", fmt.Errorf("stream: %v (%d choices)", err, len(acc.Choices))
			}
			return acc.Choices[0].Message.Content, nil
		}},
		{"openai-go Responses", func(ctx context.Context, p string) (string, error) {
			r, err := oc.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-4o",
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(p)}})
			if err != nil {
				return "", err
			}
			return r.OutputText(), nil
		}},
		{"openai-go Responses, streamed", func(ctx context.Context, p string) (string, error) {
			st := oc.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "gpt-4o",
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(p)}})
			defer st.Close()
			var text strings.Builder
			for st.Next() {
				if ev := st.Current(); ev.Type == "response.output_text.delta" {
					text.WriteString(ev.Delta)
				}
			}
			return text.String(), st.Err()
		}},
		{"anthropic-sdk-go Messages", func(ctx context.Context, p string) (string, error) {
			m, err := ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 1024, Messages: user(p)})
			if err != nil {
				return "", err
			}
			return m.Content[0].Text, nil
		}},
		{"anthropic-sdk-go Messages, streamed", func(ctx context.Context, p string) (string, error) {
			st := ac.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 64_000, Messages: user(p)})
			defer st.Close()
			var m anthropic.Message
			for st.Next() {
				if err := m.Accumulate(st.Current()); err != nil {
					return "", err
				}
			}
			if err := st.Err(); err != nil || len(m.Content) == 0 {
				return "", fmt.Errorf("stream: %v (%d blocks)", err, len(m.Content))
			}
			return m.Content[0].Text, nil
		}},
	} {
		prompt := "matrix: " + tt.name
		got, err := tt.call(ctx, prompt)
		if err != nil || got != mockprovider.Reply(prompt) {
			t.Errorf("%s: %q, %v; want the answer %q", tt.name, got, err, mockprovider.Reply(prompt))
		}
	}

	// What the clients ask besides answers: the models a tenant may name,
	// and a prompt's token count.
	page, err := oc.Models.List(ctx)
	if err != nil || !slices.ContainsFunc(page.Data, func(m openai.Model) bool { return m.ID == "gpt-4o" }) {
		t.Errorf("openai-go Models.List: %v %v", err, page)
	}
	apage, err := ac.Models.List(ctx, anthropic.ModelListParams{})
	if err != nil || len(apage.Data) == 0 {
		t.Errorf("anthropic-sdk-go Models.List: %v %v", err, apage)
	}
	n, err := ac.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "claude-sonnet-4-5",
		Messages: user("how many tokens is this?")})
	if err != nil || n.InputTokens <= 0 {
		t.Errorf("anthropic-sdk-go CountTokens: %v %+v", err, n)
	}
}
