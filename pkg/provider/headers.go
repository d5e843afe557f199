package provider

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxRetryAfter is the longest wait ParseRetryAfter returns. A provider that
// asks for more (an hour, a date next month) is clamped: the caller re-reads
// the provider's answer when it tries again, and a key parked for hours on
// one header would hide capacity that came back sooner.
const MaxRetryAfter = 10 * time.Minute

// maxHeaderInt caps integer header values so that arithmetic on them cannot
// overflow on any platform.
const maxHeaderInt = math.MaxInt32

// ParseRetryAfter returns how long the provider asked the caller to wait,
// read from h at time now, clamped to [0, MaxRetryAfter]; 0 means the
// provider did not say.
//
// retry-after-ms (OpenAI; milliseconds, may be fractional) is honoured before
// retry-after (delta seconds, may be fractional, or an HTTP date). A header
// counts only when it parses to a finite, non-negative value: "-1", "abc" or
// an empty value are treated as absent, so a usable retry-after still applies
// when a compatible host sends retry-after-ms: -1. An HTTP date in the past
// yields 0.
func ParseRetryAfter(h http.Header, now time.Time) time.Duration {
	if ms, ok := parseNonNegativeFloat(h.Get("retry-after-ms")); ok {
		return clampRetryAfter(ms * float64(time.Millisecond))
	}
	v := strings.TrimSpace(h.Get("retry-after"))
	if v == "" {
		return 0
	}
	if s, ok := parseNonNegativeFloat(v); ok {
		return clampRetryAfter(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return clampRetryAfter(float64(t.Sub(now)))
	}
	return 0
}

// clampRetryAfter converts ns nanoseconds to a duration in [0, MaxRetryAfter]
// without overflowing.
func clampRetryAfter(ns float64) time.Duration {
	switch {
	case ns <= 0:
		return 0
	case ns >= float64(MaxRetryAfter):
		return MaxRetryAfter
	}
	return time.Duration(ns)
}

// parseNonNegativeFloat parses s as a finite number >= 0.
func parseNonNegativeFloat(s string) (float64, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	return f, true
}

// HeaderInt reads header name of h as a non-negative count. It reports false
// when the header is absent, negative (compatible hosts send -1 for "no
// limit"), not a number, or not finite. A fractional value is truncated;
// values above 2^31-1 are capped there.
func HeaderInt(h http.Header, name string) (int, bool) {
	v := strings.TrimSpace(h.Get(name))
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return int(min(n, maxHeaderInt)), true
	}
	f, ok := parseNonNegativeFloat(v)
	if !ok {
		return 0, false
	}
	return int(min(f, maxHeaderInt)), true
}

// HeaderTime reads header name of h as an RFC 3339 timestamp (Anthropic's
// rate-limit resets). It reports false when the header is absent or does not
// parse.
func HeaderTime(h http.Header, name string) (time.Time, bool) {
	v := strings.TrimSpace(h.Get(name))
	if v == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, false
	}
	return t, true
}

// HeaderResetIn reads header name of h as a time-until-reset and returns the
// moment of the reset, now plus that duration. OpenAI sends Go-style
// durations ("1s", "6m0s", "20ms", "1h2m3.5s"); some compatible hosts send a
// bare number of seconds ("12", "0.5"), which is accepted too. It reports
// false when the header is absent, negative or does not parse.
func HeaderResetIn(h http.Header, name string, now time.Time) (time.Time, bool) {
	v := strings.TrimSpace(h.Get(name))
	if v == "" {
		return time.Time{}, false
	}
	if s, ok := parseNonNegativeFloat(v); ok {
		return now.Add(clampReset(s * float64(time.Second))), true
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return time.Time{}, false
	}
	return now.Add(min(d, maxReset)), true
}

// maxReset bounds a parsed reset so that now.Add cannot overflow; a day is
// far beyond any per-minute window, and a longer one is a host's odd value.
const maxReset = 24 * time.Hour

func clampReset(ns float64) time.Duration {
	if ns >= float64(maxReset) {
		return maxReset
	}
	return time.Duration(ns)
}
