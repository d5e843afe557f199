package mockprovider

import (
	"math"
	"time"
)

// epsilon absorbs float rounding in bucket arithmetic, so that a bucket
// refilled to exactly the cost admits it and a level of 4.9999999 reports 5.
const epsilon = 1e-9

// bucket is a continuously refilling token bucket: capacity tokens, refilled
// at rate tokens per second. A nil *bucket is unlimited: it always admits,
// never charges and reports nothing. Not safe for concurrent use; the
// Server's mutex guards every bucket.
type bucket struct {
	capacity float64
	rate     float64 // tokens per second
	level    float64
	last     time.Time // when level was last brought up to date
}

// newPerMinuteBucket returns a full bucket of perMinute tokens that refills
// perMinute/60 tokens per second, or nil (unlimited) when perMinute is 0.
func newPerMinuteBucket(perMinute int, now time.Time) *bucket {
	if perMinute <= 0 {
		return nil
	}
	c := float64(perMinute)
	return &bucket{capacity: c, rate: c / 60, level: c, last: now}
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

// wait returns how long until the bucket holds cost tokens (0 when it does
// now). The bucket must have been refilled at now, and cost must fit.
func (b *bucket) wait(cost float64) time.Duration {
	if b == nil || b.level+epsilon >= cost {
		return 0
	}
	return secondsToDuration((cost - b.level) / b.rate)
}

// take removes cost tokens; the caller checked wait() == 0.
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
		reset:     secondsToDuration((b.capacity - lvl) / b.rate),
	}
}

// secondsToDuration converts seconds to a Duration, rounding up to the next
// nanosecond so a wait computed from it is never short.
func secondsToDuration(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}

// limiter is the pair of buckets of one (endpoint, key).
type limiter struct {
	rpm *bucket
	tpm *bucket
}

func newLimiter(l Limits, now time.Time) *limiter {
	return &limiter{rpm: newPerMinuteBucket(l.RPM, now), tpm: newPerMinuteBucket(l.TPM, now)}
}

// verdict is the outcome of an admission attempt.
type verdict struct {
	ok bool
	// retryAfter is the time until both buckets would have room, when !ok
	// and the request can ever fit.
	retryAfter time.Duration
	// limitedBy names the bucket that refused: "requests" or "tokens" (the
	// requests bucket when both do).
	limitedBy string
	// tooLarge: the token cost exceeds the TPM capacity, so no wait helps.
	tooLarge bool
}

// admit charges one request and tokens tokens when both buckets have room,
// and charges nothing otherwise.
func (l *limiter) admit(now time.Time, tokens int) verdict {
	l.rpm.refill(now)
	l.tpm.refill(now)
	cost := float64(tokens)
	if !l.tpm.fits(cost) {
		return verdict{limitedBy: "tokens", tooLarge: true}
	}
	wr, wt := l.rpm.wait(1), l.tpm.wait(cost)
	if wr > 0 || wt > 0 {
		by := "tokens"
		if wr > 0 {
			by = "requests"
		}
		return verdict{retryAfter: max(wr, wt), limitedBy: by}
	}
	l.rpm.take(1)
	l.tpm.take(cost)
	return verdict{ok: true}
}

// credit returns n unused tokens to the TPM bucket.
func (l *limiter) credit(now time.Time, n int) {
	l.tpm.refill(now)
	l.tpm.give(float64(n))
}

// snapshot reads both buckets at now.
func (l *limiter) snapshot(now time.Time) snapshot {
	l.rpm.refill(now)
	l.tpm.refill(now)
	return snapshot{now: now, requests: l.rpm.state(), tokens: l.tpm.state()}
}

// snapshot is the state the rate-limit headers of one response report.
type snapshot struct {
	now      time.Time
	requests state
	tokens   state
}
