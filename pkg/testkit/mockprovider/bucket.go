package mockprovider

import (
	"math"
	"time"
)

// epsilon absorbs float rounding in bucket arithmetic, so that a bucket
// refilled to exactly the cost admits it and a level of 4.9999999 reports 5.
const epsilon = 1e-9

// bucket is a continuously refilling token bucket: capacity tokens, refilled
// at rate tokens per second. Its level may go below zero: a cost above the
// capacity is admitted on credit when the bucket is full (see need), and the
// debt is refilled like any other shortfall. A nil *bucket is unlimited: it
// always admits, never charges and reports nothing. Not safe for concurrent
// use; the Server's mutex guards every bucket.
type bucket struct {
	capacity float64
	rate     float64 // tokens per second
	level    float64
	last     time.Time // when level was last brought up to date
}

// newBucket returns a full bucket for a limit of perMinute that holds
// window's share of it (perMinute × window/1m, at least floor) and refills
// perMinute/60 tokens per second; nil (unlimited) when perMinute is 0.
func newBucket(perMinute int, window time.Duration, floor float64, now time.Time) *bucket {
	if perMinute <= 0 {
		return nil
	}
	// Multiply before dividing so a one-minute window holds exactly
	// perMinute, with no float residue in the limit headers.
	c := max(floor, float64(perMinute)*window.Seconds()/60)
	return &bucket{capacity: c, rate: float64(perMinute) / 60, level: c, last: now}
}

// refill brings the level up to date at now. A clock that steps back is
// ignored rather than draining the bucket.
func (b *bucket) refill(now time.Time) {
	if b == nil {
		return
	}
	if dt := now.Sub(b.last); dt > 0 {
		b.level = math.Min(b.capacity, b.level+dt.Seconds()*b.rate)
		b.last = now
	}
}

// fits reports whether cost could ever be admitted, i.e. cost <= capacity.
func (b *bucket) fits(cost float64) bool {
	return b == nil || cost <= b.capacity+epsilon
}

// need is the level at which cost is admitted: cost itself, or a full
// bucket when cost is above the capacity. Without the second rule a
// short-window bucket could never admit a request that the per-minute limit
// allows (a 5,000-token call on a 1,000-token window); with it the request
// goes when nothing else has used the window, and the debt it leaves makes
// the next calls wait as long as its size warrants.
func (b *bucket) need(cost float64) float64 {
	return math.Min(cost, b.capacity)
}

// wait returns how long until the bucket admits cost (0 when it does now).
// The bucket must have been refilled at now.
func (b *bucket) wait(cost float64) time.Duration {
	if b == nil {
		return 0
	}
	need := b.need(cost)
	if b.level+epsilon >= need {
		return 0
	}
	return secondsToDuration((need - b.level) / b.rate)
}

// take removes cost tokens, possibly below zero; the caller checked
// wait() == 0.
func (b *bucket) take(cost float64) {
	if b != nil {
		b.level -= cost
	}
}

// give returns n tokens, never above capacity.
func (b *bucket) give(n float64) {
	if b != nil && n > 0 {
		b.level = math.Min(b.capacity, b.level+n)
	}
}

// state is what the rate-limit headers report about a bucket.
type state struct {
	limited   bool          // false: unlimited, no headers
	limit     int           // capacity
	remaining int           // whole tokens available now
	reset     time.Duration // until the bucket is full again
}

// state reports the bucket at the time of its last refill.
func (b *bucket) state() state {
	if b == nil {
		return state{}
	}
	lvl := math.Max(0, b.level)
	return state{
		limited:   true,
		limit:     int(b.capacity),
		remaining: int(math.Floor(lvl + epsilon)),
		reset:     secondsToDuration((b.capacity - b.level) / b.rate), // a debt delays it too
	}
}

// secondsToDuration converts seconds to a Duration, rounding up to the next
// nanosecond so a wait computed from it is never short. Float residue (a
// relative 1e-16 or so) is dropped first, or 4.001 s would come out as
// 4.001000001 s and a retry-after-ms of 4002; the 1e-12 allowance is under
// 0.1 ns for any wait the buckets produce (at most a minute).
func secondsToDuration(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	ns := s * float64(time.Second)
	return time.Duration(math.Ceil(ns - ns*1e-12))
}

// meter is one per-minute limit seen two ways, as the providers show it.
// window enforces it: a bucket holding Config.Window's share of the limit,
// because providers quantize ("60,000 requests/minute may be enforced as
// 1,000 requests/second"). minute is what the headers report: a bucket of
// the whole per-minute limit, charged, credited and refilled exactly like
// window, since providers report limit/remaining/reset against the
// per-minute figure. Both are nil when the limit is 0.
//
// Only window decides admission. minute never disagrees: both start full,
// get the same charges, credits and refill, and window's smaller capacity
// only ever clips more, so minute's level stays at least window's plus the
// difference of the capacities.
type meter struct {
	window *bucket
	minute *bucket
}

func newMeter(perMinute int, window time.Duration, floor float64, now time.Time) meter {
	return meter{
		window: newBucket(perMinute, window, floor, now),
		minute: newBucket(perMinute, time.Minute, 0, now),
	}
}

func (m meter) refill(now time.Time) {
	m.window.refill(now)
	m.minute.refill(now)
}

func (m meter) take(n float64) {
	m.window.take(n)
	m.minute.take(n)
}

func (m meter) give(n float64) {
	m.window.give(n)
	m.minute.give(n)
}

// limiter is the request and token meters of one (endpoint, key): the
// combined token meter (TPM, input plus output) and, where a key sets them,
// Anthropic's separate input and output meters (ITPM, OTPM). A nil bucket
// is an unlimited one.
type limiter struct {
	requests meter
	tokens   meter
	input    meter
	output   meter
}

// newLimiter builds full meters for l. The request window holds at least
// one request, or a key under 60 RPM (with a 1 s window) could never be
// called at all.
func newLimiter(l Limits, window time.Duration, now time.Time) *limiter {
	return &limiter{
		requests: newMeter(l.RPM, window, 1, now),
		tokens:   newMeter(l.TPM, window, 0, now),
		input:    newMeter(l.ITPM, window, 0, now),
		output:   newMeter(l.OTPM, window, 0, now),
	}
}

// verdict is the outcome of an admission attempt.
type verdict struct {
	ok bool
	// retryAfter is the time until every window bucket would admit the
	// request, when !ok and the request can ever fit.
	retryAfter time.Duration
	// limitedBy names the bucket that refused: one of the limitBy...
	// names (the requests bucket when several do, then the one that
	// waits longest).
	limitedBy string
	// tooLarge: a token cost exceeds its per-minute limit itself, so no
	// wait helps.
	tooLarge bool
}

// The buckets a verdict names; Anthropic's messages quote them ("… of 8000
// output tokens per minute").
const (
	limitByRequests = "requests"
	limitByTokens   = "tokens"
	limitByInput    = "input tokens"
	limitByOutput   = "output tokens"
)

// admit charges one request, in+out tokens to the token meter, in to the
// input meter and out to the output meter when every window bucket admits
// them, and charges nothing otherwise. out is the output reserved at
// admission (max_tokens), as every provider does.
func (l *limiter) admit(now time.Time, in, out int) verdict {
	l.refill(now)
	charges := []struct {
		m    meter
		cost float64
		by   string
	}{
		{l.tokens, float64(in + out), limitByTokens},
		{l.input, float64(in), limitByInput},
		{l.output, float64(out), limitByOutput},
	}
	for _, c := range charges {
		if !c.m.minute.fits(c.cost) {
			return verdict{limitedBy: c.by, tooLarge: true}
		}
	}
	v := verdict{}
	if w := l.requests.window.wait(1); w > 0 {
		v.retryAfter, v.limitedBy = w, limitByRequests
	}
	for _, c := range charges {
		if w := c.m.window.wait(c.cost); w > v.retryAfter {
			if v.limitedBy != limitByRequests {
				v.limitedBy = c.by
			}
			v.retryAfter = w
		}
	}
	if v.retryAfter > 0 {
		return v
	}
	l.requests.take(1)
	for _, c := range charges {
		c.m.take(c.cost)
	}
	return verdict{ok: true}
}

func (l *limiter) refill(now time.Time) {
	l.requests.refill(now)
	l.tokens.refill(now)
	l.input.refill(now)
	l.output.refill(now)
}

// credit returns n unused output tokens (reserved at admission) to the
// token and output meters: Anthropic's settlement of its max_tokens
// estimate to the real output.
func (l *limiter) credit(now time.Time, n int) {
	l.refill(now)
	l.tokens.give(float64(n))
	l.output.give(float64(n))
}

// snapshot reads the per-minute view at now, which is what the headers
// report.
func (l *limiter) snapshot(now time.Time) snapshot {
	l.refill(now)
	return snapshot{now: now, requests: l.requests.minute.state(), tokens: l.tokens.minute.state(),
		input: l.input.minute.state(), output: l.output.minute.state()}
}

// snapshot is the state the rate-limit headers of one response report.
type snapshot struct {
	now      time.Time
	requests state
	tokens   state // combined input + output (TPM)
	input    state // input tokens (ITPM)
	output   state // output tokens (OTPM)
}

// tightest is the token state Anthropic's anthropic-ratelimit-tokens-*
// report, "the most restrictive limit currently in effect": the one of the
// limited token states with the fewest remaining.
func (s snapshot) tightest() state {
	var best state
	for _, st := range []state{s.tokens, s.input, s.output} {
		if st.limited && (!best.limited || st.remaining < best.remaining) {
			best = st
		}
	}
	return best
}
