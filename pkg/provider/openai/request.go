package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/internal/wirejson"
)

// ToolErrorPrefix marks a tool result that is an error. Chat Completions
// has no is_error on a tool message, so EncodeRequest prefixes the content
// of an llm tool_result with IsError set, and DecodeRequest turns a tool
// message whose content starts with the prefix back into IsError with the
// prefix removed. The model reads the prefix too, which is the point: it
// learns the call failed.
const ToolErrorPrefix = "[tool error] "

// RequestInfo is what a Chat Completions request says beyond llm.Request.
type RequestInfo struct {
	// Model is the model the client asked for, as sent (also in
	// llm.Request.Model).
	Model string
	// Stream is true when the client asked for an SSE stream.
	Stream bool
	// IncludeUsage is stream_options.include_usage: the stream must end
	// with a chunk carrying usage (see WithUsage).
	IncludeUsage bool
	// Metadata is the request's metadata object as sent, nil when absent.
	Metadata json.RawMessage
	// User is the client's end-user id (the user field).
	User string
	// ParallelToolCalls is parallel_tool_calls as sent, nil when absent.
	ParallelToolCalls *bool
	// MaxTokensParam names the field llm.Request.MaxTokens came from,
	// max_completion_tokens or max_tokens ("" when neither was sent): an
	// error about it names the field the caller used.
	MaxTokensParam string
	// Ignored lists the top-level fields that were present but that Bulwark
	// does not carry over (top_p, seed, response_format, …), sorted.
	Ignored []string
}

// handledFields are the top-level request fields DecodeRequest carries over.
var handledFields = []string{
	"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "stop",
	"tools", "tool_choice", "parallel_tool_calls", "stream", "stream_options", "n",
	"user", "metadata",
}

// DecodeRequest parses a Chat Completions request body.
//
//   - system and developer messages, wherever they stand, become
//     llm.Request.System, joined with a blank line.
//   - Content given as a string or as an array of text parts both decode;
//     image, audio and file parts are rejected.
//   - An assistant message's tool_calls become tool_use blocks after its
//     text; arguments must be a JSON object in a string.
//   - A run of tool messages becomes one user message of tool_result blocks
//     (ToolErrorPrefix marks an error), and a user message right after the
//     run joins that same message, mirroring how EncodeRequest splits one.
//   - max_completion_tokens wins over the older max_tokens; n must be 1.
//
// The error names the offending field and is meant for a 400 answer.
func DecodeRequest(body []byte) (*RequestInfo, *llm.Request, error) {
	var w wireRequest
	if err := wirejson.Unmarshal(body, &w); err != nil {
		return nil, nil, err
	}
	ignored, err := wirejson.UnknownFields(body, handledFields)
	if err != nil {
		return nil, nil, err
	}
	info := &RequestInfo{
		Model:             w.Model,
		Stream:            w.Stream,
		User:              w.User,
		ParallelToolCalls: w.ParallelToolCalls,
		Ignored:           ignored,
	}
	if w.StreamOptions != nil {
		info.IncludeUsage = w.StreamOptions.IncludeUsage
	}
	if wirejson.Present(w.Metadata) {
		info.Metadata = w.Metadata
	}
	if w.Model == "" {
		return nil, nil, errors.New("model: required")
	}
	if len(w.Messages) == 0 {
		return nil, nil, errors.New("messages: at least one message is required")
	}
	if w.N != nil && *w.N != 1 {
		return nil, nil, fmt.Errorf("n: only 1 is supported, got %d", *w.N)
	}
	req := &llm.Request{Model: w.Model, Temperature: w.Temperature}
	switch {
	case w.MaxCompletionTokens != nil:
		req.MaxTokens, info.MaxTokensParam = *w.MaxCompletionTokens, "max_completion_tokens"
	case w.MaxTokens != nil:
		req.MaxTokens, info.MaxTokensParam = *w.MaxTokens, "max_tokens"
	}
	if req.MaxTokens < 0 {
		return nil, nil, fmt.Errorf("%s: must not be negative, got %d", info.MaxTokensParam, req.MaxTokens)
	}
	if req.StopSequences, err = decodeStop(w.Stop); err != nil {
		return nil, nil, err
	}
	if err := decodeMessages(req, w.Messages); err != nil {
		return nil, nil, err
	}
	for i, t := range w.Tools {
		tool, err := decodeTool(i, t)
		if err != nil {
			return nil, nil, err
		}
		req.Tools = append(req.Tools, tool)
	}
	if req.ToolChoice, err = decodeToolChoice(w.ToolChoice); err != nil {
		return nil, nil, err
	}
	return info, req, nil
}

func decodeStop(raw json.RawMessage) ([]string, error) {
	if !wirejson.Present(raw) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []string{s}, nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err != nil {
		return nil, errors.New("stop: must be a string or an array of strings")
	}
	return ss, nil
}

// decodeMessages fills req.System and req.Messages from the wire messages.
func decodeMessages(req *llm.Request, msgs []wireMessageIn) error {
	var system []string
	// toolTurn is the index in req.Messages of the user message that the
	// current run of tool messages fills, -1 when there is none.
	toolTurn := -1
	for i, m := range msgs {
		path := fmt.Sprintf("messages[%d]", i)
		switch m.Role {
		case "system", "developer":
			texts, err := decodeTexts(path+".content", m.Content, false)
			if err != nil {
				return err
			}
			system = append(system, strings.Join(texts, ""))
		case "user":
			texts, err := decodeTexts(path+".content", m.Content, false)
			if err != nil {
				return err
			}
			blocks := textBlocks(texts)
			if toolTurn >= 0 {
				req.Messages[toolTurn].Content = append(req.Messages[toolTurn].Content, blocks...)
				toolTurn = -1
				continue
			}
			req.Messages = append(req.Messages, llm.Message{Role: llm.RoleUser, Content: blocks})
		case "assistant":
			toolTurn = -1
			msg, err := decodeAssistant(path, m)
			if err != nil {
				return err
			}
			req.Messages = append(req.Messages, msg)
		case "tool":
			if m.ToolCallID == "" {
				return fmt.Errorf("%s.tool_call_id: required", path)
			}
			texts, err := decodeTexts(path+".content", m.Content, false)
			if err != nil {
				return err
			}
			text, isErr := strings.CutPrefix(strings.Join(texts, ""), ToolErrorPrefix)
			blk := llm.Block{Type: llm.BlockToolResult, ToolUseID: m.ToolCallID, Text: text, IsError: isErr}
			if toolTurn < 0 {
				req.Messages = append(req.Messages, llm.Message{Role: llm.RoleUser})
				toolTurn = len(req.Messages) - 1
			}
			req.Messages[toolTurn].Content = append(req.Messages[toolTurn].Content, blk)
		case "":
			return fmt.Errorf("%s.role: required", path)
		default:
			return fmt.Errorf("%s.role: %q is not supported (system, developer, user, assistant and tool are)", path, m.Role)
		}
	}
	if len(req.Messages) == 0 {
		return errors.New("messages: at least one user or assistant message is required")
	}
	for i, s := range system {
		if i > 0 {
			req.System += "\n\n"
		}
		req.System += s
	}
	return nil
}

func decodeAssistant(path string, m wireMessageIn) (llm.Message, error) {
	msg := llm.Message{Role: llm.RoleAssistant}
	texts, err := decodeTexts(path+".content", m.Content, true)
	if err != nil {
		return llm.Message{}, err
	}
	// An assistant turn that only calls tools often says content "" or
	// null; that is no text, not an empty text block.
	if !(len(m.ToolCalls) > 0 && len(texts) == 1 && texts[0] == "") {
		msg.Content = textBlocks(texts)
	}
	if len(texts) == 0 && m.Refusal != nil && *m.Refusal != "" {
		msg.Content = textBlocks([]string{*m.Refusal})
	}
	for j, tc := range m.ToolCalls {
		blk, err := decodeToolCall(fmt.Sprintf("%s.tool_calls[%d]", path, j), tc)
		if err != nil {
			return llm.Message{}, err
		}
		msg.Content = append(msg.Content, blk)
	}
	if msg.Content == nil {
		msg.Content = []llm.Block{}
	}
	return msg, nil
}

func decodeToolCall(path string, tc wireToolCall) (llm.Block, error) {
	if tc.Type != "" && tc.Type != "function" {
		return llm.Block{}, fmt.Errorf("%s.type: %q is not supported, only \"function\"", path, tc.Type)
	}
	if tc.ID == "" || tc.Function.Name == "" {
		return llm.Block{}, fmt.Errorf("%s: id and function.name are required", path)
	}
	input, err := decodeArguments(path+".function.arguments", tc.Function.Arguments)
	if err != nil {
		return llm.Block{}, err
	}
	return llm.Block{Type: llm.BlockToolUse, ToolUseID: tc.ID, ToolName: tc.Function.Name, Input: input}, nil
}

// decodeArguments turns a function call's arguments string into a JSON
// object; an empty string is the empty object.
func decodeArguments(path, args string) (json.RawMessage, error) {
	if strings.TrimSpace(args) == "" {
		return json.RawMessage("{}"), nil
	}
	return wirejson.ObjectText(path, []byte(args))
}

// decodeTexts reads message content given as a string, null (nothing;
// allowed only for assistant turns) or an array of text parts. Refusal parts
// of an assistant turn count as text.
func decodeTexts(path string, raw json.RawMessage, nullOK bool) ([]string, error) {
	if !wirejson.Present(raw) {
		if nullOK {
			return nil, nil
		}
		return nil, fmt.Errorf("%s: required", path)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []string{s}, nil
	}
	var parts []wirePart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, fmt.Errorf("%s: must be a string or an array of content parts", path)
	}
	texts := make([]string, 0, len(parts))
	for i, p := range parts {
		switch p.Type {
		case "text":
			texts = append(texts, p.Text)
		case "refusal":
			texts = append(texts, p.Refusal)
		default:
			return nil, fmt.Errorf("%s[%d].type: %q is not supported, only \"text\"", path, i, p.Type)
		}
	}
	return texts, nil
}

func textBlocks(texts []string) []llm.Block {
	blocks := make([]llm.Block, 0, len(texts))
	for _, t := range texts {
		blocks = append(blocks, llm.Block{Type: llm.BlockText, Text: t})
	}
	return blocks
}

func decodeTool(i int, t wireTool) (llm.Tool, error) {
	if t.Type != "function" {
		return llm.Tool{}, fmt.Errorf("tools[%d].type: %q is not supported, only \"function\"", i, t.Type)
	}
	if t.Function.Name == "" {
		return llm.Tool{}, fmt.Errorf("tools[%d].function.name: required", i)
	}
	tool := llm.Tool{Name: t.Function.Name, Description: t.Function.Description}
	if wirejson.Present(t.Function.Parameters) {
		schema, err := wirejson.ObjectText(fmt.Sprintf("tools[%d].function.parameters", i), t.Function.Parameters)
		if err != nil {
			return llm.Tool{}, err
		}
		tool.InputSchema = schema
	}
	return tool, nil
}

func decodeToolChoice(raw json.RawMessage) (*llm.ToolChoice, error) {
	if !wirejson.Present(raw) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		switch s {
		case "auto":
			return &llm.ToolChoice{Mode: llm.ToolChoiceAuto}, nil
		case "required":
			return &llm.ToolChoice{Mode: llm.ToolChoiceAny}, nil
		case "none":
			return &llm.ToolChoice{Mode: llm.ToolChoiceNone}, nil
		}
		return nil, fmt.Errorf("tool_choice: must be \"auto\", \"required\", \"none\" or a function, got %q", s)
	}
	var o wireToolChoiceObject
	if err := json.Unmarshal(raw, &o); err != nil || o.Type != "function" || o.Function.Name == "" {
		return nil, errors.New(`tool_choice: an object must be {"type":"function","function":{"name":…}}`)
	}
	return &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: o.Function.Name}, nil
}

// EncodeRequest renders req as a Chat Completions request body.
//
//   - req.System becomes a leading system message.
//   - A message's content is a string when it has one text block, an array
//     of text parts when it has several.
//   - An assistant message's tool_use blocks become tool_calls (arguments is
//     the input JSON in a string); its text blocks become its content.
//   - A user message's tool_result blocks become one tool message each, sent
//     first because Chat Completions wants them right after the assistant's
//     calls; its text blocks follow as a user message. An error result is
//     marked with ToolErrorPrefix.
//   - MaxTokens goes in max_completion_tokens (omitted when zero);
//     tool_choice any is "required".
func EncodeRequest(req *llm.Request) ([]byte, error) {
	return encodeRequest(req, false)
}

// EncodeStreamRequest is EncodeRequest with streaming on: "stream": true
// and "stream_options": {"include_usage": true}, so that the stream ends
// with a chunk carrying the usage (see ReadStream).
func EncodeStreamRequest(req *llm.Request) ([]byte, error) {
	return encodeRequest(req, true)
}

func encodeRequest(req *llm.Request, stream bool) ([]byte, error) {
	if req == nil {
		return nil, errors.New("openai: encode request: nil request")
	}
	if req.Model == "" {
		return nil, errors.New("openai: encode request: model is empty")
	}
	out := outRequest{
		Model:               req.Model,
		Messages:            make([]outMessage, 0, len(req.Messages)+1),
		MaxCompletionTokens: max(req.MaxTokens, 0), // omitted when zero
		Temperature:         req.Temperature,
		Stop:                req.StopSequences,
	}
	if req.MaxTokensDefault {
		out.MaxCompletionTokens = 0 // the caller set none: the model's limit, as called directly
	}
	if req.System != "" {
		out.Messages = append(out.Messages, outMessage{Role: "system", Content: req.System})
	}
	for i, m := range req.Messages {
		msgs, err := encodeMessage(m)
		if err != nil {
			return nil, fmt.Errorf("openai: encode request: messages[%d]: %w", i, err)
		}
		out.Messages = append(out.Messages, msgs...)
	}
	for _, t := range req.Tools {
		fn := wireFunction{Name: t.Name, Description: t.Description}
		if wirejson.Present(t.InputSchema) {
			fn.Parameters = wirejson.ObjectOrEmpty(t.InputSchema, `{"type":"object"}`)
		}
		out.Tools = append(out.Tools, wireTool{Type: "function", Function: fn})
	}
	if tc := req.ToolChoice; tc != nil {
		switch tc.Mode {
		case llm.ToolChoiceAuto, "":
			out.ToolChoice = "auto"
		case llm.ToolChoiceAny:
			out.ToolChoice = "required"
		case llm.ToolChoiceNone:
			out.ToolChoice = "none"
		case llm.ToolChoiceTool:
			var o wireToolChoiceObject
			o.Type = "function"
			o.Function.Name = tc.Name
			out.ToolChoice = o
		default:
			return nil, fmt.Errorf("openai: encode request: tool_choice: unknown mode %q", tc.Mode)
		}
	}
	if stream {
		out.Stream = true
		out.StreamOptions = &outStreamOptions{IncludeUsage: true}
	}
	body, err := wirejson.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("openai: encode request: %w", err)
	}
	return body, nil
}

// encodeMessage renders one llm message as one or more wire messages.
func encodeMessage(m llm.Message) ([]outMessage, error) {
	var texts []string
	var calls []wireToolCall
	var tools []outMessage
	for j, b := range m.Content {
		switch b.Type {
		case llm.BlockText:
			texts = append(texts, b.Text)
		case llm.BlockToolUse:
			if m.Role != llm.RoleAssistant {
				return nil, fmt.Errorf("content[%d]: tool_use in a %s message", j, m.Role)
			}
			calls = append(calls, toolCallOf(b))
		case llm.BlockToolResult:
			if m.Role != llm.RoleUser {
				return nil, fmt.Errorf("content[%d]: tool_result in a %s message", j, m.Role)
			}
			text := b.Text
			if b.IsError {
				text = ToolErrorPrefix + text
			}
			tools = append(tools, outMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: text})
		default:
			return nil, fmt.Errorf("content[%d]: unknown block type %q", j, b.Type)
		}
	}
	switch m.Role {
	case llm.RoleAssistant:
		msg := outMessage{Role: "assistant", ToolCalls: calls}
		if len(texts) > 0 || len(calls) == 0 {
			msg.Content = contentOf(texts)
		}
		return []outMessage{msg}, nil
	case llm.RoleUser:
		if len(texts) > 0 || len(tools) == 0 {
			tools = append(tools, outMessage{Role: "user", Content: contentOf(texts)})
		}
		return tools, nil
	default:
		return nil, fmt.Errorf("unknown role %q", m.Role)
	}
}

// contentOf is a string for zero or one text, an array of text parts for
// more, so that a multi-block message survives a round trip.
func contentOf(texts []string) any {
	switch len(texts) {
	case 0:
		return ""
	case 1:
		return texts[0]
	}
	parts := make([]wirePart, 0, len(texts))
	for _, t := range texts {
		parts = append(parts, wirePart{Type: "text", Text: t})
	}
	return parts
}

func toolCallOf(b llm.Block) wireToolCall {
	return wireToolCall{
		ID:   b.ToolUseID,
		Type: "function",
		Function: wireFunctionCall{
			Name:      b.ToolName,
			Arguments: string(wirejson.ObjectOrEmpty(b.Input, "{}")),
		},
	}
}
