// Package llm is Bulwark's own provider-neutral model of a chat request and
// its answer, and the closed classification of provider failures that the
// key pool, breaker, fallback, retries and metrics all consume.
//
// Provider adapters (pkg/provider/...) translate between this model and each
// provider's wire format; nothing outside them knows a wire format.
package llm

import (
	"context"
	"encoding/json"
	"time"

	"bulwark/pkg/secret"
)

// Provider names a configured provider (a key of config.yaml's providers):
// "claude", "openai", "bedrock", "azure", "local", or any name an operator
// gives one. Which wire format and adapter it uses is its kind, in the
// configuration; nothing outside the adapters knows a wire format.
type Provider string

// The providers of the design document's two families, by their usual
// names.
const (
	ProviderClaude Provider = "claude"
	ProviderOpenAI Provider = "openai"
)

// Valid reports whether p has the shape of a provider name: 1 to 32 of
// a-z, 0-9 and '-', starting with a letter (it appears in routes, URLs,
// metric labels and Redis keys).
func (p Provider) Valid() bool {
	if len(p) == 0 || len(p) > 32 || p[0] < 'a' || p[0] > 'z' {
		return false
	}
	for _, c := range []byte(p) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Credential is what one call is made with: a key of the pool and where it
// calls. Each adapter uses the fields its provider needs.
type Credential struct {
	// KeyID names the key (logs, metrics); it is not secret.
	KeyID string
	// APIKey is the provider's key (or bearer token). Empty for a provider
	// that signs with credentials of its own (Bedrock: the AWS chain).
	APIKey secret.String
	// Region is a Bedrock key's AWS region.
	Region string
	// Profile is a Bedrock key's shared-config profile ("": the default
	// credential chain: environment, shared config, role).
	Profile string
	// Endpoint, when set, replaces the provider's base URL for this key
	// (an Azure resource of its own).
	Endpoint string
	// Deployment, when set, replaces the tier's deployment for this key
	// (an Azure PTU deployment).
	Deployment string
}

// Route is a (provider, model tier) pair, e.g. claude/sonnet.
type Route struct {
	Provider Provider `json:"provider"`
	Tier     string   `json:"model_tier"`
}

// String returns "provider/tier".
func (r Route) String() string { return string(r.Provider) + "/" + r.Tier }

// Model is a model name a caller may ask for on the compat endpoints
// (GET /v1/models lists them): an alias, a tier's concrete model name or
// "provider/tier".
type Model struct {
	// ID is the name as the caller sends it.
	ID string
	// Route is what it stands for.
	Route Route
	// MaxOutputTokens is the most max_tokens a request for it may ask.
	MaxOutputTokens int
}

// Role of a message author.
type Role string

const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// BlockType says what a content block holds.
type BlockType string

const (
	BlockText       BlockType = "text"
	BlockToolUse    BlockType = "tool_use"
	BlockToolResult BlockType = "tool_result"
)

// Block is one piece of message content.
//
// A tool_use block (assistant) carries ToolUseID, ToolName and Input (a JSON
// object). A tool_result block (user) carries ToolUseID, the result Text and
// IsError.
type Block struct {
	Type      BlockType       `json:"type"`
	Text      string          `json:"text,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	ToolName  string          `json:"tool_name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
}

// Message is one turn of the conversation.
type Message struct {
	Role    Role    `json:"role"`
	Content []Block `json:"content"`
}

// Text returns the concatenated text blocks of m.
func (m Message) Text() string {
	var s string
	for _, b := range m.Content {
		if b.Type == BlockText {
			s += b.Text
		}
	}
	return s
}

// Tool is a function the model may call; InputSchema is a JSON Schema
// object.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// ToolChoiceMode says whether and how the model must call a tool.
type ToolChoiceMode string

const (
	ToolChoiceAuto ToolChoiceMode = "auto" // the model decides (default)
	ToolChoiceAny  ToolChoiceMode = "any"  // some tool must be called
	ToolChoiceTool ToolChoiceMode = "tool" // the named tool must be called
	ToolChoiceNone ToolChoiceMode = "none" // no tool may be called
)

// ToolChoice constrains tool use. The zero value means auto.
type ToolChoice struct {
	Mode ToolChoiceMode `json:"mode,omitempty"`
	Name string         `json:"name,omitempty"`
}

// Request is one chat completion request in provider-neutral form.
type Request struct {
	// Model is the provider's concrete model name (e.g. "claude-sonnet-4-5"),
	// filled from the tier's configuration just before the call.
	Model     string    `json:"model,omitempty"`
	System    string    `json:"system,omitempty"`
	Messages  []Message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	// MaxTokensDefault says the caller gave no max_tokens and asked for
	// its model's limit, as OpenAI's API does when none is sent. MaxTokens
	// is then Bulwark's estimate of the answer, for metering; an OpenAI
	// call is sent no max_tokens at all (the model's own limit applies,
	// and OpenAI does not count a limit nobody set against the key's
	// TPM), and a call to an API that requires one is sent its model's
	// limit (pkg/dispatch).
	MaxTokensDefault bool        `json:"max_tokens_default,omitempty"`
	Temperature      *float64    `json:"temperature,omitempty"`
	StopSequences    []string    `json:"stop_sequences,omitempty"`
	Tools            []Tool      `json:"tools,omitempty"`
	ToolChoice       *ToolChoice `json:"tool_choice,omitempty"`
}

// StopReason says why the model stopped, in Anthropic's vocabulary (OpenAI's
// finish_reason maps onto it: stop→end_turn, length→max_tokens,
// tool_calls→tool_use).
type StopReason string

const (
	StopEndTurn      StopReason = "end_turn"
	StopMaxTokens    StopReason = "max_tokens"
	StopToolUse      StopReason = "tool_use"
	StopStopSequence StopReason = "stop_sequence"
	StopRefusal      StopReason = "refusal"
)

// Usage counts tokens of one call.
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// Total returns input plus output tokens.
func (u Usage) Total() int { return u.InputTokens + u.OutputTokens }

// Response is a provider's answer in provider-neutral form.
type Response struct {
	ID         string     `json:"id,omitempty"`
	Model      string     `json:"model,omitempty"`
	Content    []Block    `json:"content"`
	StopReason StopReason `json:"stop_reason"`
	Usage      Usage      `json:"usage"`
}

// Text returns the concatenated text blocks of the answer.
func (r *Response) Text() string {
	return Message{Content: r.Content}.Text()
}

// RateLimit is what a provider said about a key's remaining capacity, read
// from its response headers. A zero field means the provider did not say.
type RateLimit struct {
	RequestsLimit     int       `json:"requests_limit,omitempty"`
	RequestsRemaining int       `json:"requests_remaining,omitempty"`
	RequestsReset     time.Time `json:"requests_reset,omitzero"`
	TokensLimit       int       `json:"tokens_limit,omitempty"`
	TokensRemaining   int       `json:"tokens_remaining,omitempty"`
	TokensReset       time.Time `json:"tokens_reset,omitzero"`
	// InputTokens... and OutputTokens... are Anthropic's separate input and
	// output tokens-per-minute limits (anthropic-ratelimit-input-tokens-*
	// and -output-tokens-*); providers with one token limit leave them zero.
	InputTokensLimit      int       `json:"input_tokens_limit,omitempty"`
	InputTokensRemaining  int       `json:"input_tokens_remaining,omitempty"`
	InputTokensReset      time.Time `json:"input_tokens_reset,omitzero"`
	OutputTokensLimit     int       `json:"output_tokens_limit,omitempty"`
	OutputTokensRemaining int       `json:"output_tokens_remaining,omitempty"`
	OutputTokensReset     time.Time `json:"output_tokens_reset,omitzero"`
	// Known reports whether any header was present at all.
	Known bool `json:"known,omitempty"`
}

// Result is a successful call.
type Result struct {
	Response  *Response
	RateLimit RateLimit
	Latency   time.Duration
}

// Client is one provider's adapter. Implementations do not retry: retrying,
// key choice and fallback are Bulwark's. They are safe for concurrent use.
type Client interface {
	// Provider returns the provider this client talks to.
	Provider() Provider
	// Complete sends req with cred. A failure is an *Error (errors.As).
	Complete(ctx context.Context, cred Credential, req *Request) (*Result, error)
}

// Delta is one piece of an answer as a provider streams it, in
// provider-neutral form. The deltas of one content block share its Index,
// its place in Response.Content; blocks start in index order with no gaps.
// A block's first delta carries its Type, and for a tool_use block its
// ToolUseID and ToolName. Concatenating a block's Text pieces gives the
// block's text, or a tool_use block's input JSON.
type Delta struct {
	Index     int       `json:"i"`
	Type      BlockType `json:"type,omitempty"`
	ToolUseID string    `json:"id,omitempty"`
	ToolName  string    `json:"name,omitempty"`
	Text      string    `json:"text,omitempty"`
}

// Streamer is a Client that can also stream an answer as the provider
// writes it. Implementations do not retry either.
type Streamer interface {
	// Stream sends req with streaming on, calls emit with each delta as it
	// arrives (in order, never concurrently), and returns the assembled
	// answer as Complete would have, usage and rate-limit headers
	// included. A failure before the first delta is the *Error Complete
	// would return; after it, the *Error of the provider's error event,
	// or a transient one when the stream broke off.
	Stream(ctx context.Context, cred Credential, req *Request, emit func(Delta)) (*Result, error)
}
