package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/internal/wirejson"
)

// DefaultMaxTokens is the max_tokens EncodeRequest sends when the request
// has none (an OpenAI-shaped request may omit it; the Messages API requires
// it).
const DefaultMaxTokens = 4096

// MaxTemperature is the highest temperature the Messages API accepts
// (OpenAI's range goes to 2). EncodeRequest clamps to it so that a request
// translated from OpenAI's range does not fail as invalid.
const MaxTemperature = 1.0

// RequestInfo is what a Messages API request says beyond llm.Request.
type RequestInfo struct {
	// Model is the model the client asked for, as sent (also in
	// llm.Request.Model).
	Model string
	// Stream is true when the client asked for an SSE stream.
	Stream bool
	// Metadata is the request's metadata object as sent, nil when absent.
	Metadata json.RawMessage
	// UserID is metadata.user_id, the client's opaque end-user id.
	UserID string
	// DisableParallelToolUse is tool_choice.disable_parallel_tool_use.
	DisableParallelToolUse bool
	// Ignored lists the top-level fields that were present but that Bulwark
	// does not carry over (top_p, top_k, thinking, …), sorted.
	Ignored []string
}

// handledFields are the top-level request fields DecodeRequest carries over.
var handledFields = []string{
	"model", "max_tokens", "system", "messages", "temperature", "stop_sequences",
	"tools", "tool_choice", "stream", "metadata",
}

// DecodeRequest parses a Messages API request body. Content given as a
// string or as an array of blocks both decode; so does a system prompt given
// as a string or as text blocks (joined with a blank line). Image, document
// and thinking blocks and server tools are rejected, since the neutral model
// cannot carry them. The error names the offending field and is meant for a
// 400 answer.
func DecodeRequest(body []byte) (*RequestInfo, *llm.Request, error) {
	return decodeRequest(body, true)
}

// DecodeCountTokensRequest parses a token-counting request body (POST
// /v1/messages/count_tokens): a Messages request without max_tokens, as
// Anthropic's count_tokens takes it; the request's MaxTokens is 0 unless
// the body gives one anyway.
func DecodeCountTokensRequest(body []byte) (*RequestInfo, *llm.Request, error) {
	return decodeRequest(body, false)
}

// decodeRequest is DecodeRequest, requiring max_tokens when needMaxTokens.
func decodeRequest(body []byte, needMaxTokens bool) (*RequestInfo, *llm.Request, error) {
	var w wireRequest
	if err := wirejson.Unmarshal(body, &w); err != nil {
		return nil, nil, err
	}
	info := &RequestInfo{Model: w.Model, Stream: w.Stream}
	ignored, err := wirejson.UnknownFields(body, handledFields)
	if err != nil {
		return nil, nil, err
	}
	info.Ignored = ignored

	if w.Model == "" {
		return nil, nil, errors.New("model: required")
	}
	if w.MaxTokens == nil && needMaxTokens {
		return nil, nil, errors.New("max_tokens: required")
	}
	if w.MaxTokens != nil && *w.MaxTokens < 1 {
		return nil, nil, fmt.Errorf("max_tokens: must be at least 1, got %d", *w.MaxTokens)
	}
	if len(w.Messages) == 0 {
		return nil, nil, errors.New("messages: at least one message is required")
	}
	req := &llm.Request{
		Model:         w.Model,
		Temperature:   w.Temperature,
		StopSequences: w.StopSequences,
	}
	if w.MaxTokens != nil {
		req.MaxTokens = *w.MaxTokens
	}
	if req.System, err = decodeSystem(w.System); err != nil {
		return nil, nil, err
	}
	if wirejson.Present(w.Metadata) {
		info.Metadata = w.Metadata
		var md struct {
			UserID string `json:"user_id"`
		}
		if err := json.Unmarshal(w.Metadata, &md); err != nil {
			return nil, nil, errors.New("metadata: must be an object with an optional string user_id")
		}
		info.UserID = md.UserID
	}
	for i, m := range w.Messages {
		msg, err := decodeMessage(i, m)
		if err != nil {
			return nil, nil, err
		}
		req.Messages = append(req.Messages, msg)
	}
	for i, t := range w.Tools {
		tool, err := decodeTool(i, t)
		if err != nil {
			return nil, nil, err
		}
		req.Tools = append(req.Tools, tool)
	}
	if w.ToolChoice != nil {
		tc, err := decodeToolChoice(*w.ToolChoice)
		if err != nil {
			return nil, nil, err
		}
		req.ToolChoice = tc
		info.DisableParallelToolUse = w.ToolChoice.DisableParallelToolUse
	}
	return info, req, nil
}

func decodeSystem(raw json.RawMessage) (string, error) {
	if !wirejson.Present(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var blocks []wireBlockIn
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", errors.New("system: must be a string or an array of text blocks")
	}
	var parts []string
	for i, b := range blocks {
		if b.Type != "text" {
			return "", fmt.Errorf("system[%d].type: %q is not supported, only \"text\"", i, b.Type)
		}
		parts = append(parts, b.Text)
	}
	return joinParagraphs(parts), nil
}

// joinParagraphs joins the texts of several system blocks or messages into
// one system prompt.
func joinParagraphs(parts []string) string {
	var b bytes.Buffer
	for i, p := range parts {
		if i > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(p)
	}
	return b.String()
}

func decodeMessage(i int, m wireMessageIn) (llm.Message, error) {
	role := llm.Role(m.Role)
	if role != llm.RoleUser && role != llm.RoleAssistant {
		return llm.Message{}, fmt.Errorf("messages[%d].role: must be \"user\" or \"assistant\", got %q", i, m.Role)
	}
	msg := llm.Message{Role: role}
	if !wirejson.Present(m.Content) {
		return llm.Message{}, fmt.Errorf("messages[%d].content: required", i)
	}
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		msg.Content = []llm.Block{{Type: llm.BlockText, Text: s}}
		return msg, nil
	}
	var blocks []wireBlockIn
	if err := json.Unmarshal(m.Content, &blocks); err != nil {
		return llm.Message{}, fmt.Errorf("messages[%d].content: must be a string or an array of content blocks", i)
	}
	msg.Content = make([]llm.Block, 0, len(blocks))
	for j, b := range blocks {
		path := fmt.Sprintf("messages[%d].content[%d]", i, j)
		blk, err := decodeBlock(path, role, b)
		if err != nil {
			return llm.Message{}, err
		}
		msg.Content = append(msg.Content, blk)
	}
	return msg, nil
}

func decodeBlock(path string, role llm.Role, b wireBlockIn) (llm.Block, error) {
	switch b.Type {
	case "text":
		return llm.Block{Type: llm.BlockText, Text: b.Text}, nil
	case "tool_use":
		if role != llm.RoleAssistant {
			return llm.Block{}, fmt.Errorf("%s: tool_use blocks belong in assistant messages", path)
		}
		if b.ID == "" || b.Name == "" {
			return llm.Block{}, fmt.Errorf("%s: tool_use needs id and name", path)
		}
		input, err := wirejson.Object(path+".input", b.Input)
		if err != nil {
			return llm.Block{}, err
		}
		return llm.Block{Type: llm.BlockToolUse, ToolUseID: b.ID, ToolName: b.Name, Input: input}, nil
	case "tool_result":
		if role != llm.RoleUser {
			return llm.Block{}, fmt.Errorf("%s: tool_result blocks belong in user messages", path)
		}
		if b.ToolUseID == "" {
			return llm.Block{}, fmt.Errorf("%s.tool_use_id: required", path)
		}
		text, err := decodeToolResultContent(path+".content", b.Content)
		if err != nil {
			return llm.Block{}, err
		}
		return llm.Block{Type: llm.BlockToolResult, ToolUseID: b.ToolUseID, Text: text, IsError: b.IsError}, nil
	case "":
		return llm.Block{}, fmt.Errorf("%s.type: required", path)
	default:
		return llm.Block{}, fmt.Errorf("%s.type: %q is not supported (text, tool_use and tool_result are)", path, b.Type)
	}
}

// decodeToolResultContent accepts a tool_result's content as absent, a
// string, or an array of text blocks (concatenated).
func decodeToolResultContent(path string, raw json.RawMessage) (string, error) {
	if !wirejson.Present(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var blocks []wireBlockIn
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", fmt.Errorf("%s: must be a string or an array of text blocks", path)
	}
	var b bytes.Buffer
	for i, blk := range blocks {
		if blk.Type != "text" {
			return "", fmt.Errorf("%s[%d].type: %q is not supported, only \"text\"", path, i, blk.Type)
		}
		b.WriteString(blk.Text)
	}
	return b.String(), nil
}

func decodeTool(i int, t wireTool) (llm.Tool, error) {
	if t.Type != "" && t.Type != "custom" {
		return llm.Tool{}, fmt.Errorf("tools[%d].type: %q is not supported, only client tools", i, t.Type)
	}
	if t.Name == "" {
		return llm.Tool{}, fmt.Errorf("tools[%d].name: required", i)
	}
	schema, err := wirejson.Object(fmt.Sprintf("tools[%d].input_schema", i), t.InputSchema)
	if err != nil {
		return llm.Tool{}, err
	}
	return llm.Tool{Name: t.Name, Description: t.Description, InputSchema: schema}, nil
}

func decodeToolChoice(tc wireToolChoice) (*llm.ToolChoice, error) {
	mode := llm.ToolChoiceMode(tc.Type)
	switch mode {
	case llm.ToolChoiceAuto, llm.ToolChoiceAny, llm.ToolChoiceNone:
		return &llm.ToolChoice{Mode: mode}, nil
	case llm.ToolChoiceTool:
		if tc.Name == "" {
			return nil, errors.New("tool_choice.name: required when type is \"tool\"")
		}
		return &llm.ToolChoice{Mode: mode, Name: tc.Name}, nil
	default:
		return nil, fmt.Errorf("tool_choice.type: must be auto, any, tool or none, got %q", tc.Type)
	}
}

// EncodeRequest renders req as a Messages API request body. The model is
// req.Model and must be set; a zero MaxTokens becomes DefaultMaxTokens and a
// temperature above MaxTemperature is clamped to it. Content is always sent
// as an array of blocks and a tool_result's content as a string.
func EncodeRequest(req *llm.Request) ([]byte, error) {
	return encodeRequest(req, false)
}

// EncodeStreamRequest is EncodeRequest with "stream": true, for a Messages
// event stream (see ReadStream).
func EncodeStreamRequest(req *llm.Request) ([]byte, error) {
	return encodeRequest(req, true)
}

func encodeRequest(req *llm.Request, stream bool) ([]byte, error) {
	if req == nil {
		return nil, errors.New("anthropic: encode request: nil request")
	}
	if req.Model == "" {
		return nil, errors.New("anthropic: encode request: model is empty")
	}
	out := outRequest{
		Model:         req.Model,
		MaxTokens:     req.MaxTokens,
		System:        req.System,
		Messages:      make([]outMessage, 0, len(req.Messages)),
		StopSequences: req.StopSequences,
	}
	if out.MaxTokens <= 0 {
		out.MaxTokens = DefaultMaxTokens
	}
	if req.Temperature != nil {
		t := min(max(*req.Temperature, 0), MaxTemperature)
		out.Temperature = &t
	}
	for i, m := range req.Messages {
		if m.Role != llm.RoleUser && m.Role != llm.RoleAssistant {
			return nil, fmt.Errorf("anthropic: encode request: messages[%d]: unknown role %q", i, m.Role)
		}
		om := outMessage{Role: string(m.Role), Content: make([]outBlock, 0, len(m.Content))}
		for j, b := range m.Content {
			ob, err := encodeBlock(b)
			if err != nil {
				return nil, fmt.Errorf("anthropic: encode request: messages[%d].content[%d]: %w", i, j, err)
			}
			om.Content = append(om.Content, ob)
		}
		out.Messages = append(out.Messages, om)
	}
	for _, t := range req.Tools {
		out.Tools = append(out.Tools, wireTool{
			Name:        t.Name,
			Description: t.Description,
			InputSchema: wirejson.ObjectOrEmpty(t.InputSchema, `{"type":"object"}`),
		})
	}
	if tc := req.ToolChoice; tc != nil {
		mode := tc.Mode
		if mode == "" {
			mode = llm.ToolChoiceAuto
		}
		if !slices.Contains([]llm.ToolChoiceMode{llm.ToolChoiceAuto, llm.ToolChoiceAny, llm.ToolChoiceTool, llm.ToolChoiceNone}, mode) {
			return nil, fmt.Errorf("anthropic: encode request: tool_choice: unknown mode %q", tc.Mode)
		}
		out.ToolChoice = &wireToolChoice{Type: string(mode)}
		if mode == llm.ToolChoiceTool {
			out.ToolChoice.Name = tc.Name
		}
	}
	out.Stream = stream
	body, err := wirejson.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("anthropic: encode request: %w", err)
	}
	return body, nil
}

// encodeBlock renders one content block, in a request or a response.
func encodeBlock(b llm.Block) (outBlock, error) {
	switch b.Type {
	case llm.BlockText:
		return outBlock{Type: "text", Text: &b.Text}, nil
	case llm.BlockToolUse:
		return outBlock{Type: "tool_use", ID: b.ToolUseID, Name: b.ToolName, Input: wirejson.ObjectOrEmpty(b.Input, "{}")}, nil
	case llm.BlockToolResult:
		return outBlock{Type: "tool_result", ToolUseID: b.ToolUseID, Content: &b.Text, IsError: b.IsError}, nil
	default:
		return outBlock{}, fmt.Errorf("unknown block type %q", b.Type)
	}
}
