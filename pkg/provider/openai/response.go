package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/internal/wirejson"
)

// Finish reasons of Chat Completions.
const (
	finishStop          = "stop"
	finishLength        = "length"
	finishToolCalls     = "tool_calls"
	finishContentFilter = "content_filter"
	finishFunctionCall  = "function_call"
)

// StopReasonOf maps a finish_reason onto the neutral vocabulary. stop
// cannot say whether a stop sequence matched, so it is always end_turn.
func StopReasonOf(finish string) llm.StopReason {
	switch finish {
	case finishStop:
		return llm.StopEndTurn
	case finishLength:
		return llm.StopMaxTokens
	case finishToolCalls, finishFunctionCall:
		return llm.StopToolUse
	case finishContentFilter:
		return llm.StopRefusal
	case "":
		return ""
	}
	return llm.StopReason(finish)
}

// finishReasonOf maps a neutral stop reason onto finish_reason: end_turn and
// stop_sequence are stop, max_tokens is length, tool_use is tool_calls,
// refusal is content_filter; anything else (or nothing) is stop.
func finishReasonOf(r llm.StopReason) string {
	switch r {
	case llm.StopMaxTokens:
		return finishLength
	case llm.StopToolUse:
		return finishToolCalls
	case llm.StopRefusal:
		return finishContentFilter
	}
	return finishStop
}

// DecodeResponse parses a Chat Completions response body: the first choice
// becomes the answer (its text first, then its tool calls as tool_use
// blocks), finish_reason the stop reason and prompt/completion tokens the
// usage. A refusal becomes the text with stop reason refusal.
func DecodeResponse(body []byte) (*llm.Response, error) {
	var w wireResponse
	if err := wirejson.Unmarshal(body, &w); err != nil {
		return nil, fmt.Errorf("openai: decode response: %w", err)
	}
	if len(w.Choices) == 0 {
		return nil, errors.New("openai: decode response: choices: empty")
	}
	c := w.Choices[0]
	for _, ch := range w.Choices {
		if ch.Index == 0 {
			c = ch
			break
		}
	}
	resp := &llm.Response{ID: w.ID, Model: w.Model, Content: []llm.Block{}}
	texts, err := decodeTexts("choices[0].message.content", c.Message.Content, true)
	if err != nil {
		return nil, fmt.Errorf("openai: decode response: %w", err)
	}
	if text := strings.Join(texts, ""); text != "" || (len(texts) > 0 && len(c.Message.ToolCalls) == 0) {
		resp.Content = append(resp.Content, llm.Block{Type: llm.BlockText, Text: text})
	}
	if c.FinishReason != nil {
		resp.StopReason = StopReasonOf(*c.FinishReason)
	}
	if r := c.Message.Refusal; r != nil && *r != "" {
		if len(texts) == 0 {
			resp.Content = append(resp.Content, llm.Block{Type: llm.BlockText, Text: *r})
		}
		resp.StopReason = llm.StopRefusal
	}
	for j, tc := range c.Message.ToolCalls {
		path := fmt.Sprintf("choices[0].message.tool_calls[%d]", j)
		input, err := decodeArguments(path+".function.arguments", tc.Function.Arguments)
		if err != nil {
			return nil, fmt.Errorf("openai: decode response: %w", err)
		}
		resp.Content = append(resp.Content, llm.Block{Type: llm.BlockToolUse, ToolUseID: tc.ID, ToolName: tc.Function.Name, Input: input})
	}
	if w.Usage != nil {
		resp.Usage = llm.Usage{InputTokens: w.Usage.PromptTokens, OutputTokens: w.Usage.CompletionTokens}
	}
	return resp, nil
}

// EncodeResponse renders resp as a Chat Completions response body, as a
// compat endpoint answers it. model is the model name to report (the one
// the client asked for); empty means resp.Model. An empty resp.ID gets a
// fresh "chatcmpl-…" id. Text blocks are joined into content (null when
// there is none); tool_use blocks become tool_calls.
func EncodeResponse(resp *llm.Response, model string) ([]byte, error) {
	return encodeResponse(resp, model, time.Now().Unix())
}

// encodeResponse is EncodeResponse with the created timestamp given, so
// that golden files are stable.
func encodeResponse(resp *llm.Response, model string, created int64) ([]byte, error) {
	a, err := answerOf(resp, model)
	if err != nil {
		return nil, err
	}
	out := outResponse{
		ID:      a.id,
		Object:  "chat.completion",
		Created: created,
		Model:   a.model,
		Choices: []outChoice{{
			Message: outAssistant{
				Role:      "assistant",
				Content:   a.content,
				ToolCalls: a.calls,
			},
			Logprobs:     json.RawMessage(nullJSON),
			FinishReason: a.finish,
		}},
		Usage: usageOf(resp.Usage),
	}
	body, err := wirejson.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("openai: encode response: %w", err)
	}
	return body, nil
}

// answer is a response already mapped to wire values, shared by
// EncodeResponse and WriteStream.
type answer struct {
	id, model string
	// content is the joined text, nil when the answer has no text block.
	content *string
	calls   []wireToolCall
	finish  string
}

func answerOf(resp *llm.Response, model string) (*answer, error) {
	if resp == nil {
		return nil, errors.New("openai: encode response: nil response")
	}
	a := &answer{id: resp.ID, model: model, finish: finishReasonOf(resp.StopReason)}
	if a.id == "" {
		a.id = provider.NewID("chatcmpl-")
	}
	if a.model == "" {
		a.model = resp.Model
	}
	var text strings.Builder
	hasText := false
	for i, b := range resp.Content {
		switch b.Type {
		case llm.BlockText:
			text.WriteString(b.Text)
			hasText = true
		case llm.BlockToolUse:
			a.calls = append(a.calls, toolCallOf(b))
		default:
			return nil, fmt.Errorf("openai: encode response: content[%d]: a %q block cannot be part of an answer", i, b.Type)
		}
	}
	if hasText {
		s := text.String()
		a.content = &s
	}
	return a, nil
}

func usageOf(u llm.Usage) wireUsage {
	return wireUsage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens, TotalTokens: u.Total()}
}
