// Package openai is Bulwark's adapter for the OpenAI Chat Completions API
// (POST /v1/chat/completions) and OpenAI-compatible hosts, over plain
// net/http so that every response header is seen and nothing retries behind
// Bulwark's back.
//
// It has two halves. Client implements llm.Client and llm.Streamer: it
// translates an llm.Request to the wire, sends it with one key, and
// returns the answer (whole, or streamed as deltas and read by ReadStream)
// with the key's rate-limit headers, or a classified *llm.Error. The
// exported translation functions (DecodeRequest, EncodeRequest,
// DecodeResponse, EncodeResponse, WriteStream, EncodeError) are also what
// Bulwark's OpenAI-compatible endpoint and the cross-provider fallback use.
//
// # Translation notes
//
// The neutral model is Anthropic-shaped; the mapping is:
//
//	llm                          Chat Completions
//	System                       leading system message (system/developer in)
//	assistant text + tool_use    content + tool_calls (arguments: JSON string)
//	user tool_result blocks      one tool message each, before the user text
//	tool_result IsError          content prefixed with ToolErrorPrefix
//	Tool.InputSchema             tools[].function.parameters
//	ToolChoice auto/any/tool/none  "auto"/"required"/{function}/"none"
//	MaxTokens                    max_completion_tokens (max_tokens accepted)
//	StopSequences                stop
//	end_turn/stop_sequence       stop (stop decodes to end_turn)
//	max_tokens / tool_use        length / tool_calls
//	refusal                      content_filter (or a refusal message)
//	Usage input/output           prompt_tokens/completion_tokens
//
// Lossy spots: a stop_sequence stop reason comes back as end_turn; a user
// message's text placed before its tool results comes back after them; two
// consecutive user messages of which the first holds only tool results come
// back as one; several text blocks of an answer are joined into one.
package openai

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/secret"
)

const (
	// BaseURLDefault is the OpenAI API's base URL.
	BaseURLDefault = "https://api.openai.com"
	// TimeoutDefault bounds one call, reading the answer included.
	TimeoutDefault = 120 * time.Second
)

// completionsPath is the Chat Completions endpoint, joined to BaseURL with
// provider.Endpoint.
const completionsPath = "/v1/chat/completions"

// Config configures a Client. The zero value means all defaults.
type Config struct {
	// BaseURL is the API's base URL; it may carry a path prefix (a proxy,
	// gateway or compatible host, e.g. "https://gw.internal/openai"), and a
	// trailing "/v1" is not repeated. Default BaseURLDefault.
	BaseURL string
	// Timeout bounds one call, from sending the request to having read the
	// whole answer. Default TimeoutDefault (120 s); must not be negative.
	Timeout time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.BaseURL == "" {
		c.BaseURL = BaseURLDefault
	}
	if c.Timeout == 0 {
		c.Timeout = TimeoutDefault
	}
	return c
}

// Validate reports the first invalid field of c after defaults, naming it.
// Call it when loading configuration to fail at start-up rather than on the
// first call.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if err := provider.ValidateBaseURL("openai.BaseURL", c.BaseURL); err != nil {
		return err
	}
	if c.Timeout < 0 {
		return fmt.Errorf("openai.Timeout: must not be negative, got %s", c.Timeout)
	}
	return nil
}

// Client calls the Chat Completions API. It is safe for concurrent use and
// holds no per-call state.
type Client struct {
	cfg Config
	hc  *http.Client
	url string
	// err is the configuration error found by New, returned by every call.
	err error
}

var (
	_ llm.Client   = (*Client)(nil)
	_ llm.Streamer = (*Client)(nil)
)

// New returns a Client for cfg (zero fields mean defaults) that sends with
// hc's Transport, or http.DefaultClient's when hc is nil. Redirects are not
// followed (see provider.NoRedirects). hc's own Timeout, if any, also
// applies; the per-call deadline is cfg.Timeout. An invalid cfg is reported
// by every Complete call (use Config.Validate to catch it earlier).
func New(cfg Config, hc *http.Client) *Client {
	cfg = cfg.WithDefaults()
	c := &Client{cfg: cfg, hc: provider.NoRedirects(hc), url: provider.Endpoint(cfg.BaseURL, completionsPath)}
	if err := cfg.Validate(); err != nil {
		c.err = fmt.Errorf("openai: invalid config: %w", err)
	}
	return c
}

// Provider returns llm.ProviderOpenAI.
func (c *Client) Provider() llm.Provider { return llm.ProviderOpenAI }

// Complete sends req with apiKey (Authorization: Bearer) and returns the
// answer with the rate-limit headers. It never retries. A provider failure
// is an *llm.Error carrying class, status, code, a message free of key
// material, Retry-After (retry-after-ms first) and the rate-limit headers; a
// connection failure or Config.Timeout is transient. When ctx ends first,
// the error wraps ctx's error (errors.Is(err, context.Canceled)) and is not
// an *llm.Error.
func (c *Client) Complete(ctx context.Context, cred llm.Credential, req *llm.Request) (*llm.Result, error) {
	call, err := c.call(cred, req, EncodeRequest)
	if err != nil {
		return nil, err
	}
	return provider.Do(ctx, c.hc, call, Wire(cred.APIKey))
}

// Stream is Complete with the answer streamed (see llm.Streamer): the
// request says "stream": true and asks for the usage at the end
// (EncodeStreamRequest), and ReadStream reads the chunks, calling emit
// with each delta as it arrives. Failures are Complete's until the stream
// starts; after that, an error the stream carries is classified by the
// same table (ErrorOf), and a stream that breaks off, or outlasts
// Config.Timeout, is a transient *llm.Error. When ctx ends first, the
// error wraps ctx's error and is not an *llm.Error.
func (c *Client) Stream(ctx context.Context, cred llm.Credential, req *llm.Request, emit func(llm.Delta)) (*llm.Result, error) {
	call, err := c.call(cred, req, EncodeStreamRequest)
	if err != nil {
		return nil, err
	}
	return provider.DoStream(ctx, c.hc, call, Wire(cred.APIKey), emit)
}

// call is the POST of req with cred's key, its body made by encode.
func (c *Client) call(cred llm.Credential, req *llm.Request, encode func(*llm.Request) ([]byte, error)) (provider.Call, error) {
	apiKey := cred.APIKey
	if c.err != nil {
		return provider.Call{}, c.err
	}
	body, err := encode(req)
	if err != nil {
		return provider.Call{}, &llm.Error{Class: llm.ClassPermanent, Provider: llm.ProviderOpenAI, Message: err.Error()}
	}
	if err := provider.CheckKey(llm.ProviderOpenAI, apiKey); err != nil {
		return provider.Call{}, err
	}
	h := http.Header{}
	if !apiKey.IsZero() { // a local server (kind local) may need none
		h.Set("Authorization", "Bearer "+apiKey.Reveal())
	}
	h.Set("User-Agent", provider.UserAgent)
	return provider.Call{Provider: llm.ProviderOpenAI, URL: c.url, Header: h, Body: body, Timeout: c.cfg.Timeout}, nil
}

// Wire reads Chat Completions replies to a call signed with sent (a key or
// a token): the OpenAI error table, x-ratelimit-* headers, the answer,
// whole or streamed.
func Wire(sent secret.String) provider.Wire {
	return provider.Wire{
		Failure:    func(r *provider.Reply, now time.Time) error { return ErrorOf(r, sent, now) },
		RateLimit:  ParseRateLimit,
		Decode:     DecodeResponse,
		ReadStream: ReadStream,
		Redact:     func(msg string) string { return provider.Redact(msg, sent) },
	}
}
