package mockprovider

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

// FaultMode is the kind of failure a Fault injects.
type FaultMode string

const (
	// FaultRateLimit answers 429 in the provider's rate-limit shape
	// (Anthropic rate_limit_error, OpenAI rate_limit_exceeded) with
	// retry-after = Fault.RetryAfter (FaultRetryAfterDefault when 0).
	FaultRateLimit FaultMode = "rate_limit"
	// FaultOverloaded answers Anthropic 529 overloaded_error, OpenAI 503.
	FaultOverloaded FaultMode = "overloaded"
	// FaultServerError answers 500 (Anthropic api_error, OpenAI
	// server_error).
	FaultServerError FaultMode = "server_error"
	// FaultInsufficientQuota answers OpenAI 429 insufficient_quota; for
	// Anthropic the spend-limit answer of FaultSpendLimit.
	FaultInsufficientQuota FaultMode = "insufficient_quota"
	// FaultSpendLimit answers Anthropic 429 rate_limit_error whose
	// error.details.error_code is "enforced_spend_limit_reached", without
	// retry-after (as Anthropic documents it); for OpenAI the
	// insufficient_quota answer. Waiting does not help either.
	FaultSpendLimit FaultMode = "spend_limit"
	// FaultTimeout never answers: the request hangs until the client gives
	// up (its context ends) or the Server is closed, which drops the
	// connection.
	FaultTimeout FaultMode = "timeout"
	// FaultInvalidRequest answers 400 invalid_request_error: the provider
	// refuses the request itself.
	FaultInvalidRequest FaultMode = "invalid_request"
	// FaultStreamError breaks a streamed answer after Fault.AfterChunks
	// content chunks with the provider's mid-stream error: Anthropic's
	// "event: error" overloaded_error, OpenAI's (and Azure's)
	// "data: {"error":{... "type":"server_error"}}" line, and no
	// message_stop or [DONE] after it. The status was 200 already.
	FaultStreamError FaultMode = "stream_error"
	// FaultStreamCut closes the connection of a streamed answer after
	// Fault.AfterChunks content chunks, with no error event and no end of
	// the chunked body: the client reads an unexpected EOF.
	FaultStreamCut FaultMode = "stream_cut"
)

// Both stream modes apply to streamed requests only. A request that does
// not stream passes them by (they keep their Count); a streamed request
// meets the other modes first, since those answer before the body is read,
// and a stream mode only once the buckets have admitted it: a broken stream
// was charged like any admitted call (see the package doc, "Streaming").

// FaultRetryAfterDefault is the retry-after of a FaultRateLimit whose
// RetryAfter is 0.
const FaultRetryAfterDefault = time.Second

// FaultAfterChunksDefault is the number of content chunks a stream fault
// lets through when Fault.AfterChunks is 0.
const FaultAfterChunksDefault = 1

// Valid reports whether m is a known mode.
func (m FaultMode) Valid() bool {
	switch m {
	case FaultRateLimit, FaultOverloaded, FaultServerError, FaultInsufficientQuota, FaultSpendLimit, FaultTimeout,
		FaultInvalidRequest, FaultStreamError, FaultStreamCut:
		return true
	}
	return false
}

// breaksStream reports whether m is a stream mode, met by streamed
// requests only.
func (m FaultMode) breaksStream() bool { return m == FaultStreamError || m == FaultStreamCut }

// Fault makes the mock fail requests on purpose. Injected faults answer
// before the body is read and do not touch the RPM/TPM buckets; they still
// carry the rate-limit headers of the key's current state. The stream modes
// are the exception: they break a streamed answer the buckets admitted.
type Fault struct {
	// Provider is "claude", "openai" (chat and embeddings), "bedrock",
	// "azure" or "" for every wire.
	Provider string
	// KeyFingerprint limits the fault to one key (see Fingerprint); ""
	// means every key.
	KeyFingerprint string
	// Mode is the failure.
	Mode FaultMode
	// Count is how many matching requests fail: 0 means every one until
	// ClearFaults.
	Count int
	// RetryAfter is sent as retry-after (and OpenAI's retry-after-ms) on
	// rate_limit (default FaultRetryAfterDefault), overloaded and
	// server_error answers; 0 sends none on the latter two. Quota and
	// spend-limit answers never carry one.
	RetryAfter time.Duration
	// Message, when set, replaces the error message of the answer (of the
	// mid-stream error event for FaultStreamError), so a test can make a
	// provider say something (an organisation id, an address) and check
	// where it goes.
	Message string
	// AfterChunks is how many content chunks (text or tool-input deltas;
	// an OpenAI tool call's first chunk, with its name, counts as one) a
	// stream mode lets through before it breaks the stream, at the moment
	// the next one would go out. 0: FaultAfterChunksDefault (1); negative:
	// none, the stream breaks at the first token, after message_start or
	// the role chunk. An answer with fewer chunks breaks after its last
	// one, before the stop events. Stream modes only.
	AfterChunks int
}

// afterChunks is f.AfterChunks with its default applied, at most chunks.
func (f Fault) afterChunks(chunks int) int {
	n := f.AfterChunks
	switch {
	case n == 0:
		n = FaultAfterChunksDefault
	case n < 0:
		n = 0
	}
	return min(n, chunks)
}

// faultJSON is Fault on the wire of POST /mock/faults: retry_after is a Go
// duration string ("1.5s").
type faultJSON struct {
	Provider       string    `json:"provider,omitempty"`
	KeyFingerprint string    `json:"key_fingerprint,omitempty"`
	Mode           FaultMode `json:"mode"`
	Count          int       `json:"count,omitempty"`
	RetryAfter     string    `json:"retry_after,omitempty"`
	Message        string    `json:"message,omitempty"`
	AfterChunks    int       `json:"after_chunks,omitempty"`
}

// MarshalJSON encodes f with retry_after as a duration string.
func (f Fault) MarshalJSON() ([]byte, error) {
	j := faultJSON{Provider: f.Provider, KeyFingerprint: f.KeyFingerprint, Mode: f.Mode, Count: f.Count, Message: f.Message,
		AfterChunks: f.AfterChunks}
	if f.RetryAfter != 0 {
		j.RetryAfter = f.RetryAfter.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes the form MarshalJSON writes, rejecting unknown
// fields.
func (f *Fault) UnmarshalJSON(b []byte) error {
	var j faultJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields() // a misspelt field must not widen a fault silently
	if err := dec.Decode(&j); err != nil {
		return err
	}
	*f = Fault{Provider: j.Provider, KeyFingerprint: j.KeyFingerprint, Mode: j.Mode, Count: j.Count, Message: j.Message,
		AfterChunks: j.AfterChunks}
	if j.RetryAfter != "" {
		d, err := time.ParseDuration(j.RetryAfter)
		if err != nil {
			return fmt.Errorf("retry_after: %w", err)
		}
		f.RetryAfter = d
	}
	return nil
}

func (f Fault) validate() error {
	switch provider(f.Provider) {
	case "", providerClaude, providerOpenAI, providerBedrock, providerAzure:
	default:
		return fmt.Errorf("mockprovider: Fault.Provider %q: want claude, openai, bedrock, azure or empty", f.Provider)
	}
	if !f.Mode.Valid() {
		return fmt.Errorf("mockprovider: Fault.Mode %q: want rate_limit, overloaded, server_error, insufficient_quota, spend_limit, timeout, "+
			"invalid_request, stream_error or stream_cut", f.Mode)
	}
	if f.AfterChunks != 0 && !f.Mode.breaksStream() {
		// A misplaced field must not look as if it did something.
		return fmt.Errorf("mockprovider: Fault.AfterChunks %d: only stream_error and stream_cut take it, not %s", f.AfterChunks, f.Mode)
	}
	if f.Count < 0 {
		return fmt.Errorf("mockprovider: Fault.Count %d: want >= 0", f.Count)
	}
	if f.RetryAfter < 0 {
		return fmt.Errorf("mockprovider: Fault.RetryAfter %s: want >= 0", f.RetryAfter)
	}
	return nil
}

func (f *Fault) matches(p provider, fp string) bool {
	return (f.Provider == "" || provider(f.Provider) == p) && (f.KeyFingerprint == "" || f.KeyFingerprint == fp)
}

// SetFault adds f after the faults already set; a request meets the first
// one that matches it. It fails only when f is invalid. Safe for concurrent
// use.
func (s *Server) SetFault(f Fault) error {
	if err := f.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	s.faults = append(s.faults, &f)
	s.mu.Unlock()
	s.log.Info("mock provider: fault set", "provider", f.Provider, "key", f.KeyFingerprint, "mode", f.Mode, "count", f.Count,
		"retry_after", f.RetryAfter, "after_chunks", f.AfterChunks)
	return nil
}

// ClearFaults removes every fault. Requests already hanging on a timeout
// fault keep hanging until their client gives up.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
	s.log.Info("mock provider: faults cleared")
}

// Faults returns the faults in force, with Count the number of requests
// each has left to fail (0: until cleared).
func (s *Server) Faults() []Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Fault, len(s.faults))
	for i, f := range s.faults {
		out[i] = *f
	}
	return out
}

// takeFault returns the first fault matching (p, fp) among the stream
// modes (stream) or the others (!stream), using up one of its Count. The
// caller holds s.mu.
func (s *Server) takeFault(p provider, fp string, stream bool) (Fault, bool) {
	for i, f := range s.faults {
		if !f.matches(p, fp) || f.Mode.breaksStream() != stream {
			continue
		}
		got := *f
		if f.Count > 0 {
			f.Count--
			if f.Count == 0 {
				s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			}
		}
		return got, true
	}
	return Fault{}, false
}

// faultError is the answer an injected fault gives, or nil for a timeout
// (and the stream modes, which stream.go answers).
func faultError(f Fault) *apiError {
	e := faultKind(f)
	if e != nil {
		e.custom = f.Message
	}
	return e
}

// faultKind is the answer of f's mode, in the wire's own wording.
func faultKind(f Fault) *apiError {
	switch f.Mode {
	case FaultInvalidRequest:
		return invalid("the request is invalid")
	case FaultRateLimit:
		ra := f.RetryAfter
		if ra == 0 {
			ra = FaultRetryAfterDefault
		}
		return &apiError{kind: errRateLimit, retryAfter: ra, limitedBy: limitByRequests}
	case FaultOverloaded:
		return &apiError{kind: errOverloaded, retryAfter: f.RetryAfter}
	case FaultServerError:
		return &apiError{kind: errServer, retryAfter: f.RetryAfter}
	case FaultInsufficientQuota, FaultSpendLimit:
		return &apiError{kind: errQuota}
	}
	return nil
}

// hang blocks a timeout-faulted request until its client gives up or the
// Server closes; then it drops the connection without an answer.
func (s *Server) hang(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-s.closed:
	}
	panic(http.ErrAbortHandler) // net/http closes the connection quietly
}

func (s *Server) handleSetFault(w http.ResponseWriter, r *http.Request) {
	var f Fault
	if err := decodeAdmin(r, &f); err != nil {
		writeAdminError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.SetFault(f); err != nil {
		writeAdminError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"faults": s.Faults()})
}

func (s *Server) handleListFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"faults": s.Faults()})
}

func (s *Server) handleClearFaults(w http.ResponseWriter, _ *http.Request) {
	s.ClearFaults()
	w.WriteHeader(http.StatusNoContent)
}

// latencyJSON is the body of POST /mock/latency and its answer; an absent
// field keeps its setting. The stream fields mean what the Config fields of
// the same name do, negative durations included.
type latencyJSON struct {
	Latency             *string `json:"latency,omitempty"`
	Jitter              *string `json:"jitter,omitempty"`
	StreamFirstToken    *string `json:"stream_first_token,omitempty"`
	StreamChunkInterval *string `json:"stream_chunk_interval,omitempty"`
	StreamChunkTokens   *int    `json:"stream_chunk_tokens,omitempty"`
}

// latencySetting is one duration field of latencyJSON and its setter.
type latencySetting struct {
	field    string
	value    *string
	negative bool // a negative duration has a meaning
	set      func(time.Duration)
}

func (s *Server) handleSetLatency(w http.ResponseWriter, r *http.Request) {
	var j latencyJSON
	if err := decodeAdmin(r, &j); err != nil {
		writeAdminError(w, http.StatusBadRequest, err.Error())
		return
	}
	settings := []latencySetting{
		{"latency", j.Latency, false, s.SetLatency},
		{"jitter", j.Jitter, false, s.SetLatencyJitter},
		{"stream_first_token", j.StreamFirstToken, true, s.SetStreamFirstToken},
		{"stream_chunk_interval", j.StreamChunkInterval, true, s.SetStreamChunkInterval},
	}
	// Parse every field before setting any, so a bad body changes nothing.
	durations := make([]time.Duration, len(settings))
	given := j.StreamChunkTokens != nil
	for i, st := range settings {
		if st.value == nil {
			continue
		}
		given = true
		d, err := time.ParseDuration(*st.value)
		if err != nil || (d < 0 && !st.negative) {
			want := "a duration >= 0"
			if st.negative {
				want = "a duration (negative: none)"
			}
			writeAdminError(w, http.StatusBadRequest, fmt.Sprintf("%s %q: want %s such as \"200ms\"", st.field, *st.value, want))
			return
		}
		durations[i] = d
	}
	if !given {
		writeAdminError(w, http.StatusBadRequest, `want one or more of {"latency": "200ms", "jitter": "50ms", `+
			`"stream_first_token": "500ms", "stream_chunk_interval": "20ms", "stream_chunk_tokens": 1}`)
		return
	}
	if n := j.StreamChunkTokens; n != nil && (*n < 0 || *n > StreamChunkTokensMax) {
		writeAdminError(w, http.StatusBadRequest, fmt.Sprintf("stream_chunk_tokens %d: want 0..%d (0 = default %d)",
			*n, StreamChunkTokensMax, StreamChunkTokensDefault))
		return
	}
	for i, st := range settings {
		if st.value != nil {
			st.set(durations[i])
		}
	}
	if n := j.StreamChunkTokens; n != nil {
		s.SetStreamChunkTokens(*n)
	}
	writeJSON(w, http.StatusOK, s.latencySettings())
}

// latencySettings reports the latency and the stream pace in force, as
// POST /mock/latency takes them.
func (s *Server) latencySettings() latencyJSON {
	str := func(v *atomic.Int64) *string {
		d := time.Duration(v.Load()).String()
		return &d
	}
	n := int(s.chunkTokens.Load())
	return latencyJSON{
		Latency:             str(&s.latency),
		Jitter:              str(&s.jitter),
		StreamFirstToken:    str(&s.firstToken),
		StreamChunkInterval: str(&s.chunkInterval),
		StreamChunkTokens:   &n,
	}
}
