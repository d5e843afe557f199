package bedrock

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/mockprovider"
	"bulwark/pkg/provider/internal/wiretest"
)

// mockNow is the mock's clock: fixed, so that its buckets refill only when
// a test says so.
var mockNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// startMock serves pkg/mockprovider for cfg and returns it with a client
// pointed at it that signs with the test credentials and has timeout (0:
// default).
func startMock(t *testing.T, cfg mockprovider.Config, timeout time.Duration) (*mockprovider.Server, *Client) {
	t.Helper()
	cfg.Now = func() time.Time { return mockNow }
	srv, err := mockprovider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	t.Cleanup(srv.Close) // runs first: releases a request hanging on a timeout fault
	return srv, New(Config{BaseURL: ts.URL, Timeout: timeout, Credentials: staticCreds(testAKID, testSecret, testToken)}, ts.Client())
}

func userText(s string) llm.Message {
	return llm.Message{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: s}}}
}

// The adapter against the mock's Bedrock endpoint over real HTTP.
func TestMock(t *testing.T) {
	t.Parallel()
	key := mockprovider.Fingerprint(mockprovider.BedrockKey(testAKID, testRegion))

	t.Run("text answer", func(t *testing.T) {
		t.Parallel()
		srv, c := startMock(t, mockprovider.Config{DefaultLimits: mockprovider.Limits{RPM: 600, TPM: 100000}}, 0)
		prompt := "Why did OTA batch 42 fail on half the fleet?"
		res, err := c.Complete(t.Context(), cred(testRegion), &llm.Request{
			Model: testModel, MaxTokens: 256, System: "Be brief.", Messages: []llm.Message{userText(prompt)},
		})
		if err != nil {
			t.Fatal(err)
		}
		got, text := res.Response, mockprovider.Reply(prompt)
		if got.ID == "" || got.Model != testModel || got.StopReason != llm.StopEndTurn || got.Text() != text ||
			got.Usage.InputTokens <= 0 || got.Usage.OutputTokens != mockprovider.CountTokens(text) {
			t.Errorf("answer %+v, want the text %q", got, text)
		}
		if res.RateLimit != (llm.RateLimit{}) {
			t.Errorf("rate limit %+v: Bedrock sends none", res.RateLimit)
		}
		if st := srv.Stats(); st.Keys[key].OK != 1 || st.Providers["bedrock"].OK != 1 {
			t.Errorf("stats %+v: want one answer on the key %s", st, key)
		}
	})

	t.Run("tool call round trip", func(t *testing.T) {
		t.Parallel()
		_, c := startMock(t, mockprovider.Config{}, 0)
		schema := json.RawMessage(`{"type":"object","properties":{"query":{"type":"string"}}}`)
		prompt := "Run fetch_ota_log and lookup_error_code for WVW123."
		req := &llm.Request{
			Model: testModel, MaxTokens: 512,
			Tools:    []llm.Tool{{Name: "fetch_ota_log", InputSchema: schema}, {Name: "lookup_error_code", InputSchema: schema}},
			Messages: []llm.Message{userText(prompt)},
		}
		res, err := c.Complete(t.Context(), cred(testRegion), req)
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
		req.Messages = append(req.Messages, llm.Message{Role: llm.RoleAssistant, Content: calls}, llm.Message{Role: llm.RoleUser, Content: results})
		res, err = c.Complete(t.Context(), cred(testRegion), req)
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
		status  int
		code    string
		message string
	}{
		{"rate_limit", mockprovider.Fault{Mode: mockprovider.FaultRateLimit, RetryAfter: 2 * time.Second},
			llm.ClassRateLimited, 429, "ThrottlingException", "Too many requests"},
		{"overloaded", mockprovider.Fault{Mode: mockprovider.FaultOverloaded}, llm.ClassOverloaded, 503, "ServiceUnavailableException", ""},
		{"server_error", mockprovider.Fault{Mode: mockprovider.FaultServerError}, llm.ClassTransient, 500, "InternalServerException", ""},
		{"spend_limit", mockprovider.Fault{Mode: mockprovider.FaultSpendLimit}, llm.ClassRateLimited, 400, "ServiceQuotaExceededException", "service quota"},
		{"insufficient_quota", mockprovider.Fault{Mode: mockprovider.FaultInsufficientQuota}, llm.ClassRateLimited, 400, "ServiceQuotaExceededException", ""},
		{"invalid_request", mockprovider.Fault{Mode: mockprovider.FaultInvalidRequest}, llm.ClassPermanent, 400, "ValidationException", ""},
		{"message echoing the credentials", mockprovider.Fault{Mode: mockprovider.FaultServerError,
			Message: "upstream refused " + testAKID + " with token " + testToken + " in account 123456789012"},
			llm.ClassTransient, 500, "InternalServerException", "upstream refused"},
	} {
		t.Run("fault "+tt.name, func(t *testing.T) {
			t.Parallel()
			srv, c := startMock(t, mockprovider.Config{}, 0)
			tt.fault.KeyFingerprint, tt.fault.Count = key, 1
			if err := srv.SetFault(tt.fault); err != nil {
				t.Fatal(err)
			}
			pe := failure(t, c, cred(testRegion), textRequest(testModel))
			// Bedrock sends no Retry-After, and neither does the mock.
			if pe.Class != tt.class || pe.Status != tt.status || pe.Code != tt.code || pe.RetryAfter != 0 || pe.Provider != "bedrock" {
				t.Errorf("got %+v; want class %s, status %d, code %s", pe, tt.class, tt.status, tt.code)
			}
			if s := pe.Error(); strings.Contains(s, testAKID) || strings.Contains(s, testToken) || strings.Contains(s, "123456789012") ||
				!strings.Contains(pe.Message, tt.message) {
				t.Errorf("message %q: leaks a credential or lacks %q", pe.Message, tt.message)
			}
			// The fault was used up, and it was this key's: the next call
			// is answered.
			if _, err := c.Complete(t.Context(), cred(testRegion), textRequest(testModel)); err != nil {
				t.Errorf("call after the fault: %v", err)
			}
		})
	}

	t.Run("fault timeout is the client's own timeout", func(t *testing.T) {
		t.Parallel()
		srv, c := startMock(t, mockprovider.Config{}, 50*time.Millisecond)
		if err := srv.SetFault(mockprovider.Fault{KeyFingerprint: key, Mode: mockprovider.FaultTimeout}); err != nil {
			t.Fatal(err)
		}
		_, err := c.Complete(t.Context(), cred(testRegion), textRequest(testModel))
		if class, ok := llm.ClassOf(err); !ok || class != llm.ClassTransient || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v: class %s, want transient and not the caller's deadline", err, class)
		}
	})

	t.Run("each region is a key with its own quota", func(t *testing.T) {
		t.Parallel()
		// 60 RPM over the default 1 s window: one call, then one a second.
		_, c := startMock(t, mockprovider.Config{Keys: map[string]mockprovider.Limits{
			mockprovider.BedrockKey(testAKID, testRegion): {RPM: 60}}}, 0)
		if _, err := c.Complete(t.Context(), cred(testRegion), textRequest(testModel)); err != nil {
			t.Fatal(err)
		}
		pe := failure(t, c, cred(testRegion), textRequest(testModel))
		if pe.Class != llm.ClassRateLimited || pe.Status != 429 || pe.Code != "ThrottlingException" || pe.RetryAfter != 0 ||
			!strings.Contains(pe.Message, "Too many requests, please wait before trying again.") || pe.RateLimit != (llm.RateLimit{}) {
			t.Errorf("got %+v; want Bedrock's ThrottlingException", pe)
		}
		// The same account in another region is another key.
		if _, err := c.Complete(t.Context(), cred("us-west-2"), textRequest(testModel)); err != nil {
			t.Errorf("another region: %v", err)
		}
	})
}
