package intake

import (
	"strings"
	"testing"

	"bulwark/pkg/queue"
)

// TestConfigDefaultsAndValidate: the zero Config gets every default and
// is valid; each field out of range is named.
func TestConfigDefaultsAndValidate(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.MaxWait != queue.MaxWaitDefault || c.MaxPromptChars != MaxPromptCharsDefault ||
		c.MaxTokensLimit != MaxTokensLimitDefault || c.DefaultMaxTokens != DefaultMaxTokensDefault || c.DefaultLayer != "agent" {
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
		{func(c *Config) { c.DefaultMaxTokens = c.MaxTokensLimit + 1 }, "DefaultMaxTokens must be in [1, MaxTokensLimit (32000)], got 32001"},
		{func(c *Config) { c.Layers = map[string]bool{"router": true} }, `DefaultLayer "agent" is not one of Layers`},
	} {
		c := Config{}.WithDefaults()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}
