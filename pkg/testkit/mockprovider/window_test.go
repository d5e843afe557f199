package mockprovider

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// At 120 RPM the default 1 s window holds 2 requests and refills one every
// 500 ms, while the headers keep reporting the per-minute budget.
func TestDefaultWindowQuantizesRPM(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 120}})
	for range 2 {
		wantStatus(t, b.chat(t, "k", chatText("hi", 10)), http.StatusOK)
	}
	r := b.chat(t, "k", chatText("hi", 10))
	wantStatus(t, r, http.StatusTooManyRequests)
	want := map[string]string{
		"retry-after":                    "1",
		"retry-after-ms":                 "500",
		"x-ratelimit-limit-requests":     "120",
		"x-ratelimit-remaining-requests": "118", // the minute's budget is far from spent
		"x-ratelimit-reset-requests":     "1s",
	}
	for name, v := range want {
		if got := r.header.Get(name); got != v {
			t.Errorf("header %s = %q, want %q", name, got, v)
		}
	}
	var e openAIErrorBody
	r.decode(t, &e)
	if !strings.Contains(e.Error.Message, "on requests per min (RPM): Limit 120, Used 2, Requested 1. Please try again in 500ms.") {
		t.Errorf("message = %q", e.Error.Message)
	}

	b.clock.Advance(250 * time.Millisecond) // half a request back
	r = b.chat(t, "k", chatText("hi", 10))
	wantStatus(t, r, http.StatusTooManyRequests)
	if got := r.header.Get("retry-after-ms"); got != "250" {
		t.Errorf("retry-after-ms 250 ms later = %q, want 250", got)
	}
	b.clock.Advance(250 * time.Millisecond)
	wantStatus(t, b.chat(t, "k", chatText("hi", 10)), http.StatusOK)
	wantStatus(t, b.chat(t, "k", chatText("hi", 10)), http.StatusTooManyRequests)

	st := b.srv.Stats().Keys[Fingerprint("k")]
	if st.OK != 3 || st.RateLimited != 3 {
		t.Errorf("stats = %+v, want 3 ok and 3 rate limited", st)
	}
}

func TestDefaultWindowAnthropicHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 120}})
	for range 2 {
		wantStatus(t, b.claude(t, "k", claudeText("hi", 10)), http.StatusOK)
	}
	r := b.claude(t, "k", claudeText("hi", 10))
	wantStatus(t, r, http.StatusTooManyRequests)
	want := map[string]string{
		"retry-after":                            "1", // 500 ms, rounded up
		"anthropic-ratelimit-requests-limit":     "120",
		"anthropic-ratelimit-requests-remaining": "118",
		"anthropic-ratelimit-requests-reset":     "2026-03-01T12:00:01Z",
	}
	for name, v := range want {
		if got := r.header.Get(name); got != v {
			t.Errorf("header %s = %q, want %q", name, got, v)
		}
	}
	var e anthropicErrorBody
	r.decode(t, &e)
	if !strings.Contains(e.Error.Message, "120 requests per minute") {
		t.Errorf("message = %q", e.Error.Message)
	}
}

// Window: time.Minute is the unquantized bucket: the whole RPM at once.
func TestMinuteWindowAllowsWholeBurst(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 120}, Window: time.Minute})
	for range 120 {
		wantStatus(t, b.claude(t, "k", claudeText("hi", 10)), http.StatusOK)
	}
	r := b.claude(t, "k", claudeText("hi", 10))
	wantStatus(t, r, http.StatusTooManyRequests)
	if r.header.Get("retry-after") != "1" || r.header.Get("anthropic-ratelimit-requests-remaining") != "0" {
		t.Errorf("121st: retry-after %q remaining %q, want 1 and 0",
			r.header.Get("retry-after"), r.header.Get("anthropic-ratelimit-requests-remaining"))
	}
}

// A request above the window's token share but within TPM passes on a full
// bucket and leaves a debt that later requests wait out.
func TestTokenWindowDebt(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{TPM: 60000}})                 // 1,000 tokens a 1 s window, 1/ms
	small := map[string]any{"model": "e", "input": "x"}                      // 1 token
	big := map[string]any{"model": "e", "input": strings.Repeat("x", 20000)} // 5,000 tokens

	wantStatus(t, b.embed(t, "k", small), http.StatusOK)
	r := b.embed(t, "k", big)
	wantStatus(t, r, http.StatusTooManyRequests) // 999 left: it waits for a full bucket
	if got := r.header.Get("retry-after-ms"); got != "1" {
		t.Errorf("big on a 999/1000 bucket: retry-after-ms %q, want 1", got)
	}
	b.clock.Advance(time.Millisecond)
	r = b.embed(t, "k", big)
	wantStatus(t, r, http.StatusOK)
	if got := r.headerInt(t, "x-ratelimit-remaining-tokens"); got != 55000 {
		t.Errorf("remaining after the big call = %d, want 55000", got)
	}

	r = b.embed(t, "k", small)
	wantStatus(t, r, http.StatusTooManyRequests) // 4,000 tokens of debt, then 1
	want := map[string]string{
		"retry-after":                  "5",
		"retry-after-ms":               "4001",
		"x-ratelimit-limit-tokens":     "60000",
		"x-ratelimit-remaining-tokens": "55000",
		"x-ratelimit-reset-tokens":     "5s",
	}
	for name, v := range want {
		if got := r.header.Get(name); got != v {
			t.Errorf("header %s = %q, want %q", name, got, v)
		}
	}
	b.clock.Advance(4 * time.Second)
	wantStatus(t, b.embed(t, "k", small), http.StatusTooManyRequests)
	b.clock.Advance(time.Millisecond)
	wantStatus(t, b.embed(t, "k", small), http.StatusOK)

	// Above TPM itself no wait helps.
	r = b.embed(t, "k", map[string]any{"model": "e", "input": strings.Repeat("x", 240004)})
	wantStatus(t, r, http.StatusTooManyRequests)
	if r.header.Get("retry-after") != "" || !strings.Contains(string(r.body), "Request too large") {
		t.Errorf("above TPM: retry-after %q body %s", r.header.Get("retry-after"), r.body)
	}
}

// The in-flight gauges count admitted calls until their answer is written,
// per key, per provider and overall, and Reset restarts the maxima from the
// calls still running.
func TestInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.srv.SetLatency(time.Hour) // held until their clients give up
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	hold := func(path string, header map[string]string, body any) {
		raw := mustJSON(t, body)
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+path, strings.NewReader(raw))
			if err != nil {
				t.Errorf("new request: %v", err)
				return
			}
			for k, v := range header {
				req.Header.Set(k, v)
			}
			if resp, err := b.client.Do(req); err == nil {
				resp.Body.Close()
				t.Errorf("%s answered %d while held", path, resp.StatusCode)
			}
		})
	}
	for range 3 {
		hold("/v1/messages", claudeHeaders("a"), claudeText("x", 5))
	}
	hold("/v1/chat/completions", openAIHeaders("b"), chatText("y", 5))
	waitFor(t, "4 calls in flight", func() bool { return b.srv.Stats().InFlight == 4 })

	st := b.srv.Stats()
	fa, fb := Fingerprint("a"), Fingerprint("b")
	if st.MaxInFlight != 4 || st.Keys[fa].InFlight != 3 || st.Keys[fa].MaxInFlight != 3 || st.Keys[fb].MaxInFlight != 1 ||
		st.Providers["claude"].MaxInFlight != 3 || st.Providers["openai"].InFlight != 1 || st.Total().MaxInFlight != 4 {
		t.Errorf("stats while held = %+v", st)
	}
	b.srv.Reset()
	if st := b.srv.Stats(); st.InFlight != 4 || st.MaxInFlight != 4 || st.Keys[fa].Requests != 0 || st.Keys[fa].MaxInFlight != 3 {
		t.Errorf("stats after a reset with calls running = %+v", st)
	}

	cancel()
	wg.Wait()
	waitFor(t, "the abandoned calls to land", func() bool { return b.srv.Stats().InFlight == 0 })
	r := b.do(t, http.MethodGet, "/mock/stats", nil, nil)
	var got Stats
	r.decode(t, &got)
	if got.MaxInFlight != 4 || got.Keys[fa].MaxInFlight != 3 || got.Keys[fa].InFlight != 0 ||
		!strings.Contains(string(r.body), `"max_in_flight":4`) {
		t.Errorf("GET /mock/stats after landing = %s", r.body)
	}

	b.srv.Reset()
	b.srv.SetLatency(0)
	wantStatus(t, b.claude(t, "a", claudeText("x", 5)), http.StatusOK)
	if st := b.srv.Stats(); st.MaxInFlight != 1 || st.InFlight != 0 || len(st.Keys) != 1 {
		t.Errorf("stats after an idle reset and one call = %+v", st)
	}
}
