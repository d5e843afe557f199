package mockprovider

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestReply(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("ö", 70) // 2 bytes a rune
	tests := []struct {
		prompt, want string
	}{
		{"", "mock answer e3b0c44298fc: "},
		{"hello", "mock answer 2cf24dba5fb0: hello"},
		{long, "mock answer " + sha12(long) + ": " + strings.Repeat("ö", 60)},
	}
	for _, tt := range tests {
		if got := Reply(tt.prompt); got != tt.want {
			t.Errorf("Reply(%.10q) = %q, want %q", tt.prompt, got, tt.want)
		}
	}
	if Reply("a") == Reply("b") {
		t.Error("different prompts, same reply")
	}
}

func sha12(s string) string { return Reply(s)[len("mock answer ") : len("mock answer ")+12] }

func TestCountTokensAndTruncation(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		s    string
		want int
	}{{"", 1}, {"a", 1}, {"abcd", 1}, {"abcde", 2}, {strings.Repeat("x", 400), 100}, {"ööö", 2}} {
		if got := CountTokens(tt.s); got != tt.want {
			t.Errorf("CountTokens(%q) = %d, want %d", tt.s, got, tt.want)
		}
	}
	// Cutting at max_tokens*4 bytes never splits a rune.
	for n := range 12 {
		cut := truncateBytes("ööööö€€", n)
		if !utf8.ValidString(cut) || len(cut) > n {
			t.Errorf("truncateBytes(_, %d) = %q", n, cut)
		}
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := Fingerprint("sk-ant-secret-value")
	if len(fp) != 13 || !strings.HasPrefix(fp, "fp_") || fp == Fingerprint("sk-ant-secret-valuf") || fp != Fingerprint("sk-ant-secret-value") {
		t.Errorf("Fingerprint = %q", fp)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	const keyA, keyB = "sk-ant-key-AAAA-secret", "sk-openai-key-BBBB-secret"
	b := setup(t, Config{Keys: map[string]Limits{keyA: {RPM: 2}}, Window: time.Minute})
	wantStatus(t, b.claude(t, keyA, claudeText("one", 100)), 200)
	wantStatus(t, b.claude(t, keyA, claudeText("two", 100)), 200)
	wantStatus(t, b.claude(t, keyA, claudeText("three", 100)), 429)
	wantStatus(t, b.claude(t, keyA, map[string]any{"model": "m"}), 400)
	wantStatus(t, b.chat(t, keyB, chatText("four", 100)), 200)
	wantStatus(t, b.embed(t, keyB, map[string]any{"model": "e", "input": []string{"a", "b"}}), 200)
	if err := b.srv.SetFault(Fault{Provider: "openai", Mode: FaultOverloaded, Count: 1}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, b.chat(t, keyB, chatText("five", 100)), 503)
	wantStatus(t, b.chat(t, "", chatText("six", 100)), 401)

	outA := int64(CountTokens(Reply("one")) + CountTokens(Reply("two")))
	inA := int64(CountTokens("one") + CountTokens("two"))
	// One call at a time: each admitted call is out of flight before its
	// client has the answer.
	a := Counters{Requests: 4, OK: 2, RateLimited: 1, Invalid: 1, InputTokens: inA, OutputTokens: outA, MaxInFlight: 1}
	bb := Counters{Requests: 3, OK: 2, Injected: map[FaultMode]int64{FaultOverloaded: 1},
		InputTokens: int64(CountTokens("four") + 2), OutputTokens: int64(CountTokens(Reply("four"))), Embeddings: 1, EmbeddingInputs: 2,
		MaxInFlight: 1}
	openai := bb
	openai.Unauthorized = 1
	want := Stats{
		Keys:        map[string]Counters{Fingerprint(keyA): a, Fingerprint(keyB): bb},
		Providers:   map[string]Counters{"claude": a, "openai": openai},
		MaxInFlight: 1,
	}
	if diff := cmp.Diff(want, b.srv.Stats()); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
	total := b.srv.Stats().Total()
	if total.Requests != 7 || total.OK != 4 || total.Unauthorized != 1 || total.MaxInFlight != 1 || total.InFlight != 0 {
		t.Errorf("Total = %+v", total)
	}

	// Over HTTP: the same numbers, and no key value anywhere.
	r := b.do(t, http.MethodGet, "/mock/stats", nil, nil)
	wantStatus(t, r, http.StatusOK)
	var got Stats
	r.decode(t, &got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GET /mock/stats (-want +got):\n%s", diff)
	}
	for _, secret := range []string{"AAAA", "BBBB", "secret"} {
		if strings.Contains(string(r.body), secret) {
			t.Errorf("stats JSON contains %q: %s", secret, r.body)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg   Config
		field string
	}{
		{Config{Latency: -1}, "Config.Latency"},
		{Config{LatencyJitter: -1}, "Config.LatencyJitter"},
		{Config{DefaultLimits: Limits{RPM: -1}}, "Config.DefaultLimits.RPM"},
		{Config{Keys: map[string]Limits{"sk-secret": {TPM: -5}}}, "TPM"},
		{Config{Keys: map[string]Limits{"": {}}}, "Config.Keys"},
		{Config{EmbeddingDims: EmbeddingDimsMax + 1}, "Config.EmbeddingDims"},
		{Config{Window: -time.Second}, "Config.Window -1s"},
		{Config{Window: 2 * time.Minute}, "Config.Window 2m0s"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tt.cfg, err, tt.field)
		}
		if err != nil && strings.Contains(err.Error(), "sk-secret") {
			t.Errorf("error leaks a key: %v", err)
		}
	}
	if _, err := New(Config{}); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	if _, err := New(Config{Window: WindowMax}); err != nil {
		t.Errorf("Window = WindowMax: %v", err)
	}
}

// A key at its MaxConcurrent calls (a local model server's parallel slots)
// is refused at once with 503 and Ollama's "server busy" text, counted as
// Busy, not as a rate limit.
func TestMaxConcurrentRefusesBusy(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Keys: map[string]Limits{"local-key": {MaxConcurrent: 1}}})
	b.srv.SetLatency(time.Hour) // the first call stays in flight until cancelled
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"slow"}],"max_tokens":10}`))
		req.Header.Set("Authorization", "Bearer local-key")
		req.Header.Set("Content-Type", "application/json")
		if resp, err := b.client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the first call in flight", func() bool { return b.srv.Stats().Keys[Fingerprint("local-key")].InFlight == 1 })
	r := b.chat(t, "local-key", chatText("second", 10))
	wantStatus(t, r, http.StatusServiceUnavailable)
	if !strings.Contains(string(r.body), "server busy") {
		t.Fatalf("busy answer: %s", r.body)
	}
	if st := b.srv.Stats().Keys[Fingerprint("local-key")]; st.Busy != 1 || st.RateLimited != 0 {
		t.Fatalf("stats %+v", st)
	}
	cancel()
	<-done
}
