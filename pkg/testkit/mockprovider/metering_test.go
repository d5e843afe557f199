package mockprovider

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestOpenAIKeepsAdmissionCharge: an OpenAI or Azure call costs prompt +
// max_tokens at admission and gets nothing back after the answer (OpenAI
// documents no refund), unless Config.RefundOpenAI; the headers report it.
func TestOpenAIKeepsAdmissionCharge(t *testing.T) {
	t.Parallel()
	prompt := strings.Repeat("y", 400) // 100 tokens
	out := CountTokens(Reply(prompt))
	tests := []struct {
		name   string
		refund bool
		send   func(t *testing.T, b *bundle) reply
		want   int
	}{
		{"openai", false, func(t *testing.T, b *bundle) reply { return b.chat(t, "k", chatText(prompt, 1000)) }, 60000 - 100 - 1000},
		{"azure", false, func(t *testing.T, b *bundle) reply { return b.azure(t, "gpt4o", "k", chatText(prompt, 1000)) }, 60000 - 100 - 1000},
		{"openai refund", true, func(t *testing.T, b *bundle) reply { return b.chat(t, "k", chatText(prompt, 1000)) }, 60000 - 100 - out},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{DefaultLimits: Limits{TPM: 60000}, Window: time.Minute, RefundOpenAI: tt.refund})
			r := tt.send(t, b)
			wantStatus(t, r, http.StatusOK)
			if got := r.headerInt(t, "x-ratelimit-remaining-tokens"); got != tt.want {
				t.Errorf("x-ratelimit-remaining-tokens = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestOpenAIAbandonedCallKeepsCharge: a client that gives up before the
// answer leaves OpenAI's admission charge in place (Anthropic gives the
// output reservation back: TestLatency).
func TestOpenAIAbandonedCallKeepsCharge(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{TPM: 60000}, Window: time.Minute, Latency: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/chat/completions",
		strings.NewReader(mustJSON(t, chatText(strings.Repeat("y", 400), 1000)))) // 100 + 1000 tokens
	req.Header.Set("Authorization", "Bearer k")
	if _, err := b.client.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	fp := Fingerprint("k")
	waitFor(t, "the abandoned request to settle", func() bool { return b.srv.Stats().Keys[fp].Requests == 1 })
	b.srv.SetLatency(0)
	r := b.chat(t, "k", chatText("x", 1))
	wantStatus(t, r, http.StatusOK)
	if got, want := r.headerInt(t, "x-ratelimit-remaining-tokens"), 60000-1100-2; got != want {
		t.Errorf("remaining = %d, want %d (the abandoned call's 1100 still counted)", got, want)
	}
}

// TestAnthropicInputOutputBuckets: with ITPM and OTPM a key meters input
// and output separately, as Anthropic does: input_tokens from the input
// bucket, max_tokens from the output bucket at admission, adjusted to the
// real output after the answer; the headers report each bucket, and
// tokens-* the most restrictive one.
func TestAnthropicInputOutputBuckets(t *testing.T) {
	t.Parallel()
	// Whole-minute buckets: ITPM 6000 refills 100/s, OTPM 1200 20/s.
	b := setup(t, Config{DefaultLimits: Limits{ITPM: 6000, OTPM: 1200}, Window: time.Minute})
	prompt := strings.Repeat("z", 400) // 100 tokens
	out := CountTokens(Reply(prompt))

	r := b.claude(t, "k", claudeText(prompt, 1000))
	wantStatus(t, r, http.StatusOK)
	for name, want := range map[string]int{
		"anthropic-ratelimit-input-tokens-limit":      6000,
		"anthropic-ratelimit-input-tokens-remaining":  6000 - 100,
		"anthropic-ratelimit-output-tokens-limit":     1200,
		"anthropic-ratelimit-output-tokens-remaining": 1200 - out, // 1000 reserved, all but out given back
		"anthropic-ratelimit-tokens-limit":            1200,       // the tighter bucket
		"anthropic-ratelimit-tokens-remaining":        1200 - out,
	} {
		if got := r.headerInt(t, name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}

	// 1000 more output tokens do not fit the output bucket, although the
	// input bucket has room: 429 naming output tokens, nothing charged.
	r = b.claude(t, "k", claudeText(prompt, 1200-out+20))
	wantStatus(t, r, http.StatusTooManyRequests)
	var e anthropicErrorBody
	r.decode(t, &e)
	if !strings.Contains(e.Error.Message, "1200 output tokens per minute") {
		t.Errorf("message = %q", e.Error.Message)
	}
	if got := r.header.Get("retry-after"); got != "1" { // 20 tokens at 20/s
		t.Errorf("retry-after = %q, want 1", got)
	}
	if got := r.headerInt(t, "anthropic-ratelimit-input-tokens-remaining"); got != 6000-100 {
		t.Errorf("input remaining after 429 = %d, want %d", got, 6000-100)
	}
	b.clock.Advance(time.Second)
	wantStatus(t, b.claude(t, "k", claudeText(prompt, 1200-out+20)), http.StatusOK)

	// Only the Messages API splits input and output: the same key on Chat
	// Completions has neither limit (and this key no TPM).
	r = b.chat(t, "k", chatText(prompt, 5000))
	wantStatus(t, r, http.StatusOK)

	// max_tokens above OTPM itself never fits.
	r = b.claude(t, "k", claudeText(prompt, 1201))
	wantStatus(t, r, http.StatusTooManyRequests)
	if r.header.Get("retry-after") != "" {
		t.Errorf("too large: retry-after %q", r.header.Get("retry-after"))
	}
}
