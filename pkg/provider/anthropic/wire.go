package anthropic

import "encoding/json"

// Wire structs of the Messages API. Decoding structs keep polymorphic fields
// (a string or an array of blocks) as json.RawMessage and resolve them by
// hand, so that errors can name the field; encoding structs are concrete, so
// that output is deterministic and golden-testable.

// wireRequest is a Messages API request as received (DecodeRequest).
type wireRequest struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	System        json.RawMessage `json:"system"`
	Messages      []wireMessageIn `json:"messages"`
	Temperature   *float64        `json:"temperature"`
	StopSequences []string        `json:"stop_sequences"`
	Tools         []wireTool      `json:"tools"`
	ToolChoice    *wireToolChoice `json:"tool_choice"`
	Stream        bool            `json:"stream"`
	Metadata      json.RawMessage `json:"metadata"`
}

type wireMessageIn struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// wireBlockIn is any content block as received; which fields matter depends
// on Type.
type wireBlockIn struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// outRequest is a Messages API request as sent (EncodeRequest).
type outRequest struct {
	Model         string          `json:"model"`
	MaxTokens     int             `json:"max_tokens"`
	System        string          `json:"system,omitempty"`
	Messages      []outMessage    `json:"messages"`
	Temperature   *float64        `json:"temperature,omitempty"`
	StopSequences []string        `json:"stop_sequences,omitempty"`
	Tools         []wireTool      `json:"tools,omitempty"`
	ToolChoice    *wireToolChoice `json:"tool_choice,omitempty"`
	// Stream is set by EncodeStreamRequest only, so that EncodeRequest's
	// output does not change.
	Stream bool `json:"stream,omitempty"`
}

type outMessage struct {
	Role    string     `json:"role"`
	Content []outBlock `json:"content"`
}

// outBlock is a content block as sent, in a request or a response.
type outBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   *string         `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
}

type wireTool struct {
	// Type is empty or "custom" for a client tool; Anthropic's server tools
	// (web_search_…, bash_…) carry their own type and are not supported.
	Type        string          `json:"type,omitempty"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type wireToolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name,omitempty"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use,omitempty"`
}

// wireResponse is a Messages API response, both ways.
type wireResponse struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      json.RawMessage `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        wireUsage       `json:"usage"`
}

type outResponse struct {
	ID           string     `json:"id"`
	Type         string     `json:"type"`
	Role         string     `json:"role"`
	Model        string     `json:"model"`
	Content      []outBlock `json:"content"`
	StopReason   *string    `json:"stop_reason"`
	StopSequence *string    `json:"stop_sequence"`
	Usage        wireUsage  `json:"usage"`
}

type wireUsage struct {
	InputTokens              int  `json:"input_tokens"`
	OutputTokens             int  `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens,omitempty"`
}

// wireError is the error body: {"type":"error","error":{...},"request_id":…}.
type wireError struct {
	Type  string          `json:"type"`
	Error wireErrorDetail `json:"error"`
	// RequestID is Anthropic's request id, echoed for support.
	RequestID string `json:"request_id,omitempty"`
}

type wireErrorDetail struct {
	Type    string            `json:"type"`
	Message string            `json:"message"`
	Details *wireErrorDetails `json:"details,omitempty"`
}

// wireErrorDetails carries the machine-readable cause some errors add, e.g.
// {"error_code":"enforced_spend_limit_reached"} on a tier spend cap.
type wireErrorDetails struct {
	ErrorCode string `json:"error_code,omitempty"`
}

// wireEvent is any event of a Messages stream as received (ReadStream);
// which fields matter depends on Type.
type wireEvent struct {
	Type string `json:"type"`
	// Message is message_start's.
	Message struct {
		ID    string         `json:"id"`
		Model string         `json:"model"`
		Usage wireEventUsage `json:"usage"`
	} `json:"message"`
	// Index and ContentBlock are content_block_start's; Index is also
	// content_block_delta's and content_block_stop's.
	Index        int         `json:"index"`
	ContentBlock wireBlockIn `json:"content_block"`
	// Delta is content_block_delta's (Type, Text, PartialJSON) or
	// message_delta's (StopReason).
	Delta struct {
		Type        string  `json:"type"`
		Text        string  `json:"text"`
		PartialJSON string  `json:"partial_json"`
		StopReason  *string `json:"stop_reason"`
	} `json:"delta"`
	// Usage is message_delta's.
	Usage wireEventUsage `json:"usage"`
}

// wireEventUsage is a stream's usage: message_start's, and message_delta's
// cumulative counts, where any field may be missing.
type wireEventUsage struct {
	InputTokens              *int `json:"input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
}
