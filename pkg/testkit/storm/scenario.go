package storm

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"bulwark/pkg/testkit/mockprovider"
)

// The mock provider's limits and Bulwark's matching key configuration.
const (
	// Keys is the number of OpenAI keys on openai/gpt4o-mini.
	Keys = 4
	// KeyRPM is each key's requests per minute, at the mock and in the pool.
	KeyRPM = 120
	// MockTPM is each key's tokens per minute: far above what the load
	// needs, so that only RPM limits.
	MockTPM = 1_000_000
	// MaxTokens is sent with every request: the mock's answers (about 90
	// bytes) fit well within it.
	MaxTokens = 128
)

// Capacity is what the keys can serve, in requests per second.
func Capacity() float64 { return Keys * KeyRPM / 60.0 }

// keys is the number of keys on the asked route: PoolKeys, or Keys.
func (s Scenario) keys() int { return cmp.Or(s.PoolKeys, Keys) }

// keyRPM is each key's requests per minute: PoolRPM, or KeyRPM.
func (s Scenario) keyRPM() int { return cmp.Or(s.PoolRPM, KeyRPM) }

// keyTPM is each key's tokens per minute: PoolTPM, or MockTPM.
func (s Scenario) keyTPM() int { return cmp.Or(s.PoolTPM, MockTPM) }

// maxTokens is the max_tokens every request sends: MaxTokens unless the
// scenario sets its own.
func (s Scenario) maxTokens() int { return cmp.Or(s.MaxTokens, MaxTokens) }

// capacity is what the scenario's keys on the asked route can serve, in
// requests per second: the request limit (Capacity() unless PoolKeys or
// PoolRPM is set) or, when it binds, the token limit — each call costing
// what the mock charges at admission, the prompt's tokens plus
// max_tokens, none of it given back (OpenAI's way).
func (s Scenario) capacity() float64 {
	req := float64(s.keys()*s.keyRPM()) / 60
	return min(req, float64(s.keys()*s.keyTPM())/60/s.callTokens())
}

// callTokens is the mean token charge of one call at the mock: the
// prompt's tokens as the mock counts them plus max_tokens.
func (s Scenario) callTokens() float64 {
	ps := s.prompts()
	sum := 0
	for _, p := range ps {
		sum += mockprovider.CountTokens(p)
	}
	return float64(sum)/float64(max(len(ps), 1)) + float64(s.maxTokens())
}

// stormKeyID and stormKey are the id and the API key of the i-th (from
// 0) OpenAI key.
func stormKeyID(i int) string { return fmt.Sprintf("openai-mini-%d", i+1) }

func stormKey(i int) string { return fmt.Sprintf("storm-openai-key-%d", i+1) }

// Mode is how a scenario's clients talk to Bulwark.
type Mode int

const (
	// Sync: POST /v1/chat/completions and wait for the answer.
	Sync Mode = iota + 1
	// Async: POST /v1/requests, then follow GET /v1/requests/{id}/events.
	Async
)

// Scenario is one storm: how many requests, how they are sent, what the
// mock does, and the targets the result must meet.
type Scenario struct {
	// Name as printed (S1, S1-slow, S1-slow-async, S2, S1-fallback,
	// S3-mixed, F1-fleet-async, F1-fleet-compat).
	Name string
	// Requests in all, Clients sending them concurrently (each waits for
	// its answer before sending its next).
	Requests, Clients int
	Mode              Mode
	// Latency and Jitter of the mock's answers (uniform in Latency±Jitter).
	Latency, Jitter time.Duration
	// Cache turns Bulwark's cache on; scenarios that must not hit it run
	// with cache: {enabled: false}.
	Cache bool
	// HotPrompts > 0: four of every five requests ask one of this many
	// prompts in turn; the fifth asks a prompt of its own. 0: every request
	// asks its own prompt.
	HotPrompts int
	// CriticalEvery > 0: every CriticalEvery-th request is
	// critical, the others low. 0: every request is normal.
	CriticalEvery int
	// FailPrimary: the mock answers 429 to every call on the asked route's
	// provider (OpenAI), and Claude keys of the same capacity back the
	// fallback route: the traffic must move there at their full capacity.
	FailPrimary bool
	// FallbackKeys adds Claude keys of the same capacity on claude/haiku,
	// the fallback route of openai/gpt4o-mini, without failing OpenAI
	// (FailPrimary implies them).
	FallbackKeys bool
	// Mixed: the providers are Anthropic, Bedrock, Azure OpenAI and a
	// local model, each with keys of its own, and the requests spread
	// over their routes (S3-mixed, mixed.go). The mock then runs in the
	// storm's process with a limit per key.
	Mixed bool
	// APIs and Workers are the api and worker processes that share the
	// scenario's Redis, database and keys; 0 means 1 and 2. Requests go
	// to the api processes in turn (request i to api i mod APIs).
	APIs, Workers int
	// WorkerConcurrency, when > 0, is each worker's worker.concurrency
	// (tasks at once); 0 leaves the configuration's default.
	WorkerConcurrency int
	// PoolKeys and PoolRPM, when > 0, replace Keys and KeyRPM: the
	// OpenAI keys on openai/gpt4o-mini and each one's requests per
	// minute, in the pool and at the mock.
	PoolKeys, PoolRPM int
	// MockWindow, when > 0, is the mock's enforcement window instead of
	// 1 s (the pool's burst window stays 1 s).
	MockWindow time.Duration
	// Fleet measures what a waiting caller sees (fleet.go): every
	// provider call goes through the storm's recording proxy (callLog),
	// which times each call, and after the load history's rows give each
	// request's acceptance and start (Result.Fleet).
	Fleet bool
	// PoolTPM, when > 0, replaces MockTPM: each OpenAI key's tokens per
	// minute, in the pool and at the mock.
	PoolTPM int
	// MaxTokens, when > 0, is the max_tokens every request sends instead
	// of the package's MaxTokens.
	MaxTokens int
	// Limit is the hard time limit of the load: at Limit after the first
	// send the clients are cancelled and the result says what arrived.
	Limit time.Duration
	// Targets the result must meet (Result.Misses).
	Targets Targets
}

// Targets are a scenario's pass marks; zero fields are not checked.
type Targets struct {
	// AllAnswered: every request answered correctly.
	AllAnswered bool
	// MinGoodput as a share of the keys' capacity.
	MinGoodput float64
	// MaxCallsPerRequest: provider calls (including 429s) per request sent.
	MaxCallsPerRequest float64
	// NoBreakerOpenings: no breaker opened during the run, but for
	// MustOpen.
	NoBreakerOpenings bool
	// MustOpen names a breaker that must open (the route the provider
	// refuses).
	MustOpen string
	// CallsEqualDistinct: provider calls equal the distinct prompts
	// (every repeated prompt answered by the cache or coalesced).
	CallsEqualDistinct bool
	// MaxCriticalP99 bounds the p99 wait of CRITICAL requests from submit
	// to their started event.
	MaxCriticalP99 time.Duration
	// MaxETAErrP50 and MaxETAErrP95 bound the relative error of queue
	// estimates: every estimate, and each request's first one, cold start
	// included (Result.ETAFirst).
	MaxETAErrP50, MaxETAErrP95 float64
	// NoOverSubscription: the mock refused no call for its key's limits —
	// no bucket 429 on any key of any wire, no busy 503 from a local
	// server at its concurrency — and saw no call on a key the scenario
	// does not know (S3-mixed).
	NoOverSubscription bool
	// MaxLocalInFlight bounds the most calls the mock saw at once on the
	// local model's key (S3-mixed).
	MaxLocalInFlight int64
	// MustServe names routes that must each serve at least one correct
	// answer.
	MustServe []string
	// MaxLowWaitRatio bounds LOW's p99 queue wait (history: created_at →
	// started_at) as a multiple of the first-come-first-served ideal,
	// clients ÷ capacity (Fleet scenarios).
	MaxLowWaitRatio float64
	// NoOvertakes: no request started more than OvertakeGap before a
	// request of the same priority and route accepted earlier (Fleet).
	NoOvertakes bool
	// MaxCriticalOverCall bounds the p99 of a CRITICAL request's
	// end-to-end latency minus its own provider call's duration (Fleet).
	MaxCriticalOverCall time.Duration
}

// AutoLimit is the default hard time limit for n requests: the time the
// keys need to serve them at capacity (when every request is a provider
// call), plus 12 s for start-up ramp and the slowest answers. A run cut
// at this limit has already missed a 95 % goodput target, so the limit
// hides nothing, and four scenarios of 400 stay within five minutes.
func AutoLimit(n int) time.Duration {
	return time.Duration(float64(n)/Capacity()*float64(time.Second)) + 12*time.Second
}

// ScenarioNames lists the scenarios in the order the command runs them.
var ScenarioNames = []string{"S1", "S1-slow", "S1-slow-async", "S2", "S1-fallback", "S3-mixed", "F1-fleet-async", "F1-fleet-compat", TPMScenario}

// TPMScenario is the token-bound storm (issue 25): 4 OpenAI keys of
// TPMKeyTPM tokens per minute, every request asking max_tokens
// TPMMaxTokens, so that tokens, not requests, limit the keys. The mock
// keeps the whole admission charge (OpenAI documents no refund), so a pool
// that gives the unused max_tokens back believes in tokens the provider
// still counts, and gets 429s.
const (
	TPMScenario  = "S4-tpm"
	TPMKeyTPM    = 90_000
	TPMMaxTokens = 1000
)

// NewScenario returns the named scenario for n requests from clients
// clients; limit 0 means AutoLimit(n) (MixedAutoLimit(n) for S3-mixed).
func NewScenario(name string, n, clients int, limit time.Duration) (Scenario, error) {
	if n <= 0 || clients <= 0 {
		return Scenario{}, fmt.Errorf("storm: scenario %s: requests and clients must be > 0, got %d and %d", name, n, clients)
	}
	auto := limit <= 0
	if auto {
		limit = AutoLimit(n)
	}
	paced := Targets{AllAnswered: true, MinGoodput: 0.95, MaxCallsPerRequest: 1.02, NoBreakerOpenings: true}
	s := Scenario{Name: name, Requests: n, Clients: clients, Mode: Sync, Limit: limit, Targets: paced}
	fast := func() { s.Latency, s.Jitter = 200*time.Millisecond, 100*time.Millisecond }
	slow := func() { s.Latency, s.Jitter = 1500*time.Millisecond, 500*time.Millisecond }
	switch name {
	case "S1":
		fast()
	case "S1-slow":
		slow()
	case "S1-slow-async":
		slow()
		s.Mode = Async
		s.CriticalEvery = 20
		s.Targets.MaxCriticalP99 = 2100 * time.Millisecond
		s.Targets.MaxETAErrP50, s.Targets.MaxETAErrP95 = 0.25, 0.5
	case "S1-fallback":
		fast()
		s.FailPrimary = true
		// The refused route's breaker opens after three 429s and probes
		// once a minute: a few calls beyond one per request.
		s.Targets.MustOpen = "openai/gpt4o-mini"
		s.Targets.MaxCallsPerRequest = 1.05
	case "S2":
		fast()
		s.Cache = true
		s.HotPrompts = 10
		s.Targets = Targets{AllAnswered: true, MaxCallsPerRequest: 1.02, NoBreakerOpenings: true, CallsEqualDistinct: true}
	case TPMScenario:
		fast()
		s.PoolTPM, s.MaxTokens = TPMKeyTPM, TPMMaxTokens
		if auto {
			s.Limit = time.Duration(float64(n)/s.capacity()*float64(time.Second)) + 12*time.Second
		}
	case "S3-mixed":
		fast()
		s.Mixed = true
		if auto {
			s.Limit = MixedAutoLimit(n)
		}
		// Goodput is not a target: the local route has no rate to compare
		// with, and the cloud keys share the load unevenly by design.
		s.Targets = Targets{AllAnswered: true, MaxCallsPerRequest: 1.02, NoBreakerOpenings: true,
			NoOverSubscription: true, MaxLocalInFlight: MixedLocalInFlight, MustServe: mixedRoutes}
	case "F1-fleet-async", "F1-fleet-compat":
		// A closed-loop fleet, 95 % LOW and 5 % CRITICAL, measured as
		// its callers see it (fleet.go).
		fast()
		s.Fleet = true
		s.CriticalEvery = 20
		s.Targets.MaxLowWaitRatio = 1.3
		s.Targets.NoOvertakes = true
		s.Targets.MaxCriticalOverCall = 300 * time.Millisecond
		if name == "F1-fleet-async" {
			s.Mode = Async
			s.Targets.MaxETAErrP50, s.Targets.MaxETAErrP95 = 0.25, 0.5
		}
	default:
		return Scenario{}, fmt.Errorf("storm: unknown scenario %q (want one of %s)", name,
			strings.Join(ScenarioNames, ", "))
	}
	return s, nil
}

// prompts returns the prompt of every request. Each distinct prompt names a
// trouble code of its own: the cache's protected-entity guard then never
// lets one prompt's answer serve another, however alike their embeddings.
func (s Scenario) prompts() []string {
	out := make([]string, s.Requests)
	hot := 0
	for i := range out {
		if s.HotPrompts > 0 && i%5 != 4 {
			k := hot % s.HotPrompts
			hot++
			out[i] = fmt.Sprintf("Storm %s hot question %d: dozens of cars report trouble code B%04X after OTA batch %d. What failed?",
				s.Name, k, k, 40+k)
			continue
		}
		out[i] = fmt.Sprintf("Storm %s request %d: car %d reports trouble code P%04X after OTA batch %d. What failed?",
			s.Name, i, i, i, i/50)
	}
	return out
}

// priorityOf returns the priority of request i.
func (s Scenario) priorityOf(i int) string {
	switch {
	case s.CriticalEvery <= 0:
		return "normal"
	case i%s.CriticalEvery == 0:
		return "critical"
	}
	return "low"
}
