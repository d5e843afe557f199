// Package anthropic is Bulwark's adapter for the Anthropic Messages API
// (POST /v1/messages), over plain net/http so that every response header is
// seen and nothing retries behind Bulwark's back.
//
// It has two halves. Client implements llm.Client and llm.Streamer: it
// translates an llm.Request to the wire, sends it with one key, and
// returns the answer (whole, or streamed as deltas and read by ReadStream)
// with the key's rate-limit headers, or a classified *llm.Error. The
// exported translation functions (DecodeRequest, EncodeRequest,
// DecodeResponse, EncodeResponse, WriteStream, EncodeError) are also what
// Bulwark's Anthropic-compatible endpoint and the cross-provider fallback
// use.
//
// # Translation notes
//
//   - The neutral model is Anthropic-shaped, so the only losses are what it
//     cannot hold: image, document and thinking blocks and server tools are
//     rejected on the way in; sampling knobs other than temperature and stop
//     sequences are ignored (RequestInfo.Ignored lists them).
//   - EncodeRequest fills max_tokens with DefaultMaxTokens when the request
//     has none and clamps temperature to [0, 1].
//   - Usage.InputTokens counts cached prompt tokens too.
package anthropic

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
	// BaseURLDefault is the Anthropic API's base URL.
	BaseURLDefault = "https://api.anthropic.com"
	// TimeoutDefault bounds one call, reading the answer included.
	TimeoutDefault = 120 * time.Second
	// VersionDefault is the anthropic-version header sent.
	VersionDefault = "2023-06-01"
)

// messagesPath is the Messages API endpoint, joined to BaseURL with
// provider.Endpoint.
const messagesPath = "/v1/messages"

// Config configures a Client. The zero value means all defaults.
type Config struct {
	// BaseURL is the API's base URL; it may carry a path prefix (a proxy or
	// gateway, e.g. "https://gw.internal/anthropic"), and a trailing "/v1"
	// is not repeated. Default BaseURLDefault.
	BaseURL string
	// Timeout bounds one call, from sending the request to having read the
	// whole answer. Default TimeoutDefault (120 s); must not be negative.
	Timeout time.Duration
	// Version is the anthropic-version header. Default VersionDefault.
	Version string
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.BaseURL == "" {
		c.BaseURL = BaseURLDefault
	}
	if c.Timeout == 0 {
		c.Timeout = TimeoutDefault
	}
	if c.Version == "" {
		c.Version = VersionDefault
	}
	return c
}

// Validate reports the first invalid field of c after defaults, naming it.
// Call it when loading configuration to fail at start-up rather than on the
// first call.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if err := provider.ValidateBaseURL("anthropic.BaseURL", c.BaseURL); err != nil {
		return err
	}
	if c.Timeout < 0 {
		return fmt.Errorf("anthropic.Timeout: must not be negative, got %s", c.Timeout)
	}
	return nil
}

// Client calls the Messages API. It is safe for concurrent use and holds no
// per-call state.
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
	c := &Client{cfg: cfg, hc: provider.NoRedirects(hc), url: provider.Endpoint(cfg.BaseURL, messagesPath)}
	if err := cfg.Validate(); err != nil {
		c.err = fmt.Errorf("anthropic: invalid config: %w", err)
	}
	return c
}

// Provider returns llm.ProviderClaude.
func (c *Client) Provider() llm.Provider { return llm.ProviderClaude }

// Complete sends req with apiKey (x-api-key) and returns the answer with
// the rate-limit headers. It never retries. A provider failure is an
// *llm.Error carrying class, status, code, a message free of key material,
// Retry-After and the rate-limit headers; a connection failure or
// Config.Timeout is transient. When ctx ends first, the error wraps ctx's
// error (errors.Is(err, context.Canceled)) and is not an *llm.Error.
func (c *Client) Complete(ctx context.Context, cred llm.Credential, req *llm.Request) (*llm.Result, error) {
	call, err := c.call(cred, req, EncodeRequest)
	if err != nil {
		return nil, err
	}
	return provider.Do(ctx, c.hc, call, wire(cred.APIKey))
}

// Stream is Complete with the answer streamed (see llm.Streamer): the
// request says "stream": true (EncodeStreamRequest), and ReadStream reads
// the events, calling emit with each delta as it arrives. Failures are
// Complete's until the stream starts; after that, an error event is
// classified by the same table (a mid-stream overloaded_error is
// overloaded), and a stream that breaks off, or outlasts Config.Timeout,
// is a transient *llm.Error. When ctx ends first, the error wraps ctx's
// error and is not an *llm.Error.
func (c *Client) Stream(ctx context.Context, cred llm.Credential, req *llm.Request, emit func(llm.Delta)) (*llm.Result, error) {
	call, err := c.call(cred, req, EncodeStreamRequest)
	if err != nil {
		return nil, err
	}
	return provider.DoStream(ctx, c.hc, call, wire(cred.APIKey), emit)
}

// call is the POST of req with cred's key, its body made by encode.
func (c *Client) call(cred llm.Credential, req *llm.Request, encode func(*llm.Request) ([]byte, error)) (provider.Call, error) {
	if c.err != nil {
		return provider.Call{}, c.err
	}
	body, err := encode(req)
	if err != nil {
		return provider.Call{}, &llm.Error{Class: llm.ClassPermanent, Provider: llm.ProviderClaude, Message: err.Error()}
	}
	if err := provider.CheckKey(llm.ProviderClaude, cred.APIKey); err != nil {
		return provider.Call{}, err
	}
	h := http.Header{}
	h.Set("x-api-key", cred.APIKey.Reveal())
	h.Set("anthropic-version", c.cfg.Version)
	h.Set("User-Agent", provider.UserAgent)
	return provider.Call{Provider: llm.ProviderClaude, URL: c.url, Header: h, Body: body, Timeout: c.cfg.Timeout}, nil
}

// wire reads Messages API replies to a call with apiKey: Anthropic's error
// table, its rate-limit headers, the answer, whole or streamed.
func wire(apiKey secret.String) provider.Wire {
	return provider.Wire{
		Failure:    func(r *provider.Reply, now time.Time) error { return errorOf(r, apiKey, now) },
		RateLimit:  func(h http.Header, _ time.Time) llm.RateLimit { return ParseRateLimit(h) },
		Decode:     DecodeResponse,
		ReadStream: ReadStream,
		Redact:     func(msg string) string { return provider.Redact(msg, apiKey) },
	}
}
