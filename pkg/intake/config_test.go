package intake

import (
	"strings"
	"testing"

	"bulwark/pkg/llm"
	"bulwark/pkg/queue"
)

// TestConfigDefaultsAndValidate: the zero Config gets every default and
// is valid; each field out of range is named.
func TestConfigDefaultsAndValidate(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.MaxWait != queue.MaxWaitDefault || c.MaxPromptChars != MaxPromptCharsDefault ||
		c.MaxTokensLimit != 0 || c.DefaultMaxTokens != DefaultMaxTokensDefault || c.DefaultLayer != "agent" {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c := (Config{MaxTokensLimit: 500}).WithDefaults(); c.DefaultMaxTokens != 500 {
		t.Errorf("DefaultMaxTokens under a cap of 500 = %d, want 500", c.DefaultMaxTokens)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.MaxPromptChars = -1 }, "MaxPromptChars must be > 0"},
		{func(c *Config) { c.MaxTokensLimit = 32_000; c.DefaultMaxTokens = 32_001 }, "DefaultMaxTokens must be in [1, MaxTokensLimit (32000)], got 32001"},
		{func(c *Config) { c.MaxTokensLimit = -1 }, "MaxTokensLimit must be >= 0 (0: none), got -1"},
		{func(c *Config) { c.OutputLimits = map[llm.Route]int{{Provider: "claude", Tier: "sonnet"}: 0} }, "OutputLimits[claude/sonnet] must be > 0, got 0"},
		{func(c *Config) { c.Layers = map[string]bool{"router": true} }, `DefaultLayer "agent" is not one of Layers`},
	} {
		c := Config{}.WithDefaults()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}

// TestOutputLimit: a route's own limit, the default for a route without
// one, and the operator's ceiling over both.
func TestOutputLimit(t *testing.T) {
	sonnet, gpt := llm.Route{Provider: "claude", Tier: "sonnet"}, llm.Route{Provider: "openai", Tier: "gpt4o"}
	other := llm.Route{Provider: "local", Tier: "qwen"}
	limits := map[llm.Route]int{sonnet: 64_000, gpt: 16_384}
	for _, tc := range []struct {
		ceiling int
		r       llm.Route
		want    int
	}{
		{0, sonnet, 64_000}, {0, gpt, 16_384}, {0, other, OutputLimitDefault},
		{32_000, sonnet, 32_000}, {32_000, gpt, 16_384}, {8_000, other, 8_000},
	} {
		c := Config{OutputLimits: limits, MaxTokensLimit: tc.ceiling}
		if got := c.OutputLimit(tc.r); got != tc.want {
			t.Errorf("ceiling %d: OutputLimit(%s) = %d, want %d", tc.ceiling, tc.r, got, tc.want)
		}
	}
}
