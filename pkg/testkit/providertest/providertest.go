// Package providertest is the conformance suite of Bulwark's provider
// adapters, as testing/fstest is for file systems: Run holds one adapter
// (pkg/provider/anthropic, pkg/provider/openai and any later one) to every
// case the adapters share, so that an adapter's own tests keep only what is
// truly its own: its error-code table, its wire quirks, its examples. It is
// imported by tests only.
//
// An adapter describes itself in a Harness: its constructor, its endpoint
// and key headers, its translation functions, its golden files, its error
// fixtures and what each means, and how to drive its official SDK. Run then
// checks, each in a subtest:
//
//   - Wire: every neutral request and response of package wiretest encodes
//     to its golden file and decodes back unchanged; the stream of a tool
//     answer matches its golden file; malformed request bodies are refused
//     with an error naming the problem.
//   - Client: the request the client sends (endpoint under any base URL
//     form, key headers, body) and the answer it reads back (content, usage,
//     rate-limit headers, latency).
//   - Errors: the provider's error fixtures classify as the harness says;
//     bodyless, HTML and odd-retry-after answers classify by status alike for
//     every provider; the adapter's own EncodeError bodies carry the type of
//     their status and read back as what they say; no error ever carries
//     the key.
//   - Transport: the client's own timeout, the caller's cancellation, a
//     refused connection, a redirect, an unreadable 200, a key no header can
//     carry and an invalid configuration.
//   - SDK: the provider's official SDK parses what the compat endpoint
//     writes (answers, streams, errors), and what the SDK sends decodes into
//     the conversation it meant.
//   - Mock: the client against pkg/testkit/mockprovider over real HTTP: a text
//     answer with the mock's rate-limit headers, a tool-call round trip,
//     every fault mode, and a 429 of the mock's own buckets.
//   - Stream: the client's Stream (llm.Streamer) reads what Wire.WriteStream
//     writes into the answer Complete reads from EncodeResponse, its deltas
//     arriving before the stream ends and adding up to that answer; an
//     error answer fails Stream exactly as it fails Complete; a mid-stream
//     error event is classified by the provider's table; a stream cut off,
//     ended early, not a stream, timed out or cancelled by the caller
//     fails as the Transport cases say; no error carries the key.
//
// An adapter that lacks an ability leaves its Harness field nil or zero,
// and the cases that need it skip, naming what is missing: no
// Wire.EncodeError (no compat endpoint) skips the own-error read-back, no
// Wire.WriteStream the stream golden file, a Harness.Credential that is
// not a key string the cases of a key no header can carry and of a missing
// key. Wire.NoModelInBody compares requests without the model, and
// Harness.CheckRequest lets the fake provider verify what KeyHeaders
// cannot state (a signature). Adapters that fill every field run every
// case.
package providertest

import (
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/wiretest"
)

// Harness is what Run needs to know of one adapter. Every field is
// required unless it says otherwise.
type Harness struct {
	// Provider is what the client's Provider method returns and every
	// *llm.Error of it names.
	Provider llm.Provider
	// ConfigName prefixes the adapter's configuration fields in its
	// validation errors: "anthropic" for "anthropic.BaseURL".
	ConfigName string
	// Constructor makes the adapter's clients (see ConstructorOf).
	Constructor
	// Path is the endpoint the client posts to below its base URL, e.g.
	// "/v1/messages".
	Path string
	// VersionlessPath says the API's paths carry no version: a base URL's
	// trailing /v1 is a gateway's prefix like any other and is kept
	// (Bedrock's /model/{id}/invoke); otherwise it is not repeated.
	VersionlessPath bool
	// KeyHeaders are the headers a request sent with key must carry
	// besides Content-Type: the key header, a version header. Nil for an
	// adapter that sends no key header (Bedrock signs instead), which
	// must set CheckRequest.
	KeyHeaders func(key string) http.Header
	// CheckRequest, when set, is a further check of every request the
	// suite's fake provider receives, e.g. that it is signed as the real
	// API would verify it; an error fails the case and answers 418.
	CheckRequest func(r *http.Request, body []byte) error
	// Credential, when set, is the credential of a call the suite makes
	// with key; nil sends key as the API key (llm.Credential.APIKey). An
	// adapter whose credential is not a key string (Bedrock: a region, and
	// credentials of its own) sets it, and skips the cases about a key
	// that header or mock must refuse.
	Credential func(key string) llm.Credential
	// Secrets are the secrets behind the calls' credentials besides the
	// key (an access key id, a session token), which no error of the
	// mock's may carry either; nil for a key-only adapter.
	Secrets []string
	// Model is the model the SDK cases ask for; the stream golden file is
	// written for it.
	Model string
	// Wire is the adapter's translation.
	Wire Wire
	// KeepsAdmissionCharge says the provider keeps the prompt + max_tokens
	// it charged a call at admission, as OpenAI and Azure OpenAI document
	// (no refund of the unused max_tokens); the mock then reports the
	// remaining tokens less max_tokens, not less the output. False for
	// providers that settle to the real usage (Anthropic, Bedrock).
	KeepsAdmissionCharge bool
	// RateLimit is what the client reads from the headers of a 200. A
	// provider that sends no rate-limit headers wants a zero (unknown)
	// RateLimit, Header then holding headers that must not be read.
	RateLimit RateLimitCase
	// ErrorRateLimit is what it reads from the headers of an error answer,
	// some of them negative or malformed; ErrorCase.Limits sends them.
	ErrorRateLimit RateLimitCase
	// Errors are the provider's own error answers and what the client
	// makes of each. Run adds the cases every provider shares.
	Errors []ErrorCase
	// ErrorTypes is the error type the adapter's EncodeError writes for
	// each status; its client reads it back as the Code. Empty without
	// an EncodeError.
	ErrorTypes map[int]string
	// Leak is an answer of the provider that echoes the key.
	Leak LeakCase
	// BadRequests are request bodies the adapter's DecodeRequest refuses.
	// Run adds the ones every provider refuses alike.
	BadRequests []BadRequest
	// Mock is the provider's name in pkg/testkit/mockprovider (Fault.Provider:
	// "claude", "openai"); empty when the mock does not speak its wire,
	// which skips the Mock cases.
	Mock string
	// MockErrors are, by the name of the Mock case ("rate_limit",
	// "buckets", …; see testMock), what the client makes of the mock's
	// error answers where the provider renders them its own way; a case
	// not named wants what every other provider's client makes of it.
	MockErrors map[string]MockError
	// SDK drives the provider's official SDK; nil skips the SDK cases.
	SDK *SDK
	// Stream describes the streaming of an adapter whose client implements
	// llm.Streamer; nil skips the Stream cases. It needs Wire.WriteStream,
	// which the suite's provider streams its answers with.
	Stream *StreamCase
}

// Config is the part of an adapter's configuration the suite sets.
type Config struct {
	BaseURL string
	Timeout time.Duration
}

// Constructor is how the suite makes an adapter's clients.
type Constructor struct {
	// New returns the adapter's client for cfg, sending with hc
	// (http.DefaultClient when nil).
	New func(cfg Config, hc *http.Client) llm.Client
	// Validate is the adapter's Config.Validate of cfg.
	Validate func(cfg Config) error
}

// ConstructorOf is the Constructor of an adapter that follows the
// convention of pkg/provider: a Config type C with a Validate method, which
// config builds from the suite's Config, and New(C, *http.Client).
func ConstructorOf[C interface{ Validate() error }, L llm.Client](config func(Config) C, newClient func(C, *http.Client) L) Constructor {
	return Constructor{
		New:      func(cfg Config, hc *http.Client) llm.Client { return newClient(config(cfg), hc) },
		Validate: func(cfg Config) error { return config(cfg).Validate() },
	}
}

// Wire is an adapter's translation between the neutral model and its wire
// format, as its compat endpoint and the fallback use it. Output must be
// deterministic (fixed timestamps), for the golden files.
type Wire struct {
	EncodeRequest func(*llm.Request) ([]byte, error)
	DecodeRequest func([]byte) (Info, *llm.Request, error)
	// EncodeResponse renders resp as the answer to a request for model
	// ("" keeps resp.Model).
	EncodeResponse func(resp *llm.Response, model string) ([]byte, error)
	DecodeResponse func([]byte) (*llm.Response, error)
	// WriteStream writes resp as the event stream answering the request
	// info describes; nil for a provider that does not stream, which
	// skips the stream golden file (and allows no SDK).
	WriteStream func(w io.Writer, resp *llm.Response, info Info) error
	// EncodeError renders an error answer of Bulwark's own; nil for an
	// adapter without a compat endpoint, which skips the cases that read
	// its errors back (and allows no SDK).
	EncodeError func(status int, code, message string) []byte
	// NoModelInBody says the request body does not carry the model (it is
	// in the endpoint's path, as Bedrock's): DecodeRequest returns none,
	// and the requests are compared without it. The client cases still
	// post to Path, which names the model "test-model" of every request
	// they send.
	NoModelInBody bool
}

// Info is the part of a decoded request's RequestInfo the suite reads.
type Info struct {
	Model        string
	Stream       bool
	IncludeUsage bool
	Ignored      []string
}

// DecodeWith is Wire.DecodeRequest for an adapter whose DecodeRequest
// returns its own RequestInfo (I), which info reads.
func DecodeWith[I any](decode func([]byte) (I, *llm.Request, error), info func(I) Info) func([]byte) (Info, *llm.Request, error) {
	return func(body []byte) (Info, *llm.Request, error) {
		i, req, err := decode(body)
		if err != nil {
			return Info{}, nil, err
		}
		return info(i), req, nil
	}
}

// RateLimitCase is a set of rate-limit response headers and what the client
// reads from them.
type RateLimitCase struct {
	Header map[string]string
	Want   llm.RateLimit
	// RequestsResetIn and TokensResetIn, when set, are resets the headers
	// give relative to the answer ("6m0s"): the reset read must lie that
	// long after the call, and Want leaves it zero.
	RequestsResetIn, TokensResetIn time.Duration
}

// ErrorCase is one error answer and the *llm.Error the client must make of
// it.
type ErrorCase struct {
	Name   string
	Status int
	// File is the body: a fixture under testdata/errors. Empty sends none.
	File   string
	Header map[string]string
	Class  llm.Class
	Code   string
	// Message is a part of the error's message ("" checks nothing).
	Message    string
	RetryAfter time.Duration
	// Limits adds the headers of Harness.ErrorRateLimit and expects what it
	// wants; otherwise the rate limit must be unknown.
	Limits bool

	body []byte // the body of a shared case, which has no fixture
}

// MockError is what the client must make of one of the mock's error
// answers.
type MockError struct {
	Class      llm.Class
	Status     int // 0: any
	Code       string
	RetryAfter time.Duration
	// Message is a part of the error's message ("" checks nothing).
	Message string
}

// LeakCase is a 401 that echoes the key.
type LeakCase struct {
	// File is the fixture under testdata/errors; KEY_PLACEHOLDER in it
	// stands for the key sent.
	File string
	// Key is a key in the provider's own format.
	Key string
	// Secrets are the other secret-shaped parts of the fixture.
	Secrets []string
	// Message is a part of the message that must survive redaction.
	Message string
}

// BadRequest is a request body DecodeRequest refuses, and a part of the
// error it must return.
type BadRequest struct {
	Name, Body, Want string
}

// Run runs the conformance suite against the adapter h describes.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Provider == "" || h.ConfigName == "" || h.New == nil || h.Validate == nil || h.Path == "" ||
		(h.KeyHeaders == nil && h.CheckRequest == nil) || h.Model == "" || h.Wire.EncodeRequest == nil ||
		h.Wire.DecodeRequest == nil || h.Wire.EncodeResponse == nil || h.Wire.DecodeResponse == nil ||
		(h.Wire.EncodeError == nil) != (len(h.ErrorTypes) == 0) || h.Leak.File == "" ||
		(h.SDK != nil && (h.Wire.WriteStream == nil || h.Wire.EncodeError == nil)) ||
		(h.Stream != nil && h.Wire.WriteStream == nil) {
		t.Fatalf("providertest: incomplete Harness: %+v", h)
	}
	t.Run("Wire", func(t *testing.T) { t.Parallel(); h.testWire(t) })
	t.Run("Client", func(t *testing.T) { t.Parallel(); h.testClient(t) })
	t.Run("Errors", func(t *testing.T) { t.Parallel(); h.testErrors(t) })
	t.Run("Transport", func(t *testing.T) { t.Parallel(); h.testTransport(t) })
	if h.SDK != nil {
		t.Run("SDK", func(t *testing.T) { t.Parallel(); h.testSDK(t) })
	}
	if h.Mock != "" {
		t.Run("Mock", func(t *testing.T) { t.Parallel(); h.testMock(t) })
	}
	if h.Stream != nil {
		t.Run("Stream", func(t *testing.T) { t.Parallel(); h.testStream(t) })
	}
}

// DecodeCase is a request body in one provider's shape and what its
// DecodeRequest makes of it, RequestInfo (I) included.
type DecodeCase[I any] struct {
	Name     string
	Body     string
	Want     *llm.Request
	WantInfo I
}

// DecodeRequests checks decode against each case: the shapes only one
// provider's wire has, which the suite cannot state for all.
func DecodeRequests[I any](t *testing.T, decode func([]byte) (I, *llm.Request, error), cases []DecodeCase[I]) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.Name, func(t *testing.T) {
			t.Parallel()
			info, got, err := decode([]byte(tt.Body))
			if err != nil {
				t.Fatal(err)
			}
			if d := wiretest.Diff(tt.Want, got); d != "" {
				t.Errorf("request (-want +got):\n%s", d)
			}
			if d := wiretest.Diff(tt.WantInfo, info); d != "" {
				t.Errorf("info (-want +got):\n%s", d)
			}
		})
	}
}

// fixture reads testdata/errors/name of the package under test.
func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "errors", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// merge returns the union of a and b, b winning.
func merge(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, b)
	return out
}
