package httpapi

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
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

// readyCache runs the readiness checks at most once per readyMaxAge, one
// at a time: while a check runs, the other probes wait for its result
// instead of starting their own.
type readyCache struct {
	ready, degradable map[string]Pinger

	mu      sync.Mutex
	last    readiness     // guarded by mu
	at      time.Time     // when last was checked; zero before the first check
	running chan struct{} // closed when the check in flight ends; nil when none
}

// get returns a result at most readyMaxAge old, checking if there is
// none. The caller whose probe starts a check runs it (no goroutine of
// its own); a caller that gives up waiting gets the last result, or not
// ready before the first.
func (rc *readyCache) get(ctx context.Context) readiness {
	rc.mu.Lock()
	if !rc.at.IsZero() && time.Since(rc.at) < readyMaxAge {
		r := rc.last
		rc.mu.Unlock()
		return r
	}
	if wait := rc.running; wait != nil {
		rc.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
		}
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return rc.last
	}
	done := make(chan struct{})
	rc.running = done
	rc.mu.Unlock()

	// The check answers every waiting probe: the caller going away must
	// not cut it short.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
	r := rc.check(cctx)
	cancel()
	rc.mu.Lock()
	rc.last, rc.at, rc.running = r, time.Now(), nil
	rc.mu.Unlock()
	close(done)
	return r
}

func (rc *readyCache) check(ctx context.Context) readiness {
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
	r.ready = len(ping(rc.ready)) == 0
	r.degraded = ping(rc.degradable)
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
	r := s.readiness.get(c.Request.Context())
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
