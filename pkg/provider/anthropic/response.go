package anthropic

import (
	"encoding/json"
	"errors"
	"fmt"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/internal/wirejson"
)

// DecodeResponse parses a Messages API response body. Text and tool_use
// blocks are kept; block types the neutral model cannot carry (thinking,
// server tool results) are dropped. InputTokens counts every prompt token,
// cached or not (input_tokens + cache_creation_input_tokens +
// cache_read_input_tokens), as OpenAI's prompt_tokens does.
func DecodeResponse(body []byte) (*llm.Response, error) {
	var w wireResponse
	if err := wirejson.Unmarshal(body, &w); err != nil {
		return nil, fmt.Errorf("anthropic: decode response: %w", err)
	}
	if w.Type != "" && w.Type != "message" {
		return nil, fmt.Errorf("anthropic: decode response: type is %q, want \"message\"", w.Type)
	}
	var blocks []wireBlockIn
	if wirejson.Present(w.Content) {
		if err := json.Unmarshal(w.Content, &blocks); err != nil {
			return nil, errors.New("anthropic: decode response: content: must be an array of content blocks")
		}
	}
	resp := &llm.Response{ID: w.ID, Model: w.Model, Content: make([]llm.Block, 0, len(blocks))}
	for i, b := range blocks {
		switch b.Type {
		case "text":
			resp.Content = append(resp.Content, llm.Block{Type: llm.BlockText, Text: b.Text})
		case "tool_use":
			input, err := wirejson.Object(fmt.Sprintf("content[%d].input", i), b.Input)
			if err != nil {
				return nil, fmt.Errorf("anthropic: decode response: %w", err)
			}
			resp.Content = append(resp.Content, llm.Block{Type: llm.BlockToolUse, ToolUseID: b.ID, ToolName: b.Name, Input: input})
		}
	}
	if w.StopReason != nil {
		resp.StopReason = llm.StopReason(*w.StopReason)
	}
	resp.Usage = llm.Usage{InputTokens: w.Usage.InputTokens, OutputTokens: w.Usage.OutputTokens}
	if p := w.Usage.CacheCreationInputTokens; p != nil {
		resp.Usage.InputTokens += *p
	}
	if p := w.Usage.CacheReadInputTokens; p != nil {
		resp.Usage.InputTokens += *p
	}
	return resp, nil
}

// EncodeResponse renders resp as a Messages API response body, as a compat
// endpoint answers it. model is the model name to report (the one the
// client asked for); empty means resp.Model. An empty resp.ID gets a fresh
// "msg_…" id and an empty stop reason becomes end_turn. stop_sequence is
// always null: the neutral model does not record which sequence matched.
func EncodeResponse(resp *llm.Response, model string) ([]byte, error) {
	out, err := outResponseOf(resp, model)
	if err != nil {
		return nil, err
	}
	body, err := wirejson.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("anthropic: encode response: %w", err)
	}
	return body, nil
}

func outResponseOf(resp *llm.Response, model string) (*outResponse, error) {
	if resp == nil {
		return nil, errors.New("anthropic: encode response: nil response")
	}
	out := &outResponse{
		ID:         resp.ID,
		Type:       "message",
		Role:       "assistant",
		Model:      model,
		Content:    make([]outBlock, 0, len(resp.Content)),
		StopReason: stopReasonOf(resp.StopReason),
		Usage:      wireUsage{InputTokens: resp.Usage.InputTokens, OutputTokens: resp.Usage.OutputTokens},
	}
	if out.ID == "" {
		out.ID = provider.NewID("msg_")
	}
	if out.Model == "" {
		out.Model = resp.Model
	}
	for i, b := range resp.Content {
		if b.Type == llm.BlockToolResult {
			return nil, fmt.Errorf("anthropic: encode response: content[%d]: a tool_result cannot be part of an answer", i)
		}
		ob, err := encodeBlock(b)
		if err != nil {
			return nil, fmt.Errorf("anthropic: encode response: content[%d]: %w", i, err)
		}
		out.Content = append(out.Content, ob)
	}
	return out, nil
}

func stopReasonOf(r llm.StopReason) *string {
	s := string(r)
	if s == "" {
		s = string(llm.StopEndTurn)
	}
	return &s
}
