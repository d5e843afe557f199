// Package wiretest holds the neutral requests and responses that every
// provider's golden and round-trip tests translate, so that all adapters
// are held to the same cases, the comparison they share, and a provider
// that never answers. It is imported by tests only.
package wiretest

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"bulwark/pkg/llm"
)

// Case is one named value to translate.
type Case[T any] struct {
	Name  string
	Value T
}

func temp(f float64) *float64 { return &f }

// otaLogSchema is a JSON Schema with nesting, enums, arrays and required
// fields, the kind of schema that must pass through untouched.
const otaLogSchema = `{"type":"object","properties":{"vin":{"type":"string","description":"Vehicle identification number"},"batch":{"type":"integer","minimum":1},"severity":{"type":"string","enum":["info","warn","fatal"]},"ecus":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"firmware":{"type":"string"}},"required":["name"]}}},"required":["vin","batch"],"additionalProperties":false}`

func tools() []llm.Tool {
	return []llm.Tool{
		{
			Name:        "fetch_ota_log",
			Description: "Fetch the OTA update log of one vehicle for one batch.",
			InputSchema: json.RawMessage(otaLogSchema),
		},
		{
			Name:        "lookup_error_code",
			Description: "Explain a diagnostic trouble code.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"code":{"type":"string","pattern":"^[PCBU][0-9A-F]{4}$"}},"required":["code"]}`),
		},
	}
}

func user(text string) llm.Message {
	return llm.Message{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: text}}}
}

func assistant(text string) llm.Message {
	return llm.Message{Role: llm.RoleAssistant, Content: []llm.Block{{Type: llm.BlockText, Text: text}}}
}

// Requests returns the request cases. Every one survives a round trip
// through every provider's wire format unchanged.
func Requests() []Case[*llm.Request] {
	return []Case[*llm.Request]{
		{"plain_text", &llm.Request{
			Model:     "test-model",
			MaxTokens: 256,
			Messages:  []llm.Message{user("Why did OTA batch 42 fail on half the fleet?")},
		}},
		{"system_multi_turn", &llm.Request{
			Model:         "test-model",
			System:        "You are a vehicle diagnosis assistant.\nAnswer briefly.",
			MaxTokens:     1024,
			Temperature:   temp(0.2),
			StopSequences: []string{"\n\nHuman:", "END"},
			Messages: []llm.Message{
				user("Batch 42 failed with E-1001."),
				assistant("E-1001 is a signature check failure. Which ECU?"),
				{Role: llm.RoleUser, Content: []llm.Block{
					{Type: llm.BlockText, Text: "The gateway ECU."},
					{Type: llm.BlockText, Text: " Firmware 3.2.1 → 3.3.0, “unicode” included."},
				}},
			},
		}},
		{"tools_schema", &llm.Request{
			Model:      "test-model",
			MaxTokens:  512,
			Messages:   []llm.Message{user("Fetch the log of WVW123 for batch 42.")},
			Tools:      tools(),
			ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAuto},
		}},
		{"parallel_tool_calls", &llm.Request{
			Model:     "test-model",
			System:    "Use the tools.",
			MaxTokens: 2048,
			Tools:     tools(),
			Messages: []llm.Message{
				user("Check WVW123 and explain P0A80."),
				{Role: llm.RoleAssistant, Content: []llm.Block{
					{Type: llm.BlockText, Text: "I will fetch the log and look up the code."},
					{Type: llm.BlockToolUse, ToolUseID: "toolu_01A", ToolName: "fetch_ota_log", Input: json.RawMessage(`{"vin":"WVW123","batch":42,"ecus":[{"name":"gateway"}]}`)},
					{Type: llm.BlockToolUse, ToolUseID: "toolu_01B", ToolName: "lookup_error_code", Input: json.RawMessage(`{"code":"P0A80"}`)},
				}},
				{Role: llm.RoleUser, Content: []llm.Block{
					{Type: llm.BlockToolResult, ToolUseID: "toolu_01A", Text: `{"status":"failed","step":"verify"}`},
					{Type: llm.BlockToolResult, ToolUseID: "toolu_01B", Text: "lookup service unavailable", IsError: true},
					{Type: llm.BlockText, Text: "Summarise for the engineer."},
				}},
				assistant("The update failed at verification; the code lookup failed."),
				user("Thanks."),
			},
		}},
		{"tool_choice_any", &llm.Request{
			Model: "test-model", MaxTokens: 100, Tools: tools(),
			Messages:   []llm.Message{user("Use a tool.")},
			ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceAny},
		}},
		{"tool_choice_tool", &llm.Request{
			Model: "test-model", MaxTokens: 100, Tools: tools(),
			Messages:   []llm.Message{user("Look up P0A80.")},
			ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceTool, Name: "lookup_error_code"},
		}},
		{"tool_choice_none", &llm.Request{
			Model: "test-model", MaxTokens: 100, Tools: tools(),
			Messages:   []llm.Message{user("Do not use tools.")},
			ToolChoice: &llm.ToolChoice{Mode: llm.ToolChoiceNone},
		}},
	}
}

// Responses returns the response cases. Every one survives a round trip
// through every provider's wire format unchanged.
func Responses() []Case[*llm.Response] {
	return []Case[*llm.Response]{
		{"text", &llm.Response{
			ID:         "resp_01",
			Model:      "test-model",
			Content:    []llm.Block{{Type: llm.BlockText, Text: "The signature check failed on the gateway ECU because the new firmware was signed with a rotated key."}},
			StopReason: llm.StopEndTurn,
			Usage:      llm.Usage{InputTokens: 120, OutputTokens: 24},
		}},
		{"tool_use_parallel", &llm.Response{
			ID:    "resp_02",
			Model: "test-model",
			Content: []llm.Block{
				{Type: llm.BlockText, Text: "Fetching both."},
				{Type: llm.BlockToolUse, ToolUseID: "toolu_02A", ToolName: "fetch_ota_log", Input: json.RawMessage(`{"vin":"WVW123","batch":42}`)},
				{Type: llm.BlockToolUse, ToolUseID: "toolu_02B", ToolName: "lookup_error_code", Input: json.RawMessage(`{"code":"P0A80"}`)},
			},
			StopReason: llm.StopToolUse,
			Usage:      llm.Usage{InputTokens: 300, OutputTokens: 61},
		}},
		{"max_tokens", &llm.Response{
			ID:         "resp_03",
			Model:      "test-model",
			Content:    []llm.Block{{Type: llm.BlockText, Text: "The batch failed because"}},
			StopReason: llm.StopMaxTokens,
			Usage:      llm.Usage{InputTokens: 50, OutputTokens: 5},
		}},
	}
}

// jsonEqual compares json.RawMessage values by their compact form, so that
// whitespace does not count.
var jsonEqual = cmp.Transformer("compactJSON", func(r json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, r); err != nil {
		return "invalid JSON: " + string(r)
	}
	return b.String()
})

// Diff returns a (-want +got) diff of two values of the neutral model,
// empty when they are equal.
func Diff(want, got any) string {
	return cmp.Diff(want, got, jsonEqual)
}

// Update is the -update flag: rewrite golden files instead of comparing.
var Update = flag.Bool("update", false, "rewrite golden files in testdata/")

// Golden compares got (JSON) with testdata/name, both indented, or rewrites
// the file under -update.
func Golden(t *testing.T, name string, got []byte) {
	t.Helper()
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, got, "", "  "); err != nil {
		t.Fatalf("%s: output is not JSON: %v\n%s", name, err, got)
	}
	pretty.WriteByte('\n')
	GoldenText(t, name, pretty.Bytes())
}

// GoldenText compares got with testdata/name byte for byte, or rewrites the
// file under -update.
func GoldenText(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *Update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s differs from the golden file (-want +got):\n%s", path, d)
	}
}

// Hang starts a provider that never answers: it reads each request's body
// (only then does the server notice the client hanging up) and waits until
// the client gives up. It is closed when t ends.
func Hang(t *testing.T) *httptest.Server {
	t.Helper()
	return hang(t, nil)
}

// CancelWhenIn starts a provider like Hang and returns it with a context
// that is cancelled with cause (context.Canceled when nil) once a request
// has reached it: a caller giving up while its request waits.
func CancelWhenIn(t *testing.T, cause error) (*httptest.Server, context.Context) {
	t.Helper()
	arrived := make(chan struct{})
	srv := hang(t, arrived)
	ctx, cancel := context.WithCancelCause(t.Context())
	go func() {
		select {
		case <-arrived:
			cancel(cause)
		case <-ctx.Done():
		}
	}()
	return srv, ctx
}

func hang(t *testing.T, arrived chan struct{}) *httptest.Server {
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if arrived != nil {
			once.Do(func() { close(arrived) })
		}
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return srv
}
