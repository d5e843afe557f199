package mockprovider

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		perMinute int
		window    time.Duration
		take      float64       // taken at t0
		after     time.Duration // then refilled at t0+after
		cost      float64
		wantWait  time.Duration
		wantLeft  int
		wantLimit int
		wantReset time.Duration
	}{
		{"full bucket admits", 60, time.Minute, 0, 0, 1, 0, 60, 60, 0},
		{"empty waits one refill step", 60, time.Minute, 60, 0, 1, time.Second, 0, 60, time.Minute},
		{"refills continuously", 60, time.Minute, 60, 500 * time.Millisecond, 1, 500 * time.Millisecond, 0, 60, 59500 * time.Millisecond},
		{"never above capacity", 60, time.Minute, 10, time.Hour, 60, 0, 60, 60, 0},
		{"token cost", 600, time.Minute, 600, 2 * time.Second, 50, 3 * time.Second, 20, 600, 58 * time.Second},
		{"one second holds limit/60", 120, time.Second, 0, 0, 2, 0, 2, 2, 0},
		{"one second refills at limit/60", 120, time.Second, 2, 0, 1, 500 * time.Millisecond, 0, 2, time.Second},
		{"one second never above its share", 120, time.Second, 1, time.Hour, 2, 0, 2, 2, 0},
		{"cost above capacity waits for a full bucket", 60000, time.Second, 400, 0, 5000, 400 * time.Millisecond, 600, 1000, 400 * time.Millisecond},
		{"debt is refilled before the bucket admits again", 60000, time.Second, 5000, 0, 10, 4010 * time.Millisecond, 0, 1000, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBucket(tt.perMinute, tt.window, 0, t0)
			b.take(tt.take)
			b.refill(t0.Add(tt.after))
			if got := b.wait(tt.cost); got != tt.wantWait {
				t.Errorf("wait = %s, want %s", got, tt.wantWait)
			}
			st := b.state()
			if st.remaining != tt.wantLeft || st.reset != tt.wantReset || st.limit != tt.wantLimit {
				t.Errorf("state = %+v, want remaining %d reset %s limit %d", st, tt.wantLeft, tt.wantReset, tt.wantLimit)
			}
		})
	}
	if b := newBucket(0, time.Second, 1, t0); b != nil || b.wait(1e9) != 0 || !b.fits(1e9) || b.state().limited {
		t.Error("a zero limit must be an unlimited (nil) bucket")
	}
	if b := newBucket(3, time.Second, 1, t0); b.capacity != 1 || b.rate != 0.05 {
		t.Errorf("3 RPM over 1 s = capacity %v rate %v, want the floor of 1 at 0.05/s", b.capacity, b.rate)
	}
}

func TestRPMBucketClaude(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 3}, Window: time.Minute})
	for range 3 {
		wantStatus(t, b.claude(t, "k", claudeText("hi", 10)), http.StatusOK)
	}
	r := b.claude(t, "k", claudeText("hi", 10))
	wantStatus(t, r, http.StatusTooManyRequests)
	var e anthropicErrorBody
	r.decode(t, &e)
	if e.Type != "error" || e.Error.Type != "rate_limit_error" || !strings.Contains(e.Error.Message, "3 requests per minute") || e.Error.Details != nil {
		t.Errorf("body = %s", r.body)
	}
	// 3 RPM refill one request every 20 s.
	if got := r.header.Get("retry-after"); got != "20" {
		t.Errorf("retry-after = %q, want 20", got)
	}
	if r.header.Get("anthropic-ratelimit-requests-remaining") != "0" || r.header.Get("anthropic-ratelimit-requests-limit") != "3" ||
		r.header.Get("anthropic-ratelimit-requests-reset") != "2026-03-01T12:01:00Z" || r.header.Get("request-id") == "" {
		t.Errorf("429 headers = %v", r.header)
	}
	if r.header.Get("anthropic-ratelimit-tokens-limit") != "" {
		t.Errorf("unlimited TPM sent tokens headers: %v", r.header)
	}

	b.clock.Advance(19 * time.Second)
	r = b.claude(t, "k", claudeText("hi", 10))
	wantStatus(t, r, http.StatusTooManyRequests)
	if got := r.header.Get("retry-after"); got != "1" { // 1 s left, rounded up
		t.Errorf("retry-after after 19 s = %q, want 1", got)
	}
	b.clock.Advance(time.Second)
	wantStatus(t, b.claude(t, "k", claudeText("hi", 10)), http.StatusOK)

	st := b.srv.Stats().Keys[Fingerprint("k")]
	if st.Requests != 6 || st.OK != 4 || st.RateLimited != 2 {
		t.Errorf("stats = %+v, want 6 requests, 4 ok, 2 rate limited", st)
	}
}

func TestRPMBucketOpenAI(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 4, TPM: 100000}, Window: time.Minute})
	for range 4 {
		wantStatus(t, b.chat(t, "k", chatText("hi", 10)), http.StatusOK)
	}
	b.clock.Advance(7500 * time.Millisecond) // half a request back: 7.5 s of 15 s
	r := b.chat(t, "k", chatText("hi", 10))
	wantStatus(t, r, http.StatusTooManyRequests)
	var e openAIErrorBody
	r.decode(t, &e)
	if e.Error.Type != "requests" || deref(e.Error.Code) != "rate_limit_exceeded" || e.Error.Param != nil ||
		!strings.Contains(e.Error.Message, "Rate limit reached for gpt-test") ||
		!strings.Contains(e.Error.Message, "on requests per min (RPM): Limit 4, Used 4, Requested 1.") ||
		!strings.Contains(e.Error.Message, "Please try again in 7.5s.") {
		t.Errorf("body = %s", r.body)
	}
	want := map[string]string{
		"retry-after":                    "8",
		"retry-after-ms":                 "7500",
		"x-ratelimit-limit-requests":     "4",
		"x-ratelimit-remaining-requests": "0",
		"x-ratelimit-reset-requests":     "52.5s",
		"x-ratelimit-limit-tokens":       "100000",
		"x-ratelimit-remaining-tokens":   "100000", // 4 small calls long refilled
	}
	for name, v := range want {
		if got := r.header.Get(name); got != v {
			t.Errorf("header %s = %q, want %q", name, got, v)
		}
	}
}

func TestTPMBucketAdmissionAndCreditBack(t *testing.T) {
	t.Parallel()
	const tpm = 600 // 10 tokens/s
	b := setup(t, Config{DefaultLimits: Limits{TPM: tpm}, Window: time.Minute})
	prompt := strings.Repeat("x", 40) // 10 input tokens
	in, out := CountTokens(prompt), CountTokens(Reply(prompt))

	r := b.claude(t, "k", claudeText(prompt, 100))
	wantStatus(t, r, http.StatusOK)
	// Charged in+100 at admission, 100-out credited back after.
	left := tpm - in - out
	if got := r.headerInt(t, "anthropic-ratelimit-tokens-remaining"); got != left {
		t.Fatalf("tokens remaining = %d, want %d (credit-back of unused max_tokens)", got, left)
	}

	// A request costing more than is left waits for the shortfall.
	maxTokens := left - in + 25 // 25 tokens short
	r = b.claude(t, "k", claudeText(prompt, maxTokens))
	wantStatus(t, r, http.StatusTooManyRequests)
	if got := r.header.Get("retry-after"); got != "3" { // 25 tokens at 10/s = 2.5 s, rounded up
		t.Errorf("retry-after = %q, want 3", got)
	}
	var e anthropicErrorBody
	r.decode(t, &e)
	if !strings.Contains(e.Error.Message, "600 tokens per minute") {
		t.Errorf("message = %q", e.Error.Message)
	}
	// Nothing was charged by the 429.
	if got := r.headerInt(t, "anthropic-ratelimit-tokens-remaining"); got != left {
		t.Errorf("tokens remaining after 429 = %d, want %d", got, left)
	}

	b.clock.Advance(2 * time.Second)
	wantStatus(t, b.claude(t, "k", claudeText(prompt, maxTokens)), http.StatusTooManyRequests)
	b.clock.Advance(500 * time.Millisecond)
	r = b.claude(t, "k", claudeText(prompt, maxTokens))
	wantStatus(t, r, http.StatusOK)
	// The bucket held exactly in+maxTokens; out of it only out was used.
	if got := r.headerInt(t, "anthropic-ratelimit-tokens-remaining"); got != maxTokens-out {
		t.Errorf("tokens remaining = %d, want %d", got, maxTokens-out)
	}
}

func TestTPMBucketOpenAI(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{TPM: 1200}, Window: time.Minute}) // 20 tokens/s
	prompt := strings.Repeat("y", 400)                                           // 100 tokens

	wantStatus(t, b.chat(t, "k", chatText(prompt, 1000)), http.StatusOK)
	// OpenAI keeps what it charged at admission, 100 + 1000, although the
	// answer used only a few of the 1000.
	left := 1200 - 100 - 1000
	r := b.chat(t, "k", chatText(prompt, 1000))
	wantStatus(t, r, http.StatusTooManyRequests)
	short := 1100 - left
	var e openAIErrorBody
	r.decode(t, &e)
	wantWait := msFor(short, 20)
	if e.Error.Type != "tokens" || !strings.Contains(e.Error.Message, "on tokens per min (TPM): Limit 1200, Used "+itoa(1200-left)+", Requested 1100.") ||
		!strings.Contains(e.Error.Message, "Please try again in "+formatOpenAIDuration(wantWait)+".") {
		t.Errorf("body = %s", r.body)
	}
	if got, want := r.header.Get("retry-after-ms"), itoa(int(retryAfterMillis(wantWait))); got != want {
		t.Errorf("retry-after-ms = %q, want %q", got, want)
	}
	if got := r.headerInt(t, "x-ratelimit-remaining-tokens"); got != left {
		t.Errorf("remaining tokens = %d, want %d", got, left)
	}
}

func TestRequestTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{TPM: 100}})
	r := b.claude(t, "k", claudeText("hi", 200))
	wantStatus(t, r, http.StatusTooManyRequests)
	if r.header.Get("retry-after") != "" || !strings.Contains(string(r.body), "even with the limit fully available") {
		t.Errorf("claude too-large: retry-after %q body %s", r.header.Get("retry-after"), r.body)
	}
	r = b.chat(t, "k", chatText("hi", 200))
	wantStatus(t, r, http.StatusTooManyRequests)
	var e openAIErrorBody
	r.decode(t, &e)
	if r.header.Get("retry-after") != "" || e.Error.Type != "tokens" || !strings.HasPrefix(e.Error.Message, "Request too large for gpt-test") {
		t.Errorf("openai too-large: retry-after %q body %s", r.header.Get("retry-after"), r.body)
	}
	// Nothing was charged.
	if got := r.headerInt(t, "x-ratelimit-remaining-tokens"); got != 100 {
		t.Errorf("remaining = %d, want 100", got)
	}
}

func TestLimitsPerKeyAndEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{
		DefaultLimits: Limits{RPM: 1},
		Keys:          map[string]Limits{"big": {RPM: 300}, "free": {}}, // 300 RPM: 5 a second
	})
	wantStatus(t, b.claude(t, "small", claudeText("x", 5)), http.StatusOK)
	wantStatus(t, b.claude(t, "small", claudeText("x", 5)), http.StatusTooManyRequests)
	// The same key has its own buckets on the other endpoints.
	wantStatus(t, b.chat(t, "small", chatText("x", 5)), http.StatusOK)
	wantStatus(t, b.embed(t, "small", map[string]any{"model": "e", "input": "x"}), http.StatusOK)
	wantStatus(t, b.embed(t, "small", map[string]any{"model": "e", "input": "x"}), http.StatusTooManyRequests)
	// Another key is untouched; a listed key has its own limits.
	wantStatus(t, b.claude(t, "other", claudeText("x", 5)), http.StatusOK)
	for range 5 {
		wantStatus(t, b.claude(t, "big", claudeText("x", 5)), http.StatusOK)
	}
	wantStatus(t, b.claude(t, "big", claudeText("x", 5)), http.StatusTooManyRequests)
	for range 20 {
		r := b.claude(t, "free", claudeText("x", 5))
		wantStatus(t, r, http.StatusOK)
		if r.header.Get("anthropic-ratelimit-requests-limit") != "" {
			t.Fatalf("unlimited key sent rate-limit headers: %v", r.header)
		}
	}
}

func TestConcurrentAdmissionIsExact(t *testing.T) {
	t.Parallel()
	const perWindow, callers = 25, 100
	b := setup(t, Config{DefaultLimits: Limits{RPM: 60 * perWindow}}) // 25 in the default 1 s window
	var wg sync.WaitGroup
	statuses := make(chan int, callers)
	for i := range callers {
		wg.Go(func() {
			if i%2 == 0 {
				statuses <- b.claude(t, "shared", claudeText("x", 5)).status
			} else {
				statuses <- b.claude(t, "shared", claudeText("y", 5)).status
			}
		})
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	if count[200] != perWindow || count[429] != callers-perWindow {
		t.Errorf("statuses = %v, want %d × 200 and %d × 429", count, perWindow, callers-perWindow)
	}
}

func TestResetRefillsAndZeroes(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 1}})
	wantStatus(t, b.claude(t, "k", claudeText("x", 5)), http.StatusOK)
	wantStatus(t, b.claude(t, "k", claudeText("x", 5)), http.StatusTooManyRequests)
	wantStatus(t, b.do(t, http.MethodPost, "/mock/reset", nil, nil), http.StatusNoContent)
	if st := b.srv.Stats(); len(st.Keys) != 0 || len(st.Providers) != 0 {
		t.Errorf("stats after reset = %+v, want empty", st)
	}
	wantStatus(t, b.claude(t, "k", claudeText("x", 5)), http.StatusOK)
}
