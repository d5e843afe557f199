package openai

import "encoding/json"

// Wire structs of the Chat Completions API. Decoding structs keep
// polymorphic fields (content as a string or an array of parts, stop as a
// string or an array, tool_choice as a string or an object) as
// json.RawMessage and resolve them by hand so that errors can name the
// field; encoding structs are concrete so that output is deterministic.

// wireRequest is a Chat Completions request as received (DecodeRequest).
type wireRequest struct {
	Model               string          `json:"model"`
	Messages            []wireMessageIn `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	Stop                json.RawMessage `json:"stop"`
	Tools               []wireTool      `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N        *int            `json:"n"`
	User     string          `json:"user"`
	Metadata json.RawMessage `json:"metadata"`
}

type wireMessageIn struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []wireToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
	Refusal    *string         `json:"refusal"`
}

// wirePart is one element of an array-of-parts content.
type wirePart struct {
	Type    string `json:"type"`
	Text    string `json:"text"`
	Refusal string `json:"refusal,omitempty"`
}

// wireToolCall is an assistant's function call, in a request, a response or
// (with Index) a stream delta.
type wireToolCall struct {
	Index    *int             `json:"index,omitempty"`
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function wireFunctionCall `json:"function"`
}

type wireFunctionCall struct {
	Name string `json:"name,omitempty"`
	// Arguments is the call's input as a JSON document in a string.
	Arguments string `json:"arguments"`
}

type wireTool struct {
	Type     string       `json:"type"`
	Function wireFunction `json:"function"`
}

type wireFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

type wireToolChoiceObject struct {
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
	} `json:"function"`
}

// outRequest is a Chat Completions request as sent (EncodeRequest).
type outRequest struct {
	Model               string       `json:"model"`
	Messages            []outMessage `json:"messages"`
	MaxCompletionTokens int          `json:"max_completion_tokens,omitempty"`
	Temperature         *float64     `json:"temperature,omitempty"`
	Stop                []string     `json:"stop,omitempty"`
	Tools               []wireTool   `json:"tools,omitempty"`
	// ToolChoice is a string ("auto", "required", "none") or a
	// wireToolChoiceObject.
	ToolChoice any `json:"tool_choice,omitempty"`
	// Stream and StreamOptions are set by EncodeStreamRequest only, so
	// that EncodeRequest's output does not change.
	Stream        bool              `json:"stream,omitempty"`
	StreamOptions *outStreamOptions `json:"stream_options,omitempty"`
}

type outStreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type outMessage struct {
	Role string `json:"role"`
	// Content is a string, a []wirePart, or nil (omitted) for an assistant
	// turn that only calls tools.
	Content    any            `json:"content,omitempty"`
	ToolCalls  []wireToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

// wireResponse is a Chat Completions response as received.
type wireResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Model   string       `json:"model"`
	Choices []wireChoice `json:"choices"`
	Usage   *wireUsage   `json:"usage"`
}

type wireChoice struct {
	Index        int           `json:"index"`
	Message      wireMessageIn `json:"message"`
	FinishReason *string       `json:"finish_reason"`
}

type wireUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// outResponse is a Chat Completions response as sent (EncodeResponse).
type outResponse struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices []outChoice `json:"choices"`
	Usage   wireUsage   `json:"usage"`
}

type outChoice struct {
	Index        int             `json:"index"`
	Message      outAssistant    `json:"message"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

type outAssistant struct {
	Role      string         `json:"role"`
	Content   *string        `json:"content"`
	Refusal   *string        `json:"refusal"`
	ToolCalls []wireToolCall `json:"tool_calls,omitempty"`
}

// outChunk is one chat.completion.chunk of a stream.
type outChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *wireUsage    `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int             `json:"index"`
	Delta        chunkDelta      `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type chunkDelta struct {
	Role      string         `json:"role,omitempty"`
	Content   *string        `json:"content,omitempty"`
	ToolCalls []wireToolCall `json:"tool_calls,omitempty"`
}

// wireChunk is one chat.completion.chunk of a stream as received
// (ReadStream). Error and Object catch an error sent in the stream's
// place: OpenAI's {"error":{…}}, or {"object":"error",…} from compatible
// hosts.
type wireChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Model   string            `json:"model"`
	Choices []wireChunkChoice `json:"choices"`
	Usage   *wireUsage        `json:"usage"`
	Error   json.RawMessage   `json:"error"`
}

type wireChunkChoice struct {
	Index        int            `json:"index"`
	Delta        wireChunkDelta `json:"delta"`
	FinishReason *string        `json:"finish_reason"`
}

type wireChunkDelta struct {
	Content   *string        `json:"content"`
	Refusal   *string        `json:"refusal"`
	ToolCalls []wireToolCall `json:"tool_calls"`
}

// wireErrorDetail is the "error" object of an error body. Code is kept raw:
// OpenAI sends a string or null, some compatible hosts a number.
type wireErrorDetail struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Param   json.RawMessage `json:"param"`
	Code    json.RawMessage `json:"code"`
}

// outError is an error body as sent (EncodeError).
type outError struct {
	Error outErrorDetail `json:"error"`
}

type outErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// nullJSON is the literal null, for fields OpenAI always sends (logprobs).
const nullJSON = "null"
