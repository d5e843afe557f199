package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/internal/wirejson"
)

// The Responses API (POST /v1/responses) is OpenAI's newer chat API, the
// one the AI SDK's default OpenAI model and OpenAI's newer clients call.
// Bulwark speaks its stateless subset: the conversation travels whole in
// input, as in Chat Completions (item_reference items naming the
// tenant's own earlier answers are resolved into the items themselves by
// pkg/httpapi before decoding). What needs state on the server
// (previous_response_id, conversation, background runs) and what needs OpenAI's own tools (web_search, file_search, …) is
// refused with a 400 naming the parameter, rather than answered as though
// the caller had not asked for it.

// ResponsesInfo is what a Responses request says beyond llm.Request.
type ResponsesInfo struct {
	// Model is the model the client asked for, as sent.
	Model string
	// Stream is true when the client asked for an SSE stream.
	Stream bool
	// Metadata is the request's metadata object as sent, nil when absent.
	Metadata json.RawMessage
	// Ignored lists the top-level fields that were present but that Bulwark
	// does not carry over (top_p, text, reasoning, include, …), sorted.
	Ignored []string
}

// responsesHandled are the top-level request fields DecodeResponsesRequest
// carries over or checks.
var responsesHandled = []string{
	"model", "input", "instructions", "tools", "tool_choice", "max_output_tokens",
	"temperature", "metadata", "stream", "store", "parallel_tool_calls", "user",
	"previous_response_id", "conversation", "background", "prompt",
}

// wireResponsesRequest is a Responses request as received.
type wireResponsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	Tools              []wireRespTool  `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Temperature        *float64        `json:"temperature"`
	Metadata           json.RawMessage `json:"metadata"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	User               string          `json:"user"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Conversation       json.RawMessage `json:"conversation"`
	Background         *bool           `json:"background"`
	Prompt             json.RawMessage `json:"prompt"`
}

// wireRespItem is one element of input: a message (with or without
// "type":"message"), a function_call or a function_call_output.
type wireRespItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// function_call
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	// function_call_output
	Output json.RawMessage `json:"output"`
}

// wireRespPart is one content part of an input message.
type wireRespPart struct {
	Type    string `json:"type"`
	Text    string `json:"text"`
	Refusal string `json:"refusal"`
}

// wireRespTool is a tool as the Responses API declares one: flat, not
// nested under "function" as in Chat Completions.
type wireRespTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
}

// DecodeResponsesRequest parses a Responses API request body.
//
//   - input is a string (one user message) or an array of items: messages
//     (role user, assistant, system or developer; content a string or
//     input_text/output_text parts), function_call items (an assistant
//     tool_use block, joining the assistant turn before it) and
//     function_call_output items (a user tool_result block; a run of them,
//     and a user message right after, make one user message).
//   - instructions, then system and developer messages, become
//     llm.Request.System, joined with a blank line.
//   - store is accepted either way and nothing is stored: the answer says
//     "store": false.
//   - previous_response_id, conversation, prompt, background: true,
//     item_reference and reasoning items, and tools other than function
//     tools are refused: each needs state or tools Bulwark does not have.
//
// The error names the offending field and is meant for a 400 answer.
func DecodeResponsesRequest(body []byte) (*ResponsesInfo, *llm.Request, error) {
	var w wireResponsesRequest
	if err := wirejson.Unmarshal(body, &w); err != nil {
		return nil, nil, err
	}
	ignored, err := wirejson.UnknownFields(body, responsesHandled)
	if err != nil {
		return nil, nil, err
	}
	if err := refuseStateful(&w); err != nil {
		return nil, nil, err
	}
	info := &ResponsesInfo{Model: w.Model, Stream: w.Stream, Ignored: ignored}
	if wirejson.Present(w.Metadata) {
		info.Metadata = w.Metadata
	}
	if w.Model == "" {
		return nil, nil, errors.New("model: required")
	}
	req := &llm.Request{Model: w.Model, Temperature: w.Temperature}
	if w.MaxOutputTokens != nil {
		if *w.MaxOutputTokens < 0 {
			return nil, nil, fmt.Errorf("max_output_tokens: must not be negative, got %d", *w.MaxOutputTokens)
		}
		req.MaxTokens = *w.MaxOutputTokens
	}
	var system []string
	if w.Instructions != nil && *w.Instructions != "" {
		system = append(system, *w.Instructions)
	}
	if system, err = decodeInput(req, w.Input, system); err != nil {
		return nil, nil, err
	}
	req.System = strings.Join(system, "\n\n")
	for i, t := range w.Tools {
		tool, err := decodeRespTool(i, t)
		if err != nil {
			return nil, nil, err
		}
		req.Tools = append(req.Tools, tool)
	}
	if req.ToolChoice, err = decodeRespToolChoice(w.ToolChoice); err != nil {
		return nil, nil, err
	}
	return info, req, nil
}

// refuseStateful refuses the parameters that need a response stored on
// the server or a run that outlives the call.
func refuseStateful(w *wireResponsesRequest) error {
	const stateless = "Bulwark answers statelessly and stores no responses; send the whole conversation in input"
	switch {
	case wirejson.Present(w.PreviousResponseID):
		return errors.New("previous_response_id: not supported: " + stateless)
	case wirejson.Present(w.Conversation):
		return errors.New("conversation: not supported: " + stateless)
	case wirejson.Present(w.Prompt):
		return errors.New("prompt: stored prompt templates are not supported; send instructions and input instead")
	case w.Background != nil && *w.Background:
		return errors.New("background: true is not supported: a call is answered while the caller waits (or streams); use POST /v1/requests for asynchronous calls")
	}
	return nil
}

// decodeInput fills req.Messages from input and returns system with the
// texts of system and developer messages appended.
func decodeInput(req *llm.Request, raw json.RawMessage, system []string) ([]string, error) {
	if !wirejson.Present(raw) {
		return nil, errors.New("input: required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		req.Messages = []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: s}}}}
		return system, nil
	}
	var items []wireRespItem
	if err := wirejson.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("input: must be a string or an array of items: %w", err)
	}
	d := inputDecoder{req: req, toolTurn: -1}
	for i, it := range items {
		text, isSystem, err := d.item(fmt.Sprintf("input[%d]", i), it)
		if err != nil {
			return nil, err
		}
		if isSystem {
			system = append(system, text)
		}
	}
	if len(req.Messages) == 0 {
		return nil, errors.New("input: at least one user or assistant item is required")
	}
	return system, nil
}

// inputDecoder turns input items into llm messages, one at a time.
type inputDecoder struct {
	req *llm.Request
	// toolTurn is the index in req.Messages of the user message that the
	// current run of function_call_output items fills, -1 when there is
	// none.
	toolTurn int
}

// item decodes one input item; a system or developer message's text is
// returned with isSystem set instead.
func (d *inputDecoder) item(path string, it wireRespItem) (text string, isSystem bool, err error) {
	switch it.Type {
	case "", "message":
		return d.message(path, it)
	case "function_call":
		return "", false, d.functionCall(path, it)
	case "function_call_output":
		return "", false, d.functionOutput(path, it)
	case "item_reference":
		return "", false, fmt.Errorf("%s.type: item_reference is not supported here: send the item itself", path)
	case "reasoning":
		return "", false, fmt.Errorf("%s.type: reasoning items are not supported: Bulwark's answers carry none; leave them out", path)
	default:
		return "", false, fmt.Errorf("%s.type: %q is not supported (message, function_call and function_call_output are)", path, it.Type)
	}
}

func (d *inputDecoder) message(path string, it wireRespItem) (string, bool, error) {
	switch it.Role {
	case "system", "developer":
		texts, err := decodeRespContent(path+".content", it.Content)
		return strings.Join(texts, ""), true, err
	case "user":
		texts, err := decodeRespContent(path+".content", it.Content)
		if err != nil {
			return "", false, err
		}
		blocks := textBlocks(texts)
		if d.toolTurn >= 0 {
			// The text after a run of tool results joins their turn, as
			// DecodeRequest does for Chat Completions' tool messages.
			d.req.Messages[d.toolTurn].Content = append(d.req.Messages[d.toolTurn].Content, blocks...)
			d.toolTurn = -1
			return "", false, nil
		}
		d.req.Messages = append(d.req.Messages, llm.Message{Role: llm.RoleUser, Content: blocks})
	case "assistant":
		texts, err := decodeRespContent(path+".content", it.Content)
		if err != nil {
			return "", false, err
		}
		d.assistant().Content = append(d.assistant().Content, textBlocks(texts)...)
	case "":
		return "", false, fmt.Errorf("%s.role: required", path)
	default:
		return "", false, fmt.Errorf("%s.role: %q is not supported (user, assistant, system and developer are)", path, it.Role)
	}
	return "", false, nil
}

// assistant returns the assistant turn under way: the last message when it
// is the assistant's (a function_call item follows the message item it
// belongs to), else a new one.
func (d *inputDecoder) assistant() *llm.Message {
	d.toolTurn = -1
	msgs := d.req.Messages
	if n := len(msgs); n > 0 && msgs[n-1].Role == llm.RoleAssistant {
		return &d.req.Messages[n-1]
	}
	d.req.Messages = append(msgs, llm.Message{Role: llm.RoleAssistant, Content: []llm.Block{}})
	return &d.req.Messages[len(d.req.Messages)-1]
}

func (d *inputDecoder) functionCall(path string, it wireRespItem) error {
	if it.CallID == "" || it.Name == "" {
		return fmt.Errorf("%s: call_id and name are required", path)
	}
	input, err := decodeArguments(path+".arguments", it.Arguments)
	if err != nil {
		return err
	}
	a := d.assistant()
	a.Content = append(a.Content, llm.Block{Type: llm.BlockToolUse, ToolUseID: it.CallID, ToolName: it.Name, Input: input})
	return nil
}

func (d *inputDecoder) functionOutput(path string, it wireRespItem) error {
	if it.CallID == "" {
		return fmt.Errorf("%s.call_id: required", path)
	}
	texts, err := decodeRespContent(path+".output", it.Output)
	if err != nil {
		return err
	}
	text, isErr := strings.CutPrefix(strings.Join(texts, ""), ToolErrorPrefix)
	blk := llm.Block{Type: llm.BlockToolResult, ToolUseID: it.CallID, Text: text, IsError: isErr}
	if d.toolTurn < 0 {
		d.req.Messages = append(d.req.Messages, llm.Message{Role: llm.RoleUser})
		d.toolTurn = len(d.req.Messages) - 1
	}
	d.req.Messages[d.toolTurn].Content = append(d.req.Messages[d.toolTurn].Content, blk)
	return nil
}

// decodeRespContent reads a message's content (or a function_call_output's
// output): a string or an array of text parts. Images and files are
// refused: no route is promised to read them.
func decodeRespContent(path string, raw json.RawMessage) ([]string, error) {
	if !wirejson.Present(raw) {
		return nil, fmt.Errorf("%s: required", path)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []string{s}, nil
	}
	var parts []wireRespPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, fmt.Errorf("%s: must be a string or an array of content parts", path)
	}
	texts := make([]string, 0, len(parts))
	for i, p := range parts {
		switch p.Type {
		case "input_text", "output_text":
			texts = append(texts, p.Text)
		case "refusal":
			texts = append(texts, p.Refusal)
		default:
			return nil, fmt.Errorf("%s[%d].type: %q is not supported, only \"input_text\" and \"output_text\"", path, i, p.Type)
		}
	}
	return texts, nil
}

func decodeRespTool(i int, t wireRespTool) (llm.Tool, error) {
	if t.Type != "function" {
		return llm.Tool{}, fmt.Errorf("tools[%d].type: %q is not supported: only function tools are; OpenAI's built-in tools run on OpenAI's side and Bulwark may answer from another provider", i, t.Type)
	}
	if t.Name == "" {
		return llm.Tool{}, fmt.Errorf("tools[%d].name: required", i)
	}
	tool := llm.Tool{Name: t.Name, Description: t.Description}
	if wirejson.Present(t.Parameters) {
		schema, err := wirejson.ObjectText(fmt.Sprintf("tools[%d].parameters", i), t.Parameters)
		if err != nil {
			return llm.Tool{}, err
		}
		tool.InputSchema = schema
	}
	return tool, nil
}

func decodeRespToolChoice(raw json.RawMessage) (*llm.ToolChoice, error) {
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
	var o struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &o); err != nil || o.Type != "function" || o.Name == "" {
		return nil, errors.New(`tool_choice: an object must be {"type":"function","name":…}`)
	}
	return &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: o.Name}, nil
}
