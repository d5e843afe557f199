package mockprovider

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
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
)

// FaultRetryAfterDefault is the retry-after of a FaultRateLimit whose
// RetryAfter is 0.
const FaultRetryAfterDefault = time.Second

// Valid reports whether m is a known mode.
func (m FaultMode) Valid() bool {
	switch m {
	case FaultRateLimit, FaultOverloaded, FaultServerError, FaultInsufficientQuota, FaultSpendLimit, FaultTimeout,
		FaultInvalidRequest:
		return true
	}
	return false
}

// Fault makes the mock fail requests on purpose. Injected faults answer
// before the body is read and do not touch the RPM/TPM buckets; they still
// carry the rate-limit headers of the key's current state.
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
	// Message, when set, replaces the error message of the answer, so a
	// test can make a provider say something (an organisation id, an
	// address) and check where it goes.
	Message string
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
}

// MarshalJSON encodes f with retry_after as a duration string.
func (f Fault) MarshalJSON() ([]byte, error) {
	j := faultJSON{Provider: f.Provider, KeyFingerprint: f.KeyFingerprint, Mode: f.Mode, Count: f.Count, Message: f.Message}
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
	*f = Fault{Provider: j.Provider, KeyFingerprint: j.KeyFingerprint, Mode: j.Mode, Count: j.Count, Message: j.Message}
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
		return fmt.Errorf("mockprovider: Fault.Mode %q: want rate_limit, overloaded, server_error, insufficient_quota, spend_limit, timeout or invalid_request", f.Mode)
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
	s.log.Info("mock provider: fault set", "provider", f.Provider, "key", f.KeyFingerprint, "mode", f.Mode, "count", f.Count, "retry_after", f.RetryAfter)
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

// takeFault returns the first fault matching (p, fp), using up one of its
// Count. The caller holds s.mu.
func (s *Server) takeFault(p provider, fp string) (Fault, bool) {
	for i, f := range s.faults {
		if !f.matches(p, fp) {
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

// faultError is the answer an injected fault gives, or nil for a timeout.
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

// latencyJSON is the body of POST /mock/latency; an absent field keeps its
// setting.
type latencyJSON struct {
	Latency *string `json:"latency"`
	Jitter  *string `json:"jitter"`
}

func (s *Server) handleSetLatency(w http.ResponseWriter, r *http.Request) {
	var j latencyJSON
	if err := decodeAdmin(r, &j); err != nil {
		writeAdminError(w, http.StatusBadRequest, err.Error())
		return
	}
	parse := func(field string, v *string) (time.Duration, bool) {
		d, err := time.ParseDuration(*v)
		if err != nil || d < 0 {
			writeAdminError(w, http.StatusBadRequest, fmt.Sprintf("%s %q: want a duration >= 0 such as \"200ms\"", field, *v))
			return 0, false
		}
		return d, true
	}
	if j.Latency == nil && j.Jitter == nil {
		writeAdminError(w, http.StatusBadRequest, `want {"latency": "200ms"} and/or {"jitter": "50ms"}`)
		return
	}
	var lat, jit time.Duration
	var ok bool
	if j.Latency != nil {
		if lat, ok = parse("latency", j.Latency); !ok {
			return
		}
	}
	if j.Jitter != nil {
		if jit, ok = parse("jitter", j.Jitter); !ok {
			return
		}
	}
	if j.Latency != nil {
		s.SetLatency(lat)
	}
	if j.Jitter != nil {
		s.SetLatencyJitter(jit)
	}
	writeJSON(w, http.StatusOK, map[string]string{
		"latency": time.Duration(s.latency.Load()).String(),
		"jitter":  time.Duration(s.jitter.Load()).String(),
	})
}
