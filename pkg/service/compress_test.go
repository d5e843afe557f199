package service_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/compress"
	"bulwark/pkg/testkit/mockprovider"
)

// With compression on, the provider sees the compressed prompt (the mock's
// answer is a hash of what it received), the tokens saved are recorded in
// history, and a request that opts out is sent as written.
func TestCompressionBeforeTheCall(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "compression: {enabled: true}\ncache: {enabled: false}"})
	api := s.startAPI()
	s.startWorker()
	prompt := "ECU log for VIN LSVAU2180N2183294:\n" +
		strings.Repeat("12:00:01 U0100 lost communication with ECM/PCM A\n", 40) +
		"12:00:09 P0A80 replace hybrid battery pack, BMS sw 4.2.1\nWhy?"
	c, err := compress.New(compress.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sent := c.Text(prompt)
	if len(sent) >= len(prompt)/2 || !strings.Contains(sent, "P0A80") || !strings.Contains(sent, "4.2.1") {
		t.Fatalf("the fixture does not compress as expected: %q", sent)
	}

	id := api.submit(t, ask(prompt))
	out := api.waitStatus(t, id, 15*time.Second, "completed", "failed")
	if got := out["result"].(map[string]any)["content"]; got != mockprovider.Reply(sent) {
		t.Fatalf("the provider saw another prompt than the compressed one: %v", got)
	}
	body := ask(prompt)
	body["compress"] = false
	body["messages"].([]map[string]any)[0]["content"] = prompt + " (as written)"
	id2 := api.submit(t, body)
	out = api.waitStatus(t, id2, 15*time.Second, "completed", "failed")
	if got := out["result"].(map[string]any)["content"]; got != mockprovider.Reply(prompt+" (as written)") {
		t.Fatalf("an opted-out request was changed: %v", got)
	}

	// History is written after the answer, off the request's path.
	var saved, savedOff int
	for _, q := range []struct {
		id  string
		dst *int
	}{{id, &saved}, {id2, &savedOff}} {
		waitFor(t, 10*time.Second, "the history row of "+q.id, func() bool {
			return api.base.PG.QueryRow(context.Background(),
				`SELECT tokens_saved FROM requests WHERE id = $1 AND status = 'completed'`, q.id).Scan(q.dst) == nil
		})
	}
	if saved <= 0 || savedOff != 0 {
		t.Fatalf("tokens_saved in history: %d (compressed), %d (opted out)", saved, savedOff)
	}
}
