package provider

import (
	"net/http"
	"testing"
	"time"
)

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		h    http.Header
		want time.Duration
	}{
		{"missing", header(), 0},
		{"seconds", header("retry-after", "17"), 17 * time.Second},
		{"fractional seconds", header("retry-after", "1.5"), 1500 * time.Millisecond},
		{"zero", header("retry-after", "0"), 0},
		{"spaces", header("retry-after", "  3 "), 3 * time.Second},
		{"ms wins over seconds", header("retry-after-ms", "120", "retry-after", "1"), 120 * time.Millisecond},
		{"fractional ms", header("retry-after-ms", "0.5"), 500 * time.Microsecond},
		{"ms zero is decisive", header("retry-after-ms", "0", "retry-after", "5"), 0},
		{"ms -1 falls back to seconds", header("retry-after-ms", "-1", "retry-after", "5"), 5 * time.Second},
		{"ms garbage falls back to seconds", header("retry-after-ms", "soon", "retry-after", "5"), 5 * time.Second},
		{"-1", header("retry-after", "-1"), 0},
		{"garbage", header("retry-after", "later"), 0},
		{"NaN", header("retry-after", "NaN"), 0},
		{"Inf", header("retry-after", "+Inf"), 0},
		{"HTTP date in the future", header("retry-after", now.Add(90*time.Second).Format(http.TimeFormat)), 90 * time.Second},
		{"HTTP date in the past", header("retry-after", now.Add(-time.Hour).Format(http.TimeFormat)), 0},
		{"HTTP date far away is clamped", header("retry-after", now.Add(48*time.Hour).Format(http.TimeFormat)), MaxRetryAfter},
		{"huge seconds are clamped", header("retry-after", "86400"), MaxRetryAfter},
		{"absurd seconds do not overflow", header("retry-after", "1e300"), MaxRetryAfter},
		{"huge ms are clamped", header("retry-after-ms", "99999999999"), MaxRetryAfter},
		{"exactly the clamp", header("retry-after", "600"), MaxRetryAfter},
	}
	for _, tt := range tests {
		if got := ParseRetryAfter(tt.h, now); got != tt.want {
			t.Errorf("%s: ParseRetryAfter(%v) = %s, want %s", tt.name, tt.h, got, tt.want)
		}
	}
}

func TestHeaderInt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		value  string
		want   int
		wantOK bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"4999", 4999, true},
		{" 12 ", 12, true},
		{"-1", 0, false},
		{"abc", 0, false},
		{"12.9", 12, true},
		{"1e3", 1000, true},
		{"NaN", 0, false},
		{"99999999999999999999", 1<<31 - 1, true},
	}
	for _, tt := range tests {
		got, ok := HeaderInt(header("x", tt.value), "x")
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("HeaderInt(%q) = %d, %v; want %d, %v", tt.value, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestHeaderTime(t *testing.T) {
	t.Parallel()
	tests := []struct {
		value  string
		want   time.Time
		wantOK bool
	}{
		{"2026-05-01T12:00:30Z", time.Date(2026, 5, 1, 12, 0, 30, 0, time.UTC), true},
		{"2026-05-01T12:00:30.25Z", time.Date(2026, 5, 1, 12, 0, 30, 25e7, time.UTC), true},
		{"2026-05-01T14:00:30+02:00", time.Date(2026, 5, 1, 12, 0, 30, 0, time.UTC), true},
		{"", time.Time{}, false},
		{"tomorrow", time.Time{}, false},
		{"-1", time.Time{}, false},
	}
	for _, tt := range tests {
		got, ok := HeaderTime(header("x", tt.value), "x")
		if !got.Equal(tt.want) || ok != tt.wantOK {
			t.Errorf("HeaderTime(%q) = %s, %v; want %s, %v", tt.value, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestHeaderResetIn(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		value  string
		want   time.Duration
		wantOK bool
	}{
		{"1s", time.Second, true},
		{"6m0s", 6 * time.Minute, true},
		{"20ms", 20 * time.Millisecond, true},
		{"1h2m3.5s", time.Hour + 2*time.Minute + 3500*time.Millisecond, true},
		{"7.66s", 7660 * time.Millisecond, true},
		{"0s", 0, true},
		{"12", 12 * time.Second, true},
		{"0.5", 500 * time.Millisecond, true},
		{"", 0, false},
		{"-1", 0, false},
		{"-5s", 0, false},
		{"soon", 0, false},
		{"1e20", 24 * time.Hour, true},
	}
	for _, tt := range tests {
		got, ok := HeaderResetIn(header("x", tt.value), "x", now)
		if ok != tt.wantOK || (ok && !got.Equal(now.Add(tt.want))) || (!ok && !got.IsZero()) {
			t.Errorf("HeaderResetIn(%q) = %s, %v; want now+%s, %v", tt.value, got, ok, tt.want, tt.wantOK)
		}
	}
}
