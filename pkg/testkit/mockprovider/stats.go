package mockprovider

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net/http"
)

// Fingerprint names an API key without revealing it: "fp_" + the first 10
// hex digits of its SHA-256. Stats, faults and logs refer to keys only by
// fingerprint.
func Fingerprint(apiKey string) string {
	sum := sha256.Sum256([]byte(apiKey))
	return "fp_" + hex.EncodeToString(sum[:])[:10]
}

// Counters counts what the mock answered, for one key or one provider.
type Counters struct {
	// Requests counts authenticated requests to a provider endpoint,
	// whatever their outcome.
	Requests int64 `json:"requests"`
	// OK counts 200 answers (chat and embeddings). A streamed answer counts
	// when its stream ends: here when it finished, under Injected when a
	// stream fault broke it, under Requests only when the client left.
	OK int64 `json:"ok"`
	// RateLimited counts 429s from the RPM/TPM buckets: over-subscription
	// by the caller. Injected 429s are not counted here.
	RateLimited int64 `json:"rate_limited"`
	// Busy counts 503s of a key at its MaxConcurrent calls: a local
	// server's over-subscription.
	Busy int64 `json:"busy"`
	// Injected counts injected faults by mode.
	Injected map[FaultMode]int64 `json:"injected,omitempty"`
	// Invalid counts 4xx answers to malformed requests.
	Invalid int64 `json:"invalid"`
	// Unauthorized counts requests without a key (provider totals only:
	// there is no key to file them under).
	Unauthorized int64 `json:"unauthorized,omitempty"`
	// InputTokens and OutputTokens sum the usage of OK answers.
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Embeddings counts OK embeddings requests; EmbeddingInputs the vectors
	// they returned.
	Embeddings      int64 `json:"embeddings"`
	EmbeddingInputs int64 `json:"embedding_inputs"`
	// InFlight is a gauge, not a count: the calls admitted by the buckets
	// whose answer is not yet written, a stream until its last byte
	// (injected faults and refusals never enter). MaxInFlight is the most there were at once since New or the
	// last Reset; load tests read it to check a concurrency cap from the
	// provider's side.
	InFlight    int64 `json:"in_flight"`
	MaxInFlight int64 `json:"max_in_flight"`
}

// Stats is a snapshot of the mock's counters.
type Stats struct {
	// Keys holds counters per key, by Fingerprint, across providers.
	Keys map[string]Counters `json:"keys"`
	// Providers holds totals per provider: "claude" and "openai"
	// (embeddings count under openai).
	Providers map[string]Counters `json:"providers"`
	// InFlight and MaxInFlight are the gauges of Counters over every key
	// and provider together.
	InFlight    int64 `json:"in_flight"`
	MaxInFlight int64 `json:"max_in_flight"`
}

// Total returns the counters of both providers summed, with the gauges
// over both (a sum of per-provider maxima would overstate MaxInFlight).
func (s Stats) Total() Counters {
	var t Counters
	for _, c := range s.Providers {
		t.add(c)
	}
	t.InFlight, t.MaxInFlight = s.InFlight, s.MaxInFlight
	return t
}

// add sums the counts of o into c; the gauges do not sum (see Total).
func (c *Counters) add(o Counters) {
	c.Requests += o.Requests
	c.OK += o.OK
	c.RateLimited += o.RateLimited
	c.Busy += o.Busy
	c.Invalid += o.Invalid
	c.Unauthorized += o.Unauthorized
	c.InputTokens += o.InputTokens
	c.OutputTokens += o.OutputTokens
	c.Embeddings += o.Embeddings
	c.EmbeddingInputs += o.EmbeddingInputs
	for m, n := range o.Injected {
		if c.Injected == nil {
			c.Injected = map[FaultMode]int64{}
		}
		c.Injected[m] += n
	}
}

func (c Counters) clone() Counters {
	c.Injected = maps.Clone(c.Injected)
	return c
}

// book holds the live counters. Guarded by Server.mu.
type book struct {
	keys      map[string]*Counters
	providers map[string]*Counters
}

func newBook() *book {
	return &book{keys: map[string]*Counters{}, providers: map[string]*Counters{}}
}

// record applies f to the counters of key fp (none when fp is "") and of
// provider p.
func (b *book) record(p provider, fp string, f func(*Counters)) {
	pc := b.providers[string(p)]
	if pc == nil {
		pc = &Counters{}
		b.providers[string(p)] = pc
	}
	f(pc)
	if fp == "" {
		return
	}
	kc := b.keys[fp]
	if kc == nil {
		kc = &Counters{}
		b.keys[fp] = kc
	}
	f(kc)
}

func (b *book) snapshot() Stats {
	s := Stats{Keys: make(map[string]Counters, len(b.keys)), Providers: make(map[string]Counters, len(b.providers))}
	for k, c := range b.keys {
		s.Keys[k] = c.clone()
	}
	for p, c := range b.providers {
		s.Providers[p] = c.clone()
	}
	return s
}

// gauge counts calls in flight and remembers the most at once.
type gauge struct{ now, max int64 }

func (g *gauge) enter() {
	g.now++
	g.max = max(g.max, g.now)
}

// flights holds the in-flight gauges: over all calls, per key fingerprint
// and per provider. Kept apart from book because Reset zeroes counts but
// cannot zero calls still running: it restarts each maximum from the
// current level instead. Guarded by Server.mu.
type flights struct {
	all       gauge
	keys      map[string]*gauge
	providers map[string]*gauge
}

func newFlights() *flights {
	return &flights{keys: map[string]*gauge{}, providers: map[string]*gauge{}}
}

func (f *flights) enter(p provider, fp string) {
	f.all.enter()
	gaugeOf(f.keys, fp).enter()
	gaugeOf(f.providers, string(p)).enter()
}

func (f *flights) leave(p provider, fp string) {
	f.all.now--
	f.keys[fp].now--
	f.providers[string(p)].now--
}

// resetMax restarts every maximum at the current level and forgets idle
// gauges, so a reset mock lists only keys that are used again (or still
// running).
func (f *flights) resetMax() {
	f.all.max = f.all.now
	for _, m := range []map[string]*gauge{f.keys, f.providers} {
		for name, g := range m {
			if g.now == 0 {
				delete(m, name)
				continue
			}
			g.max = g.now
		}
	}
}

// fill copies the gauges into s, adding entries for keys and providers
// that have calls in flight but no finished ones yet.
func (f *flights) fill(s *Stats) {
	s.InFlight, s.MaxInFlight = f.all.now, f.all.max
	fillGauges(s.Keys, f.keys)
	fillGauges(s.Providers, f.providers)
}

func fillGauges(dst map[string]Counters, src map[string]*gauge) {
	for name, g := range src {
		c := dst[name]
		c.InFlight, c.MaxInFlight = g.now, g.max
		dst[name] = c
	}
}

func gaugeOf(m map[string]*gauge, name string) *gauge {
	g := m[name]
	if g == nil {
		g = &gauge{}
		m[name] = g
	}
	return g
}

// Stats returns a snapshot of the counters and gauges. Safe for concurrent
// use.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.book.snapshot()
	s.flights.fill(&st)
	return st
}

// Reset zeroes the counters, restarts the in-flight maxima from the calls
// still running, and refills every bucket. Faults and latency stay as they
// are.
func (s *Server) Reset() {
	s.mu.Lock()
	s.book = newBook()
	s.flights.resetMax()
	s.limiters = map[limiterKey]*limiter{}
	s.mu.Unlock()
	s.log.Info("mock provider: counters and buckets reset")
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Stats())
}

func (s *Server) handleReset(w http.ResponseWriter, _ *http.Request) {
	s.Reset()
	w.WriteHeader(http.StatusNoContent)
}
