package intake

import (
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

func TestResolvePriority(t *testing.T) {
	t.Parallel()
	capped := Tenant{DefaultPriority: priority.Low, MaxPriority: priority.High}
	for _, tt := range []struct {
		name  string
		t     Tenant
		asked priority.Priority
		want  priority.Priority
	}{
		{"tenant default", capped, 0, priority.Low},
		{"within the ceiling", capped, priority.Normal, priority.Normal},
		{"above the ceiling is lowered to it", capped, priority.Critical, priority.High},
		{"no tenant default", Tenant{}, 0, priority.Normal},
		{"no ceiling", Tenant{}, priority.Critical, priority.Critical},
	} {
		got, err := resolvePriority(tt.t, tt.asked)
		if err != nil || got != tt.want {
			t.Errorf("%s: %v %v, want %v", tt.name, got, err, tt.want)
		}
	}
	if _, err := resolvePriority(Tenant{}, 9); err == nil {
		t.Error("priority 9 accepted")
	}
}

func TestToolResultsHash(t *testing.T) {
	t.Parallel()
	withResult := func(text string, isErr bool) llm.Request {
		return llm.Request{Messages: []llm.Message{
			{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "q"}}},
			{Role: llm.RoleAssistant, Content: []llm.Block{{Type: llm.BlockToolUse, ToolUseID: "t1", ToolName: "logs"}}},
			{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockToolResult, ToolUseID: "t1", Text: text, IsError: isErr}}},
		}}
	}
	a, b, c := ToolResultsHash(withResult("3 errors", false)), ToolResultsHash(withResult("4 errors", false)), ToolResultsHash(withResult("3 errors", true))
	if a == "" || a == b || a == c || a != ToolResultsHash(withResult("3 errors", false)) {
		t.Fatalf("hashes %q %q %q: must differ by result and error flag, and be stable", a, b, c)
	}
	if h := ToolResultsHash(llm.Request{Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "q"}}}}}); h != "" {
		t.Fatalf("no tool results hashed to %q", h)
	}
}
