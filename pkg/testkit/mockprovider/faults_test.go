package mockprovider

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// waitFor polls cond until it holds; the mock offers no event for "a
// request is now hanging", only its counters.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFaultModes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		endpoint   string // claude, chat, embed
		fault      Fault
		status     int
		errType    string // Anthropic error.type / OpenAI error.type
		code       string // Anthropic error.details.error_code / OpenAI error.code
		retryAfter string
		retryMS    string
		msg        string
	}{
		{"claude rate_limit", "claude", Fault{Mode: FaultRateLimit, RetryAfter: 2500 * time.Millisecond}, 429, "rate_limit_error", "", "3", "", "rate limit"},
		{"claude rate_limit default", "claude", Fault{Mode: FaultRateLimit}, 429, "rate_limit_error", "", "1", "", "rate limit"},
		{"claude overloaded", "claude", Fault{Mode: FaultOverloaded}, 529, "overloaded_error", "", "", "", "Overloaded"},
		{"claude overloaded retry-after", "claude", Fault{Mode: FaultOverloaded, RetryAfter: 5 * time.Second}, 529, "overloaded_error", "", "5", "", "Overloaded"},
		{"claude server_error", "claude", Fault{Mode: FaultServerError}, 500, "api_error", "", "", "", "Internal"},
		{"claude spend_limit", "claude", Fault{Mode: FaultSpendLimit}, 429, "rate_limit_error", "enforced_spend_limit_reached", "", "", "spend limit"},
		{"claude insufficient_quota", "claude", Fault{Mode: FaultInsufficientQuota}, 429, "rate_limit_error", "enforced_spend_limit_reached", "", "", "spend limit"},
		{"openai rate_limit", "chat", Fault{Mode: FaultRateLimit, RetryAfter: 1500 * time.Millisecond}, 429, "requests", "rate_limit_exceeded", "2", "1500", "Please try again in 1.5s."},
		{"openai overloaded", "chat", Fault{Mode: FaultOverloaded}, 503, "server_error", "", "", "", "overloaded"},
		{"openai server_error", "chat", Fault{Mode: FaultServerError, RetryAfter: time.Second}, 500, "server_error", "", "1", "1000", "error"},
		{"openai insufficient_quota", "chat", Fault{Mode: FaultInsufficientQuota}, 429, "insufficient_quota", "insufficient_quota", "", "", "quota"},
		{"openai spend_limit", "chat", Fault{Mode: FaultSpendLimit}, 429, "insufficient_quota", "insufficient_quota", "", "", "quota"},
		{"embeddings rate_limit", "embed", Fault{Mode: FaultRateLimit}, 429, "requests", "rate_limit_exceeded", "1", "1000", "rate"},
		{"claude invalid_request", "claude", Fault{Mode: FaultInvalidRequest}, 400, "invalid_request_error", "", "", "", "invalid"},
		{"openai invalid_request", "chat", Fault{Mode: FaultInvalidRequest}, 400, "invalid_request_error", "", "", "", "invalid"},
		{"claude message", "claude", Fault{Mode: FaultServerError, Message: "upstream org-x1 said no"}, 500, "api_error", "", "", "", "upstream org-x1 said no"},
		{"openai message", "chat", Fault{Mode: FaultInvalidRequest, Message: "bad key ab12"}, 400, "invalid_request_error", "", "", "", "bad key ab12"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// RPM 1: the fault must leave the one request for the call after.
			b := setup(t, Config{DefaultLimits: Limits{RPM: 1}})
			tt.fault.Count = 1
			if err := b.srv.SetFault(tt.fault); err != nil {
				t.Fatal(err)
			}
			send := func() reply {
				switch tt.endpoint {
				case "claude":
					return b.claude(t, "k", claudeText("x", 5))
				case "chat":
					return b.chat(t, "k", chatText("x", 5))
				}
				return b.embed(t, "k", map[string]any{"model": "e", "input": "x"})
			}
			r := send()
			wantStatus(t, r, tt.status)
			var typ, code, msg string
			if tt.endpoint == "claude" {
				var e anthropicErrorBody
				r.decode(t, &e)
				typ, msg = e.Error.Type, e.Error.Message
				if e.Error.Details != nil {
					code = e.Error.Details.ErrorCode
				}
				if e.Type != "error" || e.RequestID == "" {
					t.Errorf("body = %s", r.body)
				}
				if r.header.Get("anthropic-ratelimit-requests-remaining") != "1" {
					t.Errorf("fault answer lacks the untouched bucket's headers: %v", r.header)
				}
			} else {
				var e openAIErrorBody
				r.decode(t, &e)
				typ, code, msg = e.Error.Type, deref(e.Error.Code), e.Error.Message
				if code == "<nil>" {
					code = ""
				}
				if r.header.Get("x-ratelimit-remaining-requests") != "1" {
					t.Errorf("fault answer lacks the untouched bucket's headers: %v", r.header)
				}
			}
			if typ != tt.errType || code != tt.code || !strings.Contains(strings.ToLower(msg), strings.ToLower(tt.msg)) {
				t.Errorf("type %q code %q message %q, want %q %q containing %q", typ, code, msg, tt.errType, tt.code, tt.msg)
			}
			if got := r.header.Get("retry-after"); got != tt.retryAfter {
				t.Errorf("retry-after = %q, want %q", got, tt.retryAfter)
			}
			if got := r.header.Get("retry-after-ms"); got != tt.retryMS {
				t.Errorf("retry-after-ms = %q, want %q", got, tt.retryMS)
			}
			// Count 1 is used up, and the fault charged no bucket.
			wantStatus(t, send(), http.StatusOK)
			st := b.srv.Stats().Keys[Fingerprint("k")]
			if st.Injected[tt.fault.Mode] != 1 || st.RateLimited != 0 || st.OK != 1 || st.Requests != 2 {
				t.Errorf("stats = %+v", st)
			}
		})
	}
}

func TestFaultTargeting(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(b.srv.SetFault(Fault{Provider: "claude", KeyFingerprint: Fingerprint("bad"), Mode: FaultServerError}))
	must(b.srv.SetFault(Fault{Provider: "openai", Mode: FaultOverloaded, Count: 2}))

	for range 3 { // Count 0: until cleared
		wantStatus(t, b.claude(t, "bad", claudeText("x", 5)), 500)
	}
	wantStatus(t, b.claude(t, "good", claudeText("x", 5)), 200)
	wantStatus(t, b.chat(t, "bad", chatText("x", 5)), 503)
	wantStatus(t, b.embed(t, "good", map[string]any{"model": "e", "input": "x"}), 503)
	wantStatus(t, b.chat(t, "bad", chatText("x", 5)), 200) // the Count 2 fault is used up
	if f := b.srv.Faults(); len(f) != 1 || f[0].Mode != FaultServerError {
		t.Errorf("faults left = %+v, want only the claude one", f)
	}
	b.srv.ClearFaults()
	wantStatus(t, b.claude(t, "bad", claudeText("x", 5)), 200)

	if err := b.srv.SetFault(Fault{Mode: "explode"}); err == nil || !strings.Contains(err.Error(), "Fault.Mode") {
		t.Errorf("bad mode: err = %v", err)
	}
	if err := b.srv.SetFault(Fault{Provider: "gemini", Mode: FaultTimeout}); err == nil || !strings.Contains(err.Error(), "Fault.Provider") {
		t.Errorf("bad provider: err = %v", err)
	}
}

func TestFaultsOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	r := b.do(t, http.MethodPost, "/mock/faults", nil,
		`{"provider":"openai","key_fingerprint":"`+Fingerprint("k")+`","mode":"rate_limit","count":1,"retry_after":"2s"}`)
	wantStatus(t, r, http.StatusOK)
	var list struct{ Faults []Fault }
	r.decode(t, &list)
	want := Fault{Provider: "openai", KeyFingerprint: Fingerprint("k"), Mode: FaultRateLimit, Count: 1, RetryAfter: 2 * time.Second}
	if len(list.Faults) != 1 || list.Faults[0] != want {
		t.Fatalf("faults = %+v, want [%+v]", list.Faults, want)
	}
	r = b.chat(t, "k", chatText("x", 5))
	wantStatus(t, r, 429)
	if r.header.Get("retry-after") != "2" || r.header.Get("retry-after-ms") != "2000" {
		t.Errorf("retry-after %q / %q", r.header.Get("retry-after"), r.header.Get("retry-after-ms"))
	}

	wantStatus(t, b.do(t, http.MethodPost, "/mock/faults", nil, `{"mode":"server_error"}`), http.StatusOK)
	r = b.do(t, http.MethodGet, "/mock/faults", nil, nil)
	r.decode(t, &list)
	if len(list.Faults) != 1 || list.Faults[0].Mode != FaultServerError {
		t.Errorf("GET faults = %s", r.body)
	}
	wantStatus(t, b.do(t, http.MethodDelete, "/mock/faults", nil, nil), http.StatusNoContent)
	if len(b.srv.Faults()) != 0 {
		t.Error("DELETE left faults")
	}

	for _, bad := range []string{`{"mode":"nope"}`, `{"mode":"timeout","retry_after":"soon"}`, `{"mode":"timeout","colour":1}`, `{`} {
		if r := b.do(t, http.MethodPost, "/mock/faults", nil, bad); r.status != http.StatusBadRequest {
			t.Errorf("POST %s: status %d, want 400", bad, r.status)
		}
	}
}

func TestFaultTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.srv.SetFault(Fault{Provider: "claude", Mode: FaultTimeout}); err != nil {
		t.Fatal(err)
	}
	fp := Fingerprint("k")
	injected := func() int64 { return b.srv.Stats().Keys[fp].Injected[FaultTimeout] }

	// The client gives up: it gets its own deadline error, never an answer.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/messages", strings.NewReader(`{}`))
	req.Header.Set("x-api-key", "k")
	req.Header.Set("anthropic-version", "2023-06-01")
	_, err := b.client.Do(req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if injected() != 1 {
		t.Errorf("injected timeouts = %d, want 1", injected())
	}

	// Close releases a request hanging without a client deadline: its
	// connection is dropped.
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, b.url+"/v1/messages", strings.NewReader(`{}`))
		req.Header.Set("x-api-key", "k")
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := b.client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = errors.New("got an answer: " + resp.Status)
		}
		done <- err
	}()
	waitFor(t, "the second request to hang", func() bool { return injected() == 2 })
	b.srv.Close()
	if err := <-done; err == nil || strings.Contains(err.Error(), "got an answer") {
		t.Errorf("released request: err = %v, want a dropped connection", err)
	}
	b.srv.Close() // twice is fine
}

func TestLatency(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 60, TPM: 6000}, Window: time.Minute})
	r := b.do(t, http.MethodPost, "/mock/latency", nil, `{"latency":"40ms"}`)
	wantStatus(t, r, http.StatusOK)
	if m := r.json(t); m["latency"] != "40ms" || m["jitter"] != "0s" {
		t.Errorf("latency answer = %s", r.body)
	}
	start := time.Now()
	wantStatus(t, b.claude(t, "k", claudeText("x", 50)), http.StatusOK)
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Errorf("answer took %s, want >= 40ms", el)
	}
	// A client that gives up during the
	// latency gets all of its max_tokens back.
	b.srv.SetLatency(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/messages",
		strings.NewReader(mustJSON(t, claudeText("y", 1000))))
	req.Header.Set("x-api-key", "k")
	req.Header.Set("anthropic-version", "2023-06-01")
	if _, err := b.client.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	fp := Fingerprint("k")
	waitFor(t, "the abandoned request to settle", func() bool { return b.srv.Stats().Keys[fp].Requests == 2 })
	b.srv.SetLatency(0)
	r = b.claude(t, "k", claudeText("z", 50))
	wantStatus(t, r, http.StatusOK)
	// Three requests charged; tokens: three inputs of 1 and three outputs,
	// but nothing of the abandoned 1000.
	out := CountTokens(Reply("x")) + CountTokens(Reply("z"))
	if got := r.headerInt(t, "anthropic-ratelimit-tokens-remaining"); got != 6000-3-out {
		t.Errorf("tokens remaining = %d, want %d", got, 6000-3-out)
	}
	if got := r.headerInt(t, "anthropic-ratelimit-requests-remaining"); got != 57 {
		t.Errorf("requests remaining = %d, want 57", got)
	}
	if st := b.srv.Stats().Keys[fp]; st.OK != 2 || st.Requests != 3 {
		t.Errorf("stats = %+v", st)
	}

	for _, bad := range []string{`{}`, `{"latency":"-1s"}`, `{"jitter":"x"}`} {
		if r := b.do(t, http.MethodPost, "/mock/latency", nil, bad); r.status != http.StatusBadRequest {
			t.Errorf("POST latency %s: %d, want 400", bad, r.status)
		}
	}
}

func TestLatencyJitter(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Latency: 100 * time.Millisecond, LatencyJitter: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := time.Hour, time.Duration(0)
	for range 2000 {
		d := s.delay()
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 70*time.Millisecond || hi > 130*time.Millisecond || hi-lo < 40*time.Millisecond {
		t.Errorf("delays span [%s, %s], want spread within [70ms, 130ms]", lo, hi)
	}
	s.SetLatency(0)
	s.SetLatencyJitter(time.Second)
	for range 100 {
		if d := s.delay(); d < 0 {
			t.Fatalf("delay %s < 0", d)
		}
	}
}

func TestFaultJSONRoundTrip(t *testing.T) {
	t.Parallel()
	f := Fault{Provider: "claude", KeyFingerprint: "fp_0123456789", Mode: FaultSpendLimit, Count: 3, RetryAfter: 1500 * time.Millisecond,
		Message: "no"}
	raw, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != `{"provider":"claude","key_fingerprint":"fp_0123456789","mode":"spend_limit","count":3,"retry_after":"1.5s","message":"no"}` {
		t.Errorf("json = %s", raw)
	}
	var back Fault
	if err := json.Unmarshal(raw, &back); err != nil || back != f {
		t.Errorf("round trip = %+v, %v", back, err)
	}
}
