package httpapi

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/recent"
)

// Readiness answers.
const (
	// readyMaxAge is how long one readiness check answers every /readyz:
	// a flood of probes costs Redis and PostgreSQL one check a second, and
	// no probe takes a PostgreSQL pool connection of its own.
	readyMaxAge = time.Second
	// readyTimeout bounds one check of all the dependencies.
	readyTimeout = 2 * time.Second
)

// readiness is the result of one check of the dependencies.
type readiness struct {
	ready    bool
	checks   map[string]string // dependency → "ok" or "down"
	degraded []string          // degradable dependencies down, sorted
}

// newReadiness returns /readyz's shared check of the dependencies: run at
// most once per readyMaxAge, one at a time, the other probes waiting for
// its result (pkg/recent).
func newReadiness(ready, degradable map[string]Pinger) *recent.Value[readiness] {
	return &recent.Value[readiness]{MaxAge: readyMaxAge, Load: func(ctx context.Context) (readiness, error) {
		ctx, cancel := context.WithTimeout(ctx, readyTimeout)
		defer cancel()
		return check(ctx, ready, degradable), nil
	}}
}

// check pings every dependency.
func check(ctx context.Context, ready, degradable map[string]Pinger) readiness {
	r := readiness{checks: map[string]string{}}
	ping := func(pings map[string]Pinger) (down []string) {
		for name, p := range pings {
			r.checks[name] = "ok"
			if err := p(ctx); err != nil {
				r.checks[name] = "down"
				down = append(down, name)
			}
		}
		slices.Sort(down)
		return down
	}
	r.ready = len(ping(ready)) == 0
	r.degraded = ping(degradable)
	return r
}

// healthz is liveness: it answers as long as the process serves HTTP, and
// checks nothing.
func healthz(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) }

// ready is /readyz. Without credentials it answers only 200 {"status":
// "ok"} or 503 {"status": "unavailable"}, for load balancers; with the
// admin token it also names each dependency's state and the degraded
// ones. Credentials other than the admin token are a 401, so that an
// operator's typo does not look like a minimal answer.
func (s *Server) ready(c *gin.Context) {
	detailed := hasCredentials(c.Request)
	if detailed && !s.isAdmin(c.Request) {
		s.adminRefused(c)
		return
	}
	r, _, _ := s.readiness.Get(c.Request.Context()) // a probe that went away: not ready
	status, word := http.StatusOK, "ok"
	if !r.ready {
		status, word = http.StatusServiceUnavailable, "unavailable"
	}
	if !detailed {
		c.JSON(status, gin.H{"status": word})
		return
	}
	out := gin.H{"status": word, "ready": r.ready, "checks": r.checks}
	if len(r.degraded) > 0 {
		out["degraded"] = r.degraded
	}
	c.JSON(status, out)
}
