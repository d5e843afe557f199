package service_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/compactjson"
)

// A noisy tenant that has its share of the queue in flight gets 429 with
// Retry-After, and its retries of accepted requests still get their ids,
// while another tenant's requests are still admitted.
func TestNoisyTenantGetsItsShareOnly(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}",
		tenantYML: `{name: noisy, token: "noisy-token", max_priority: critical, max_queued: 3}`})
	api := s.startAPI() // no worker: what is accepted stays in flight
	var first string
	for i := range 3 {
		code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", "noisy-token", ask(fmt.Sprint("noisy ", i)), "Idempotency-Key", fmt.Sprint("n-", i))
		if code != http.StatusAccepted {
			t.Fatalf("noisy request %d within its share: %d %v", i, code, out)
		}
		if i == 0 {
			first = out["id"].(string)
		}
	}
	code, out, hdr := call(t, "POST", api.ts.URL+"/v1/requests", "noisy-token", ask("noisy 3"))
	errObj, _ := out["error"].(map[string]any)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" || errObj["type"] != "tenant_queue_full" ||
		!strings.Contains(fmt.Sprint(errObj["message"]), "3 requests in flight") {
		t.Fatalf("noisy request past its share: %d %v (Retry-After %q), want 429 tenant_queue_full", code, out, hdr.Get("Retry-After"))
	}
	if code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", "noisy-token", ask("noisy 0"), "Idempotency-Key", "n-0"); code/100 != 2 || out["id"] != first {
		t.Fatalf("a retry of an accepted request: %d %v, want its id %s", code, out, first)
	}
	if code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("meanwhile, another tenant")); code != http.StatusAccepted {
		t.Fatalf("the other tenant: %d %v, want 202", code, out)
	}
	if code, out, _ := call(t, "POST", api.ts.URL+"/v1/chat/completions", "noisy-token", map[string]any{"model": "gpt-4o",
		"messages": []map[string]any{{"role": "user", "content": "noisy compat"}}}); code != http.StatusTooManyRequests {
		t.Fatalf("noisy compat request past its share: %d %v, want 429", code, out)
	}
}

// Event streams per tenant are bounded on each API process; closing one
// makes room.
func TestTenantStreamLimit(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}",
		tenantYML: `{name: watcher, token: "watcher-token", max_priority: critical, max_streams: 1}`})
	api := s.startAPI()
	_, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", "watcher-token", ask("watch me"))
	id := out["id"].(string)
	ch, stop := stream(t, api.ts.URL+"/v1/requests/"+id+"/events", "watcher-token", "")
	next(t, ch, 5*time.Second, "queued")
	code, out, hdr := call(t, "GET", api.ts.URL+"/v1/requests/"+id+"/events", "watcher-token", nil)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("a second stream: %d %v, want 429 with Retry-After", code, out)
	}
	stop()
	// The first stream's handler notices the close and leaves its place.
	waitFor(t, 5*time.Second, "room for a stream once the first closed", func() bool {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", api.ts.URL+"/v1/requests/"+id+"/events", nil)
		req.Header.Set("Authorization", "Bearer watcher-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// What a caller attaches besides the prompt is bounded: an oversized
// Idempotency-Key, case id or metadata, or a control character in one, is
// a 422 that names the field.
func TestLabelsAreBounded(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	meta := map[string]any{}
	for i := range 17 {
		meta[fmt.Sprint("k", i)] = "v"
	}
	for _, tt := range []struct {
		name  string
		body  map[string]any
		hdr   []string
		field string
	}{
		{"long idempotency key", ask("a"), []string{"Idempotency-Key", strings.Repeat("k", 256)}, "Idempotency-Key"},
		{"control character in the idempotency key", ask("a"), []string{"Idempotency-Key", "a\tb"}, "Idempotency-Key"},
		{"long case id", withField(ask("a"), "case_id", strings.Repeat("c", 129)), nil, "case_id"},
		{"too much metadata", withField(ask("a"), "metadata", meta), nil, "metadata"},
		{"long metadata value", withField(ask("a"), "metadata", map[string]any{"k": strings.Repeat("v", 513)}), nil, "metadata.k"},
	} {
		code, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", devToken, tt.body, tt.hdr...)
		errObj, _ := out["error"].(map[string]any)
		if code != http.StatusUnprocessableEntity || errObj["field"] != tt.field {
			t.Errorf("%s: %d %v, want 422 on %s", tt.name, code, out, tt.field)
		}
	}
}

func withField(body map[string]any, k string, v any) map[string]any {
	body[k] = v
	return body
}

// A tenant whose stored requests and results fill its Redis budget gets
// 429 tenant_storage_full with Retry-After, however its requests are
// shaped (prompts of '<', which JSON would store six-fold), while another
// tenant's requests are accepted and answered.
func TestTenantStorageBudget(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}",
		tenantYML: `{name: hoarder, token: "hoarder-token", max_priority: critical, max_stored_bytes: 2097152}`})
	api := s.startAPI()
	defer s.startWorker()()
	prompt := strings.Repeat("<", 190_000)
	accepted := 0
	var refusal map[string]any
	var retryAfter string
	for i := range 30 {
		body, err := compactjson.Marshal(ask(fmt.Sprint(i, prompt))) // as sent: '<' is one byte
		if err != nil {
			t.Fatal(err)
		}
		code, out, hdr := call(t, "POST", api.ts.URL+"/v1/requests", "hoarder-token", body)
		if code == http.StatusTooManyRequests {
			refusal, retryAfter = out, hdr.Get("Retry-After")
			break
		}
		if code != http.StatusAccepted {
			t.Fatalf("hoarder request %d: %d %v", i, code, out)
		}
		accepted++
	}
	errObj, _ := refusal["error"].(map[string]any)
	if errObj["type"] != "tenant_storage_full" || retryAfter == "" || !strings.Contains(fmt.Sprint(errObj["message"]), "of its 2.0 MiB") {
		t.Fatalf("after %d requests of 190 KB: %v (Retry-After %q), want 429 tenant_storage_full", accepted, refusal, retryAfter)
	}
	// 2 MiB hold about 8 such requests as the budget counts them (a
	// quarter over their bytes); as encoding/json stored them (six bytes
	// a '<') it would have been one.
	if accepted < 6 || accepted > 10 {
		t.Errorf("%d requests of 190 KB fit a 2 MiB budget, want about 8", accepted)
	}
	for i := range 5 {
		id := api.submit(t, ask(fmt.Sprint("another tenant's question ", i)))
		api.waitStatus(t, id, 30*time.Second, "completed")
	}
}

// Reads are bounded per tenant and API process: a tenant polling in a
// loop gets 429 with Retry-After once its burst is spent, and another
// tenant reads on.
func TestTenantReadLimit(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}",
		tenantYML: `{name: poller, token: "poller-token", max_priority: critical, max_reads_per_second: 5}`})
	api := s.startAPI()
	_, out, _ := call(t, "POST", api.ts.URL+"/v1/requests", "poller-token", ask("poll me"))
	id := out["id"].(string)
	refused := 0
	for range 40 { // well past the burst of 10, in far less than the 6 s it would refill in
		code, out, hdr := call(t, "GET", api.ts.URL+"/v1/requests/"+id, "poller-token", nil)
		if code == http.StatusTooManyRequests {
			errObj, _ := out["error"].(map[string]any)
			if errObj["type"] != "tenant_read_rate_limited" || hdr.Get("Retry-After") == "" {
				t.Fatalf("refused read: %v (Retry-After %q)", out, hdr.Get("Retry-After"))
			}
			refused++
		}
	}
	if refused < 20 {
		t.Fatalf("%d of 40 reads in a burst refused, want most past the first 10", refused)
	}
	mine := api.submit(t, ask("another tenant reads"))
	if code, out, _ := call(t, "GET", api.ts.URL+"/v1/requests/"+mine, devToken, nil); code != http.StatusOK {
		t.Fatalf("another tenant's read: %d %v", code, out)
	}
}
