package dispatch

import (
	"strings"
	"testing"
	"time"

	"bulwark/pkg/priority"
)

// TestConfigDefaultsAndValidate: the zero Config gets every default and
// is valid; each field out of range is named.
func TestConfigDefaultsAndValidate(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.PaceWait != PaceWaitDefault || c.HoldWait != HoldWaitDefault || c.MaxKeyTries != MaxKeyTriesDefault ||
		c.SlotRenew != SlotRenewDefault || c.Price == nil {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.PaceWait = -time.Second }, "pace_wait must be > 0, got -1s"},
		{func(c *Config) { c.PaceWait, c.HoldWait = 5*time.Second, 3*time.Second }, "hold_wait (3s) must be >= pace_wait (5s)"},
		{func(c *Config) { c.MaxKeyTries = -1 }, "key tries must be > 0"},
		{func(c *Config) { c.MaxActive = map[priority.Priority]int{priority.Low: -2} }, "max active of"},
	} {
		c := Config{}.WithDefaults()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}
