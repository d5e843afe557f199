package providertest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/mockprovider"
	"bulwark/pkg/testkit/wiretest"
)

// mockNow is the mock's clock: fixed, so that its buckets refill only when
// a test says so and its retry-after values are exact.
var mockNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// startMock serves a pkg/testkit/mockprovider mock for cfg on the fixed clock and
// returns the adapter's client pointed at it, with timeout (0: default).
func (h *Harness) startMock(t *testing.T, cfg mockprovider.Config, timeout time.Duration) (*mockprovider.Server, llm.Client) {
	t.Helper()
	cfg.Now = func() time.Time { return mockNow }
	srv, err := mockprovider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	t.Cleanup(srv.Close) // runs first: releases a request hanging on a timeout fault
	return srv, h.New(Config{BaseURL: ts.URL, Timeout: timeout}, ts.Client())
}

func userText(s string) llm.Message {
	return llm.Message{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: s}}}
}

func (h *Harness) testMock(t *testing.T) {
	t.Run("text answer and rate-limit headers", func(t *testing.T) {
		t.Parallel()
		const rpm, tpm = 600, 100000
		_, c := h.startMock(t, mockprovider.Config{DefaultLimits: mockprovider.Limits{RPM: rpm, TPM: tpm}}, 0)
		prompt := "Why did OTA batch 42 fail on half the fleet?"
		res, err := c.Complete(t.Context(), h.cred("sk-mock-text"), &llm.Request{
			Model: "mock-model", MaxTokens: 256, System: "Be brief.", Messages: []llm.Message{userText(prompt)},
		})
		if err != nil {
			t.Fatal(err)
		}
		got := res.Response
		text := mockprovider.Reply(prompt)
		if got.ID == "" || got.Model != "mock-model" || got.StopReason != llm.StopEndTurn || got.Text() != text ||
			got.Usage.InputTokens <= 0 || got.Usage.OutputTokens != mockprovider.CountTokens(text) {
			t.Errorf("answer %+v, want the text %q", got, text)
		}
		rl := res.RateLimit
		used := got.Usage.InputTokens + got.Usage.OutputTokens
		if h.KeepsAdmissionCharge {
			used = got.Usage.InputTokens + 256 // max_tokens, kept after the answer
		}
		if !h.RateLimit.Want.Known {
			// The provider sends no rate-limit headers, nor does the mock
			// in its shape.
			if rl != (llm.RateLimit{}) {
				t.Errorf("rate limit %+v, want none: the provider sends no rate-limit headers", rl)
			}
		} else if !rl.Known || rl.RequestsLimit != rpm || rl.RequestsRemaining != rpm-1 || rl.TokensLimit != tpm ||
			rl.TokensRemaining != tpm-used || rl.RequestsReset.IsZero() || rl.TokensReset.IsZero() {
			t.Errorf("rate limit %+v, want %d/%d requests and %d/%d tokens left", rl, rpm-1, rpm, tpm-used, tpm)
		}
	})

	t.Run("tool call round trip", func(t *testing.T) {
		t.Parallel()
		_, c := h.startMock(t, mockprovider.Config{}, 0)
		const key = "sk-mock-tools"
		schema := json.RawMessage(`{"type":"object","properties":{"query":{"type":"string"}}}`)
		prompt := "Run fetch_ota_log and lookup_error_code for WVW123."
		req := &llm.Request{
			Model: "mock-model", MaxTokens: 512,
			Tools:    []llm.Tool{{Name: "fetch_ota_log", InputSchema: schema}, {Name: "lookup_error_code", InputSchema: schema}},
			Messages: []llm.Message{userText(prompt)},
		}
		res, err := c.Complete(t.Context(), h.cred(key), req)
		if err != nil {
			t.Fatal(err)
		}
		calls := res.Response.Content
		if res.Response.StopReason != llm.StopToolUse || len(calls) != 2 {
			t.Fatalf("answer %+v, want two tool calls", res.Response)
		}
		var results []llm.Block
		var want []mockprovider.ToolResult
		for i, name := range []string{"fetch_ota_log", "lookup_error_code"} {
			b := calls[i]
			if b.Type != llm.BlockToolUse || b.ToolName != name || b.ToolUseID == "" {
				t.Fatalf("call %d: %+v, want a call of %s", i, b, name)
			}
			if d := wiretest.Diff(mockprovider.ToolCallInput(prompt), b.Input); d != "" {
				t.Errorf("call %d input (-want +got):\n%s", i, d)
			}
			out := name + " says ok"
			results = append(results, llm.Block{Type: llm.BlockToolResult, ToolUseID: b.ToolUseID, Text: out})
			want = append(want, mockprovider.ToolResult{Content: out})
		}
		if calls[0].ToolUseID == calls[1].ToolUseID {
			t.Errorf("both calls have the id %s", calls[0].ToolUseID)
		}

		req.Messages = append(req.Messages,
			llm.Message{Role: llm.RoleAssistant, Content: calls},
			llm.Message{Role: llm.RoleUser, Content: results})
		res, err = c.Complete(t.Context(), h.cred(key), req)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Response; got.StopReason != llm.StopEndTurn || got.Text() != mockprovider.ToolResultsReply(want) {
			t.Errorf("answer to the results %+v, want %q", got, mockprovider.ToolResultsReply(want))
		}
	})

	for _, tt := range []struct {
		name    string
		fault   mockprovider.Fault
		class   llm.Class
		status  int // 0: any
		retry   time.Duration
		message string
	}{
		{"rate_limit", mockprovider.Fault{Mode: mockprovider.FaultRateLimit, RetryAfter: 2 * time.Second},
			llm.ClassRateLimited, 429, 2 * time.Second, ""},
		{"overloaded", mockprovider.Fault{Mode: mockprovider.FaultOverloaded}, llm.ClassOverloaded, 0, 0, ""},
		{"server_error", mockprovider.Fault{Mode: mockprovider.FaultServerError}, llm.ClassTransient, 500, 0, ""},
		{"spend_limit", mockprovider.Fault{Mode: mockprovider.FaultSpendLimit}, llm.ClassQuota, 429, 0, ""},
		{"insufficient_quota", mockprovider.Fault{Mode: mockprovider.FaultInsufficientQuota}, llm.ClassQuota, 429, 0, ""},
		{"invalid_request", mockprovider.Fault{Mode: mockprovider.FaultInvalidRequest}, llm.ClassPermanent, 400, 0, ""},
		{"message echoing the key", mockprovider.Fault{Mode: mockprovider.FaultServerError,
			Message: strings.Join(append([]string{"upstream refused key sk-mock-fault-0123456789abcdef"}, h.Secrets...), " ")},
			llm.ClassTransient, 500, 0, "upstream refused key"},
	} {
		t.Run("fault "+tt.name, func(t *testing.T) {
			t.Parallel()
			const key = "sk-mock-fault-0123456789abcdef"
			srv, c := h.startMock(t, mockprovider.Config{}, 0)
			tt.fault.Provider, tt.fault.Count = h.Mock, 1
			if err := srv.SetFault(tt.fault); err != nil {
				t.Fatal(err)
			}
			pe := h.failure(t, c, key)
			want := h.mockError(tt.name, MockError{Class: tt.class, Status: tt.status, RetryAfter: tt.retry, Message: tt.message})
			h.checkMockError(t, pe, want)
			if s := pe.Error() + pe.Message + pe.Code; strings.Contains(s, key) || slices.ContainsFunc(h.Secrets, func(secret string) bool {
				return strings.Contains(s, secret)
			}) {
				t.Errorf("message %q leaks the key or a secret", pe.Message)
			}
			// The fault was used up: the next call is answered.
			if _, err := c.Complete(t.Context(), h.cred(key), request()); err != nil {
				t.Errorf("call after the fault: %v", err)
			}
		})
	}

	t.Run("fault timeout is the client's own timeout", func(t *testing.T) {
		t.Parallel()
		srv, c := h.startMock(t, mockprovider.Config{}, 50*time.Millisecond)
		if err := srv.SetFault(mockprovider.Fault{Provider: h.Mock, Mode: mockprovider.FaultTimeout}); err != nil {
			t.Fatal(err)
		}
		_, err := c.Complete(t.Context(), h.cred("sk-mock-hang"), request())
		if class, ok := llm.ClassOf(err); !ok || class != llm.ClassTransient || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v: class %s, want transient and not the caller's deadline", err, class)
		}
	})

	t.Run("missing key", func(t *testing.T) {
		t.Parallel()
		if h.Credential != nil {
			t.Skip("no key (Harness.Credential): the credential is not a key string that could be missing")
		}
		_, c := h.startMock(t, mockprovider.Config{}, 0)
		if pe := h.failure(t, c, ""); pe.Class != llm.ClassAuth || pe.Status != http.StatusUnauthorized {
			t.Fatalf("error %v, want a 401 auth *llm.Error", pe)
		}
	})

	t.Run("429 of the mock's buckets", func(t *testing.T) {
		t.Parallel()
		// 60 RPM over the default 1 s window: one call, then one a second.
		const rpm = 60
		_, c := h.startMock(t, mockprovider.Config{DefaultLimits: mockprovider.Limits{RPM: rpm}}, 0)
		if _, err := c.Complete(t.Context(), h.cred("sk-mock-bucket"), request()); err != nil {
			t.Fatal(err)
		}
		pe := h.failure(t, c, "sk-mock-bucket")
		rl := pe.RateLimit
		h.checkMockError(t, pe, h.mockError("buckets", MockError{Class: llm.ClassRateLimited, Status: http.StatusTooManyRequests,
			RetryAfter: time.Second}))
		if _, own := h.MockErrors["buckets"]; !own && !strings.Contains(strings.ToLower(pe.Message), "rate limit") {
			t.Errorf("message %q, want one saying rate limit", pe.Message)
		}
		if !h.RateLimit.Want.Known {
			if rl != (llm.RateLimit{}) {
				t.Errorf("rate limit %+v, want none: the provider sends no rate-limit headers", rl)
			}
		} else if !rl.Known || rl.RequestsLimit != rpm || rl.RequestsRemaining != rpm-1 {
			t.Errorf("rate limit %+v, want %d of %d requests left", rl, rpm-1, rpm)
		}
	})
}

// mockError is what the client must make of the mock's error answer of
// the case name: Harness.MockErrors' when it names the case, else def.
func (h *Harness) mockError(name string, def MockError) MockError {
	if e, ok := h.MockErrors[name]; ok {
		return e
	}
	return def
}

// checkMockError compares pe with want.
func (h *Harness) checkMockError(t *testing.T, pe *llm.Error, want MockError) {
	t.Helper()
	if pe.Class != want.Class || (want.Status != 0 && pe.Status != want.Status) || (want.Code != "" && pe.Code != want.Code) ||
		pe.RetryAfter != want.RetryAfter || pe.Provider != h.Provider || !strings.Contains(pe.Message, want.Message) {
		t.Errorf("got %+v; want class %s, status %d, code %q, retry after %s, a message with %q",
			pe, want.Class, want.Status, want.Code, want.RetryAfter, want.Message)
	}
}
