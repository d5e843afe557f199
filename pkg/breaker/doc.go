// Package breaker implements layer 5 of Bulwark's 429 defense: circuit
// breakers whose state lives in Redis, so that every worker process on every
// machine sees and drives the same breaker, and an operator can observe it.
//
// There is one breaker per provider/tier route, named by llm.Route.String()
// (e.g. "claude/sonnet"), plus one named [AllName] that the worker trips when
// every provider is exhausted. A [Set] holds the shared configuration; the
// breakers themselves are created in Redis on first use.
//
// # States
//
//	          FailureThreshold consecutive failures, or Trip
//	closed ────────────────────────────────────────────▶ open
//	  ▲                                                  │  ▲
//	  │                               OpenTimeout passed │  │ a probe fails,
//	  │                          (lazily, at next Allow) ▼  │ or Trip
//	  └─────────────────────────────────────────────── half_open
//	      SuccessThreshold successful probes
//
//	Reset closes a breaker from any state.
//
// Closed: every [Set.Allow] is admitted. A Failure outcome adds one to the
// consecutive-failure count, a Success resets it, an Ignore leaves it alone.
//
// Open: every Allow fails with an [*OpenError] (errors.Is(err, [ErrOpen]))
// whose RetryAfter says when the breaker turns half-open. A breaker opened
// by [Set.Trip] behaves the same.
//
// Half-open: at most HalfOpenProbes callers across all processes hold a probe
// permit at once; the rest get an OpenError. Each probe permit is a lease
// that expires after ProbeTimeout, so a worker that dies mid-probe frees its
// slot instead of wedging the breaker. With the defaults (one probe at a time,
// two successes to close) the two probes run one after another. A failed
// probe re-opens the breaker for another OpenTimeout.
//
// The open→half_open transition is lazy: nothing runs on a timer. The first
// Allow after OpenTimeout performs it; [Set.Status] and [Set.List] already
// report half_open once OpenTimeout has passed.
//
// # Generations
//
// Every transition bumps the breaker's generation, and a permit remembers the
// generation it was issued in. An outcome reported for an older generation is
// stale and counts neither way: a closed-state call that fails after the
// breaker has already opened does not count towards anything, and neither
// does a probe whose lease has expired (its slot was already given back).
// ProbeTimeout must therefore exceed the longest provider call.
//
// # Consistency and time
//
// Every decision (Allow, an outcome, Trip, Reset, Status) is one Lua script,
// so it is atomic across all processes, and every script reads the clock
// with Redis TIME, so workers with skewed clocks still agree on when an
// open breaker turns half-open or a probe lease expires. All times in [Status] are Redis
// server times.
//
// Config.OnTransition is called by the process whose call caused the
// transition, and only there: other processes never hear of it, and a
// transition performed by no process (a breaker whose OpenTimeout passed
// but that nobody has asked since) is not reported until someone asks. Use
// the hook for alerts and counters; use [Set.Status] and [Set.List] as the
// source of truth.
//
// # Redis keys
//
// With the default prefix "bulwark:{breaker}:" (Config.Prefix):
//
//	bulwark:{breaker}:state:<name>   hash  state, gen, failures, successes,
//	                                       opened_at, retry_at, since, reason,
//	                                       changed_at (times in Unix ms)
//	bulwark:{breaker}:probes:<name>  zset  probe lease token → expiry (Unix ms);
//	                                       expires by itself after ProbeTimeout
//	bulwark:{breaker}:names          set   every breaker name that ever had state
//
// The scripts touch several keys of one breaker, and Status several
// breakers, at once: in a Redis Cluster they must share one hash slot,
// which the "{breaker}" hash tag of the prefix gives (pkg/config/keys.go).
//
// # Why not sony/gobreaker
//
// gobreaker v2 (v2.4.0) has a DistributedCircuitBreaker over a
// SharedDataStore. It does not fit, for three reasons:
//
//   - Its MaxRequests is both the number of half-open requests admitted and
//     the number of consecutive successes needed to close, and it counts
//     admitted requests per half-open period, not in flight. We need one
//     probe at a time but two successes, so a second probe must be admitted
//     after the first finishes.
//   - The shared store is lock-based: Execute takes a store-wide mutex
//     (polled every 500 ms, up to 5 s), reads JSON state, runs the request
//     while still holding the lock, and writes the state back. That would
//     serialise every provider call of a route across all workers; we need
//     each transition as one atomic script and calls running in parallel.
//   - It has no distributed two-step (Allow/done) form, uses the local
//     clock, takes no context, and a half-open request has no lease, so a
//     worker dying mid-probe could never be told apart from a slow one.
//
// This package keeps gobreaker's two-step shape: [Set.Allow] returns a
// [*Permit], and the caller reports the outcome with [Permit.Done] when the
// call (or stream) ends.
package breaker
