package httpapi

import (
	"sync"

	"golang.org/x/time/rate"
)

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

// readLimits holds each tenant's token bucket of reads on this API process
// (intake.Tenant.MaxReadsPerSecond). A read costs Redis a record or a
// history row; without a bound one tenant polling in a tight loop takes
// the process and Redis from the others. golang.org/x/time/rate is the
// bucket: Allow is what a read asks, without waiting.
type readLimits struct {
	mu  sync.Mutex
	per map[string]*rate.Limiter
}

func newReadLimits() *readLimits { return &readLimits{per: map[string]*rate.Limiter{}} }

// allow reports whether tenant may read now at perSecond (a burst of two
// seconds' worth; <= 0: unlimited).
func (l *readLimits) allow(tenant string, perSecond int) bool {
	if perSecond <= 0 {
		return true
	}
	l.mu.Lock()
	lim, ok := l.per[tenant]
	if !ok || lim.Limit() != rate.Limit(perSecond) {
		lim = rate.NewLimiter(rate.Limit(perSecond), 2*perSecond)
		l.per[tenant] = lim
	}
	l.mu.Unlock()
	return lim.Allow()
}
