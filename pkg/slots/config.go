package slots

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"bulwark/pkg/priority"
)

// Defaults of Config.
const (
	TotalDefault = 20
	// LeaseTTLDefault is short because holders renew: a SIGKILLed worker's
	// slots come back within 30 s.
	LeaseTTLDefault     = 30 * time.Second
	WaiterTTLDefault    = time.Second
	RedisTimeoutDefault = 2 * time.Second
	PrefixDefault       = "bulwark:{slots}:"
)

// Poll interval of Acquire: starts at pollMin, doubles up to pollMax, each
// wait jittered to between half and all of it. A slot frees when some
// call ends, with no notification; 50 ms bounds how late a waiter notices.
const (
	pollMin = 5 * time.Millisecond
	pollMax = 50 * time.Millisecond
	// pollStep is a deep waiter's interval per grant still to go before
	// its turn (Limiter.deepPoll).
	pollStep = 10 * time.Millisecond
)

// waiterTTLMin keeps a polling waiter's registration alive between two
// polls with room for a slow Redis round trip.
const waiterTTLMin = 2 * pollMax

// Config configures a Limiter. Zero fields take their defaults.
type Config struct {
	// Total is the number of provider calls in flight across all workers.
	// Default 20 (TotalDefault).
	Total int
	// Reserved is each priority's reserve (see the package doc); a missing
	// priority reserves 0. The reserves may not sum to more than Total.
	Reserved map[priority.Priority]int
	// LeaseTTL is how long a slot lives after it was granted or last
	// renewed: how long a dead worker's slots stay taken. Holders must call
	// Slot.Renew more often than that (every LeaseTTL/3) while their call
	// runs. Default 30s (LeaseTTLDefault); at least 1ms.
	LeaseTTL time.Duration
	// WaiterTTL is how long a refused waiter keeps its place in line
	// without asking again. Acquire asks at least every 50ms. Default 1s
	// (WaiterTTLDefault); at least 100ms.
	WaiterTTL time.Duration
	// RedisTimeout bounds each Redis call. Default 2s (RedisTimeoutDefault).
	RedisTimeout time.Duration
	// Prefix of every Redis key. Default "bulwark:{slots}:" (PrefixDefault).
	Prefix string
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Total == 0 {
		c.Total = TotalDefault
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = LeaseTTLDefault
	}
	if c.WaiterTTL == 0 {
		c.WaiterTTL = WaiterTTLDefault
	}
	if c.RedisTimeout == 0 {
		c.RedisTimeout = RedisTimeoutDefault
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	return c
}

// Validate reports the first field of c (defaults applied) out of range.
func (c Config) Validate() error {
	switch {
	case c.Total < 1:
		return fmt.Errorf("slots: Config.Total must be at least 1, got %d", c.Total)
	case c.LeaseTTL < time.Millisecond:
		return fmt.Errorf("slots: Config.LeaseTTL must be at least 1ms, got %s", c.LeaseTTL)
	case c.WaiterTTL < waiterTTLMin:
		return fmt.Errorf("slots: Config.WaiterTTL must be at least %s (twice the longest poll interval), got %s",
			waiterTTLMin, c.WaiterTTL)
	case c.RedisTimeout <= 0:
		return fmt.Errorf("slots: Config.RedisTimeout must be positive, got %s", c.RedisTimeout)
	}
	return c.validateReserved()
}

func (c Config) validateReserved() error {
	sum := 0
	for _, p := range slices.Sorted(maps.Keys(c.Reserved)) {
		n := c.Reserved[p]
		switch {
		case !p.Valid():
			return fmt.Errorf("slots: Config.Reserved has unknown priority %d (want 1-4)", p)
		case n < 0:
			return fmt.Errorf("slots: Config.Reserved[%s] must be at least 0, got %d", p, n)
		}
		sum += n
	}
	if sum > c.Total {
		return fmt.Errorf("slots: Config.Reserved sums to %d, more than Config.Total %d", sum, c.Total)
	}
	return nil
}
