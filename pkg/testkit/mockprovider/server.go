package mockprovider

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults and limits of Config.
const (
	// EmbeddingDimsDefault is the length of embedding vectors when neither
	// Config.EmbeddingDims nor the request's "dimensions" says otherwise.
	EmbeddingDimsDefault = 256
	// EmbeddingDimsMax bounds Config.EmbeddingDims and "dimensions".
	EmbeddingDimsMax = 4096
	// OpenAIMaxTokensDefault is the output reserved at admission for an
	// OpenAI request that sets neither max_tokens nor
	// max_completion_tokens (the answer itself is not cut then).
	OpenAIMaxTokensDefault = 1024
	// MaxBodyBytes bounds a request body; larger ones get 413.
	MaxBodyBytes = 32 << 20
	// WindowDefault is the enforcement window when Config.Window is 0: a
	// key's buckets hold one second of its per-minute limits, the
	// quantization both providers describe (60 RPM enforced as 1 request
	// per second).
	WindowDefault = time.Second
	// WindowMax bounds Config.Window: a whole minute is the unquantized
	// per-minute bucket.
	WindowMax = time.Minute
	// StreamChunkIntervalDefault is the gap between the content chunks of
	// a streamed answer when Config.StreamChunkInterval is 0.
	StreamChunkIntervalDefault = 20 * time.Millisecond
	// StreamChunkTokensDefault is the size of a streamed content chunk, in
	// tokens of CountTokens (4 bytes each), when Config.StreamChunkTokens
	// is 0.
	StreamChunkTokensDefault = 1
	// StreamChunkTokensMax bounds Config.StreamChunkTokens.
	StreamChunkTokensMax = 1 << 20
)

// Limits are the rate limits of one API key on one endpoint. A zero field
// means unlimited. They are enforced over Config.Window, not over a whole
// minute (see the package doc, "Rate limits").
type Limits struct {
	// RPM is requests per minute. The request bucket holds RPM ×
	// Window/1m requests (at least 1) and refills RPM/60 per second,
	// continuously; the headers report RPM as the limit.
	RPM int `json:"rpm"`
	// TPM is tokens per minute, input and output together. The token
	// bucket holds TPM × Window/1m tokens and refills TPM/60 per second. A
	// request costs input_tokens + max_tokens at admission; after the
	// answer an Anthropic or Bedrock call gets the unused part of
	// max_tokens back, an OpenAI or Azure call does not (unless
	// Config.RefundOpenAI). A request above TPM itself never passes.
	TPM int `json:"tpm"`
	// ITPM and OTPM are Anthropic's separate input and output tokens per
	// minute, metered like TPM: input_tokens charge the input bucket,
	// max_tokens the output bucket at admission, and the output bucket
	// gets the unused part of max_tokens back after the answer. 0: no such
	// limit. They apply on the Messages endpoint only (the other APIs
	// have no such split), whose headers report them as input-tokens-*
	// and output-tokens-*.
	ITPM int `json:"itpm"`
	OTPM int `json:"otpm"`
	// MaxConcurrent is a local model server's parallel slots (Ollama's
	// OLLAMA_NUM_PARALLEL plus its queue, llama.cpp's --parallel): a
	// request beyond it is refused at once with 503 and Ollama's "server
	// busy, please try again. maximum pending requests exceeded" (the
	// harsher real case: vLLM queues instead). 0: no limit.
	MaxConcurrent int `json:"max_concurrent"`
}

// Config configures a Server. The zero value is a mock without latency or
// limits.
type Config struct {
	// Latency is added before each successful answer (not before errors).
	// A streamed answer waits it before its first content chunk unless
	// StreamFirstToken says otherwise. Default 0.
	Latency time.Duration
	// LatencyJitter spreads Latency uniformly over
	// [Latency-LatencyJitter, Latency+LatencyJitter], never below 0.
	// Default 0.
	LatencyJitter time.Duration
	// DefaultLimits apply to every key not in Keys. Default unlimited.
	DefaultLimits Limits
	// Keys holds limits per API key value. The values are only hashed to
	// fingerprints at New and never kept.
	Keys map[string]Limits
	// EmbeddingDims is the default embedding length. Default
	// EmbeddingDimsDefault (256), at most EmbeddingDimsMax.
	EmbeddingDims int
	// Window is the enforcement window of every limited key: its buckets
	// hold Window's share of the per-minute limits (RPM × Window/1m, at
	// least one request), so a 120-RPM key takes 2 calls at once with the
	// default, not 120. Default WindowDefault (1 s); at most WindowMax.
	// time.Minute gives whole-minute buckets (burst = RPM), the mock's
	// behaviour before quantization was modelled.
	Window time.Duration
	// Now is the clock of the buckets and of the reset headers. Default
	// time.Now; tests pass a fake clock so bucket tests need no sleeping.
	Now func() time.Time
	// Logger receives fault, latency and reset changes at Info. Default:
	// discard. Keys appear only as fingerprints.
	Logger *slog.Logger
	// AzurePTUDeployments are the Azure deployments served as provisioned
	// throughput (PTU): their 429 and headers are a PTU's (see azure.go).
	AzurePTUDeployments []string
	// RefundOpenAI credits the unused part of max_tokens back after an
	// OpenAI or Azure answer, as Anthropic does. Default false: OpenAI
	// counts max_tokens at admission and documents no refund (see the
	// package doc, "Rate limits"), and the mock is the harsher provider.
	RefundOpenAI bool
	// StreamFirstToken is a streamed answer's time to first token: from
	// admission by the buckets to the first content chunk. The headers
	// and message_start (Anthropic) or the role chunk (OpenAI) go out at
	// admission, before it. 0 (the default): the latency in force
	// (Latency ± LatencyJitter, as SetLatency changes it); negative: no
	// wait. Measured on the wall clock, not Now.
	StreamFirstToken time.Duration
	// StreamChunkInterval is the gap between two content chunks of a
	// streamed answer. 0: StreamChunkIntervalDefault (20 ms); negative:
	// none, the chunks go out back to back.
	StreamChunkInterval time.Duration
	// StreamChunkTokens is how many tokens a content chunk carries, at
	// CountTokens' rate of 4 bytes a token, cut at a UTF-8 rune boundary.
	// 0: StreamChunkTokensDefault (1); at most StreamChunkTokensMax.
	StreamChunkTokens int
}

func (c *Config) withDefaults() {
	if c.EmbeddingDims == 0 {
		c.EmbeddingDims = EmbeddingDimsDefault
	}
	if c.Window == 0 {
		c.Window = WindowDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.StreamChunkInterval = streamChunkInterval(c.StreamChunkInterval)
	c.StreamChunkTokens = streamChunkTokens(c.StreamChunkTokens)
}

// streamChunkInterval applies the default and the meaning of a negative
// value to a StreamChunkInterval setting.
func streamChunkInterval(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return StreamChunkIntervalDefault
	case d < 0:
		return 0
	}
	return d
}

// streamChunkTokens applies the default to a StreamChunkTokens setting.
func streamChunkTokens(n int) int {
	if n == 0 {
		return StreamChunkTokensDefault
	}
	return n
}

func (c *Config) validate() error {
	if c.Latency < 0 {
		return fmt.Errorf("mockprovider: Config.Latency %s: want >= 0", c.Latency)
	}
	if c.LatencyJitter < 0 {
		return fmt.Errorf("mockprovider: Config.LatencyJitter %s: want >= 0", c.LatencyJitter)
	}
	if err := c.DefaultLimits.validate("Config.DefaultLimits"); err != nil {
		return err
	}
	for key, l := range c.Keys {
		if key == "" {
			return errors.New("mockprovider: Config.Keys: empty key")
		}
		if err := l.validate("Config.Keys[" + Fingerprint(key) + "]"); err != nil {
			return err
		}
	}
	if c.EmbeddingDims < 1 || c.EmbeddingDims > EmbeddingDimsMax {
		return fmt.Errorf("mockprovider: Config.EmbeddingDims %d: want 1..%d", c.EmbeddingDims, EmbeddingDimsMax)
	}
	if c.Window <= 0 || c.Window > WindowMax {
		return fmt.Errorf("mockprovider: Config.Window %s: want > 0 and <= %s (0 = default %s)", c.Window, WindowMax, WindowDefault)
	}
	if c.StreamChunkTokens < 1 || c.StreamChunkTokens > StreamChunkTokensMax {
		return fmt.Errorf("mockprovider: Config.StreamChunkTokens %d: want 1..%d (0 = default %d)",
			c.StreamChunkTokens, StreamChunkTokensMax, StreamChunkTokensDefault)
	}
	return nil
}

func (l Limits) validate(field string) error {
	if l.RPM < 0 {
		return fmt.Errorf("mockprovider: %s.RPM %d: want >= 0 (0 = unlimited)", field, l.RPM)
	}
	if l.TPM < 0 {
		return fmt.Errorf("mockprovider: %s.TPM %d: want >= 0 (0 = unlimited)", field, l.TPM)
	}
	if l.ITPM < 0 || l.OTPM < 0 {
		return fmt.Errorf("mockprovider: %s.ITPM %d, OTPM %d: want >= 0 (0 = unlimited)", field, l.ITPM, l.OTPM)
	}
	return nil
}

// provider is the wire format family; it names stats and fault targets.
type provider string

const (
	providerClaude provider = "claude"
	providerOpenAI provider = "openai"
)

// limiterKey names the buckets of one key on one endpoint: each of
// /v1/messages, /v1/chat/completions and /v1/embeddings limits separately,
// as real providers limit per model.
type limiterKey struct {
	endpoint string
	fp       string
}

// Server is the mock provider: an http.Handler serving both wire formats
// and the /mock admin endpoints. It is safe for concurrent use.
type Server struct {
	now     func() time.Time
	log     *slog.Logger
	dims    int
	window  time.Duration // Config.Window; read-only after New
	latency atomic.Int64  // time.Duration
	jitter  atomic.Int64  // time.Duration
	mux     *http.ServeMux

	// The pace of streamed answers, as Config.StreamFirstToken (0 follows
	// the latency, negative is none), StreamChunkInterval (resolved: 0 is
	// none) and StreamChunkTokens (resolved).
	firstToken    atomic.Int64 // time.Duration
	chunkInterval atomic.Int64 // time.Duration
	chunkTokens   atomic.Int64

	defaultLimits Limits
	keyLimits     map[string]Limits // by fingerprint; read-only after New

	azurePTU map[string]bool // Config.AzurePTUDeployments; read-only after New
	// refundOpenAI is Config.RefundOpenAI; read-only after New.
	refundOpenAI bool

	closeOnce sync.Once
	closed    chan struct{} // closed by Close: releases hanging requests

	mu       sync.Mutex
	limiters map[limiterKey]*limiter // guarded by mu
	book     *book                   // guarded by mu
	flights  *flights                // guarded by mu
	faults   []*Fault                // guarded by mu; in order of SetFault
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{
		now:           cfg.Now,
		log:           cfg.Logger,
		dims:          cfg.EmbeddingDims,
		window:        cfg.Window,
		mux:           http.NewServeMux(),
		defaultLimits: cfg.DefaultLimits,
		keyLimits:     make(map[string]Limits, len(cfg.Keys)),
		closed:        make(chan struct{}),
		limiters:      map[limiterKey]*limiter{},
		book:          newBook(),
		flights:       newFlights(),
		azurePTU:      azurePTUSet(cfg.AzurePTUDeployments),
		refundOpenAI:  cfg.RefundOpenAI,
	}
	for key, l := range cfg.Keys {
		s.keyLimits[Fingerprint(key)] = l
	}
	s.latency.Store(int64(cfg.Latency))
	s.jitter.Store(int64(cfg.LatencyJitter))
	s.firstToken.Store(int64(cfg.StreamFirstToken))
	s.chunkInterval.Store(int64(cfg.StreamChunkInterval))
	s.chunkTokens.Store(int64(cfg.StreamChunkTokens))

	s.mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, anthropicWire{}) })
	s.mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, chatWire{}) })
	s.mux.HandleFunc("POST /v1/embeddings", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, embeddingsWire{dims: s.dims}) })
	s.mux.HandleFunc("POST /model/{modelId}/invoke", func(w http.ResponseWriter, r *http.Request) {
		s.serve(w, r, &bedrockWire{model: r.PathValue("modelId")}) // Bedrock InvokeModel (bedrock.go)
	})
	s.mux.HandleFunc("POST /model/{modelId}/invoke-with-response-stream", s.serveBedrockStream)  // (bedrock_stream.go)
	s.mux.HandleFunc("POST /openai/deployments/{deployment}/chat/completions", s.serveAzureChat) // Azure OpenAI (azure.go)
	s.mux.HandleFunc("GET /mock/stats", s.handleStats)
	s.mux.HandleFunc("POST /mock/reset", s.handleReset)
	s.mux.HandleFunc("GET /mock/faults", s.handleListFaults)
	s.mux.HandleFunc("POST /mock/faults", s.handleSetFault)
	s.mux.HandleFunc("DELETE /mock/faults", s.handleClearFaults)
	s.mux.HandleFunc("POST /mock/latency", s.handleSetLatency)
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close releases requests hanging on a timeout fault by dropping their
// connections, so that an http.Server's Shutdown can finish. Safe to call
// more than once; the Server keeps answering other requests.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closed) })
}

// SetLatency sets the latency added before each successful answer.
// Negative values count as 0. Safe for concurrent use.
func (s *Server) SetLatency(d time.Duration) {
	d = max(d, 0)
	s.latency.Store(int64(d))
	s.log.Info("mock provider: latency set", "latency", d)
}

// SetLatencyJitter sets the spread of the latency (see
// Config.LatencyJitter). Negative values count as 0.
func (s *Server) SetLatencyJitter(d time.Duration) {
	d = max(d, 0)
	s.jitter.Store(int64(d))
	s.log.Info("mock provider: latency jitter set", "jitter", d)
}

// delay returns this answer's latency.
func (s *Server) delay() time.Duration {
	d, j := time.Duration(s.latency.Load()), time.Duration(s.jitter.Load())
	if j > 0 {
		d += time.Duration(mrand.Int64N(int64(2*j)+1)) - j
	}
	return max(d, 0)
}

// limiter returns the buckets of k, creating them full. The caller holds
// s.mu.
func (s *Server) limiter(k limiterKey, now time.Time) *limiter {
	l := s.limiters[k]
	if l == nil {
		lim, ok := s.keyLimits[k.fp]
		if !ok {
			lim = s.defaultLimits
		}
		if k.endpoint != (anthropicWire{}).endpoint() {
			// Only Anthropic's Messages API meters input and output apart.
			lim.ITPM, lim.OTPM = 0, 0
		}
		l = newLimiter(lim, s.window, now)
		s.limiters[k] = l
	}
	return l
}

// errKind is the provider-neutral kind of an error answer; each wire maps
// it onto its own status and body.
type errKind int

const (
	errInvalid    errKind = iota // 400 (or status): malformed request
	errAuth                      // 401: no key
	errRateLimit                 // 429 from the buckets or a fault
	errTooLarge                  // 429: the token cost exceeds TPM itself
	errOverloaded                // Anthropic 529, OpenAI 503
	errServer                    // 500
	errQuota                     // OpenAI insufficient_quota, Anthropic spend limit
)

// apiError is an error answer before a wire renders it.
type apiError struct {
	kind       errKind
	status     int    // errInvalid only; 0 means 400
	message    string // errInvalid only; others use the wire's wording
	param      string // errInvalid only: OpenAI's error.param, "" for null
	custom     string // a fault's Message: replaces the wording, "" keeps it
	retryAfter time.Duration
	// For rate-limit messages: which bucket refused ("requests" or
	// "tokens"), its limit, what it had used, and what the request asked.
	limitedBy string
	limit     int
	used      int
	requested int
	model     string
}

func invalid(format string, a ...any) *apiError {
	return &apiError{kind: errInvalid, message: fmt.Sprintf(format, a...)}
}

// call is a parsed, valid request.
type call struct {
	model       string
	inputTokens int
	// reserve is the output charged at admission (max_tokens); 0 for
	// embeddings.
	reserve int
	// settle: after the answer the unused part of reserve goes back
	// (Anthropic, Bedrock), else the admission charge stands (OpenAI,
	// Azure, unless Config.RefundOpenAI).
	settle bool
	// embeddingInputs is the number of vectors asked for (embeddings only).
	embeddingInputs int
	// build computes the answer body and its output tokens.
	build func(now time.Time) (body any, outputTokens int)
	// stream renders the same answer as build, as a stream of content
	// chunks of at most chunkBytes bytes each; nil unless the request asked
	// for a stream (stream.go).
	stream func(now time.Time, chunkBytes int) *script
}

// wire is one endpoint's wire format.
type wire interface {
	provider() provider
	endpoint() string
	requestIDHeader() string
	// apiKey returns the request's key, "" when missing.
	apiKey(r *http.Request) string
	// preflight checks headers before any fault or body, nil when fine.
	preflight(r *http.Request) *apiError
	parse(body []byte) (*call, *apiError)
	setRateHeaders(h http.Header, s snapshot)
	writeError(w http.ResponseWriter, e *apiError, requestID string)
}

// serve is the request path common to every endpoint: authenticate,
// preflight, injected fault, parse, admission against the buckets, latency,
// answer, credit-back; or, for a streamed request, after admission the
// stream (stream.go), which paces itself and settles when it ends. Every answer after authentication carries the key's
// rate-limit headers.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, wr wire) {
	p := wr.provider()
	reqID := "req_" + randomHex(12)
	w.Header().Set(wr.requestIDHeader(), reqID)

	key := wr.apiKey(r)
	if key == "" {
		s.mu.Lock()
		s.book.record(p, "", func(c *Counters) { c.Unauthorized++ })
		s.mu.Unlock()
		wr.writeError(w, &apiError{kind: errAuth}, reqID)
		return
	}
	fp := Fingerprint(key)
	lk := limiterKey{endpoint: wr.endpoint(), fp: fp}

	fail := func(e *apiError, count func(*Counters)) {
		s.mu.Lock()
		s.book.record(p, fp, count)
		now := s.now()
		snap := s.limiter(lk, now).snapshot(now)
		s.mu.Unlock()
		wr.setRateHeaders(w.Header(), snap)
		wr.writeError(w, e, reqID)
	}
	countInvalid := func(c *Counters) { c.Requests++; c.Invalid++ }

	if e := wr.preflight(r); e != nil {
		fail(e, countInvalid)
		return
	}

	s.mu.Lock()
	f, faulted := s.takeFault(p, fp, false)
	s.mu.Unlock()
	if faulted {
		count := func(c *Counters) {
			c.Requests++
			if c.Injected == nil {
				c.Injected = map[FaultMode]int64{}
			}
			c.Injected[f.Mode]++
		}
		if f.Mode == FaultTimeout {
			s.mu.Lock()
			s.book.record(p, fp, count)
			s.mu.Unlock()
			s.hang(r)
			return
		}
		fail(faultError(f), count)
		return
	}

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			fail(&apiError{kind: errInvalid, status: http.StatusRequestEntityTooLarge,
				message: fmt.Sprintf("request body exceeds %d bytes", MaxBodyBytes)}, countInvalid)
			return
		}
		fail(invalid("reading request body: %v", err), countInvalid)
		return
	}
	cl, e := wr.parse(body)
	if e != nil {
		fail(e, countInvalid)
		return
	}

	lim, ok := s.admit(w, wr, reqID, lk, cl)
	if !ok {
		return
	}
	admitted := time.Now() // the stream's pace runs on the wall clock
	// In flight from admission until the answer is written: the deferred
	// landing runs before net/http sends the buffered body, so a client
	// that holds the answer sees its call counted out. A stream lands
	// after its last byte is flushed.
	defer s.land(p, fp)

	if cl.stream != nil {
		s.streamAnswer(w, r, wr, lk, lim, cl, admitted)
		return
	}

	if !s.sleep(r, s.delay()) {
		// The client gave up before the answer: nothing was generated, so
		// a provider that settles to usage gives the whole output
		// reservation back.
		s.mu.Lock()
		if s.settles(cl) {
			lim.credit(s.now(), cl.reserve)
		}
		s.book.record(p, fp, func(c *Counters) { c.Requests++ })
		s.mu.Unlock()
		return
	}
	s.answer(w, wr, lk, lim, cl)
}

// admit charges cl to its key's buckets and counts it in flight; when the
// buckets refuse it answers 429, charges nothing and reports false.
func (s *Server) admit(w http.ResponseWriter, wr wire, reqID string, lk limiterKey, cl *call) (*limiter, bool) {
	p, cost := wr.provider(), cl.inputTokens+cl.reserve
	s.mu.Lock()
	if s.busy(lk.fp) {
		s.book.record(p, lk.fp, func(c *Counters) { c.Requests++; c.Busy++ })
		s.mu.Unlock()
		wr.writeError(w, &apiError{kind: errOverloaded, custom: ollamaBusy}, reqID)
		return nil, false
	}
	now := s.now()
	lim := s.limiter(lk, now)
	v := lim.admit(now, cl.inputTokens, cl.reserve)
	if v.ok {
		s.flights.enter(p, lk.fp)
		s.mu.Unlock()
		return lim, true
	}
	s.book.record(p, lk.fp, func(c *Counters) { c.Requests++; c.RateLimited++ })
	snap := lim.snapshot(now)
	s.mu.Unlock()
	wr.setRateHeaders(w.Header(), snap)
	wr.writeError(w, refusal(v, snap, cost, cl.reserve, cl.model), reqID)
	return nil, false
}

// ollamaBusy is Ollama's answer when its queue is full.
const ollamaBusy = "server busy, please try again.  maximum pending requests exceeded"

// busy reports whether the key fp has its MaxConcurrent calls in flight.
// s.mu is held.
func (s *Server) busy(fp string) bool {
	l, ok := s.keyLimits[fp]
	if !ok {
		l = s.defaultLimits
	}
	g := s.flights.keys[fp]
	return l.MaxConcurrent > 0 && g != nil && g.now >= int64(l.MaxConcurrent)
}

// refusal is the 429 for a verdict. Its limit and usage figures come from
// the per-minute view, as the providers' messages quote them ("Limit 120,
// Used 2, Requested 1") even when the short window refused.
func refusal(v verdict, snap snapshot, cost, reserve int, model string) *apiError {
	e := &apiError{kind: errRateLimit, retryAfter: v.retryAfter, limitedBy: v.limitedBy, requested: 1, model: model}
	st := snap.requests
	switch v.limitedBy {
	case limitByTokens:
		st, e.requested = snap.tokens, cost
	case limitByInput:
		st, e.requested = snap.input, cost-reserve
	case limitByOutput:
		st, e.requested = snap.output, reserve
	}
	e.limit, e.used = st.limit, st.limit-st.remaining
	if v.tooLarge {
		e.kind = errTooLarge
	}
	return e
}

// answer writes the 200 for an admitted call and, where the provider
// settles to usage, credits back the unused output reservation.
func (s *Server) answer(w http.ResponseWriter, wr wire, lk limiterKey, lim *limiter, cl *call) {
	s.mu.Lock()
	now := s.now()
	resp, out := cl.build(now)
	if s.settles(cl) {
		lim.credit(now, max(0, cl.reserve-out))
	}
	s.book.record(wr.provider(), lk.fp, func(c *Counters) {
		c.Requests++
		c.OK++
		c.InputTokens += int64(cl.inputTokens)
		c.OutputTokens += int64(out)
		if cl.embeddingInputs > 0 {
			c.Embeddings++
			c.EmbeddingInputs += int64(cl.embeddingInputs)
		}
	})
	snap := lim.snapshot(now)
	s.mu.Unlock()
	wr.setRateHeaders(w.Header(), snap)
	writeJSON(w, http.StatusOK, resp)
}

// settles reports whether cl's unused output reservation goes back after
// the call: Anthropic's and Bedrock's way, or OpenAI's when
// Config.RefundOpenAI asks for it.
func (s *Server) settles(cl *call) bool { return cl.settle || s.refundOpenAI }

// land counts an admitted call out of flight.
func (s *Server) land(p provider, fp string) {
	s.mu.Lock()
	s.flights.leave(p, fp)
	s.mu.Unlock()
}

// sleep waits d, and reports false when the request's context ended first.
func (s *Server) sleep(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return r.Context().Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// writeJSON writes v as the JSON body with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only the mock's own types are marshalled; this is a bug.
		http.Error(w, "mockprovider: encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b) // the client may be gone; nothing to do about it
}

// randomHex returns 2n random hex digits for ids.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// decodeAdmin decodes an admin request body strictly.
func decodeAdmin(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding body: %w", err)
	}
	return nil
}

func writeAdminError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// retryAfterSeconds is d in whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

// retryAfterMillis is d in whole milliseconds, rounded up, at least 1.
func retryAfterMillis(d time.Duration) int64 {
	return max(1, int64((d+time.Millisecond-1)/time.Millisecond))
}
