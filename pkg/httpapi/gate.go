package httpapi

import "sync"

// gate counts what each tenant holds open on this API process (event
// streams, synchronous waits) against its limit. A process-local count is
// the resource it protects: goroutines, sockets and Redis subscriptions of
// this process.
type gate struct {
	mu   sync.Mutex
	held map[string]int
}

func newGate() *gate { return &gate{held: map[string]int{}} }

// enter takes one place for tenant if it holds fewer than limit (limit <= 0:
// unlimited); the caller calls leave once done.
func (g *gate) enter(tenant string, limit int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if limit > 0 && g.held[tenant] >= limit {
		return false
	}
	g.held[tenant]++
	return true
}

func (g *gate) leave(tenant string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held[tenant]--; g.held[tenant] <= 0 {
		delete(g.held, tenant)
	}
}
