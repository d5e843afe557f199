// Package priority defines the four request priorities of the design
// document and their names. It is a leaf package: queue, slots, API and
// metrics share it without importing each other.
package priority

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Priority is 1 (most urgent) to 4. The zero value is invalid.
type Priority int

const (
	Critical Priority = 1 // P1: breakdown on the road, safety
	High     Priority = 2 // P2: an engineer asked
	Normal   Priority = 3 // P3: batch back-analysis
	Low      Priority = 4 // P4: scheduled sweeps
)

// All lists the priorities from most to least urgent.
var All = []Priority{Critical, High, Normal, Low}

var names = [...]string{"", "critical", "high", "normal", "low"}

// Valid reports whether p is one of the four priorities.
func (p Priority) Valid() bool { return p >= Critical && p <= Low }

// String returns the lowercase name ("critical"), which is also the asynq
// queue name and the metric label.
func (p Priority) String() string {
	if !p.Valid() {
		return "invalid(" + strconv.Itoa(int(p)) + ")"
	}
	return names[p]
}

// Parse accepts a name ("critical", "HIGH"), a number 1–4, or "P1"–"P4".
func Parse(s string) (Priority, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for i := 1; i < len(names); i++ {
		if t == names[i] {
			return Priority(i), nil
		}
	}
	t = strings.TrimPrefix(t, "p")
	if n, err := strconv.Atoi(t); err == nil && Priority(n).Valid() {
		return Priority(n), nil
	}
	return 0, fmt.Errorf("invalid priority %q: want critical, high, normal, low or 1-4", s)
}

// MarshalText implements encoding.TextMarshaler.
func (p Priority) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (p *Priority) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// UnmarshalJSON accepts a JSON string or number.
func (p *Priority) UnmarshalJSON(b []byte) error {
	var n int
	if err := json.Unmarshal(b, &n); err == nil {
		if !Priority(n).Valid() {
			return fmt.Errorf("invalid priority %d: want 1-4", n)
		}
		*p = Priority(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("invalid priority %s: want a name or 1-4", b)
	}
	return p.UnmarshalText([]byte(s))
}
