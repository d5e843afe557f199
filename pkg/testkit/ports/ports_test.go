package ports

import (
	"net"
	"strconv"
	"testing"
)

// TestFreeIsBelowTheEphemeralRange: the ports are distinct, bindable and
// outside the range outgoing connections draw from.
func TestFreeIsBelowTheEphemeralRange(t *testing.T) {
	ps, err := Free(5)
	if err != nil {
		t.Fatal(err)
	}
	low := ephemeralLow()
	seen := map[int]bool{}
	for _, p := range ps {
		if p < floor || p >= low || seen[p] {
			t.Fatalf("port %d: want distinct ports in [%d, %d)", p, floor, low)
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d not free: %v", p, err)
		}
		_ = l.Close()
	}
}
