package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"bulwark/pkg/breaker"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
)

// outcome of trying every route once.
type outcome struct {
	resp  *llm.Response
	route llm.Route
	keyID string
	// permanent is a caller fault: fail the request.
	permanent error
	// transient is the last transient failure, if any.
	transient error
	// exhausted is true when some route had no capacity; retryAfter is the
	// earliest time any route will have.
	exhausted  bool
	retryAfter time.Duration
	// shut is true when a route is exhausted by the provider (cooling or
	// disabled keys, an open breaker) rather than by our own pacing.
	shut bool
}

// routeResult of one route.
type routeResult int

const (
	routeOK routeResult = iota
	routeExhausted
	routePermanent
	routeTransient
	routeOverloaded
	routeCancelled
	routeNoKeys // the pool has no key for the route: skip it
)

// callRoutes tries the asked route, then its fallback. The "all" breaker
// guards the whole attempt: it counts a failure only when every route was
// shut by real 429s (cooling keys, open breakers), not when our own pacing
// says to wait a second for a bucket to refill, so that proactive pacing
// never opens it.
func (d *Dispatcher) callRoutes(ctx context.Context, rec *job.Record, log *slog.Logger) outcome {
	var out outcome
	all, err := d.breakers.Allow(ctx, breaker.AllName)
	if err != nil {
		var oe *breaker.OpenError
		if errors.As(err, &oe) {
			// Everything is known exhausted: wait for the probe, capped so a
			// queued request re-checks often enough to start soon after recovery.
			out.exhausted, out.retryAfter = true, min(oe.RetryAfter, 5*time.Second)
			return out
		}
		out.transient = err
		return out
	}
	routes := []llm.Route{rec.Job.Route}
	if fb, ok := d.cfg.Fallback(rec.Job.Route); ok {
		routes = append(routes, fb)
	}
	shut, tried := 0, 0 // routes exhausted by cooldowns or open breakers; routes with keys
	for i, r := range routes {
		res, rr := d.callRoute(ctx, rec, r, log)
		if rr != routeNoKeys {
			tried++
		}
		if i > 0 && rr != routeNoKeys && rr != routeExhausted {
			// Reported once a call went to the fallback route (before the
			// completed event), not for a fallback that had no room either.
			d.metrics.Fallbacks.WithLabelValues(routes[0].String(), r.String()).Inc()
			d.event(ctx, rec, job.Event{Type: job.EventFallback, From: routes[0].String(), Provider: r.Provider, Tier: r.Tier})
			log.Info("dispatch: fell back", "from", routes[0].String(), "to", r.String())
		}
		switch rr {
		case routeOK:
			_ = all.Done(ctx, breaker.Success)
			return res
		case routeCancelled:
			_ = all.Done(context.WithoutCancel(ctx), breaker.Ignore)
			return res
		case routePermanent:
			_ = all.Done(ctx, breaker.Ignore)
			return res
		case routeExhausted:
			if !out.exhausted || res.retryAfter < out.retryAfter {
				out.retryAfter = res.retryAfter
			}
			out.exhausted = true
			if res.shut {
				shut++
			}
		case routeOverloaded, routeTransient:
			out.transient = res.transient
			shut++
			if !out.exhausted || time.Second < out.retryAfter {
				out.retryAfter = time.Second
			}
		}
	}
	if tried == 0 {
		_ = all.Done(ctx, breaker.Ignore)
		out.permanent = fmt.Errorf("no provider key is configured for %s or its fallback", rec.Job.Route)
		return out
	}
	if shut == tried {
		_ = all.DoneReason(ctx, breaker.Failure, "all provider routes exhausted")
	} else {
		_ = all.Done(ctx, breaker.Ignore)
	}
	if out.transient != nil && out.exhausted {
		out.transient = nil // capacity, not an error, is what we wait for
	}
	return out
}

// callRoute makes up to MaxKeyTries calls on one route.
func (d *Dispatcher) callRoute(ctx context.Context, rec *job.Record, r llm.Route, log *slog.Logger) (outcome, routeResult) {
	client := d.cfg.Clients[r.Provider]
	req := rec.Job.Request
	req.Model = d.cfg.ModelName(r)
	est := llm.EstimateTokens(&req)
	var lastErr error
	backoff := 100 * time.Millisecond
	for try := 0; try < d.cfg.MaxKeyTries; try++ {
		permit, err := d.breakers.Allow(ctx, r.String())
		if err != nil {
			var oe *breaker.OpenError
			if errors.As(err, &oe) {
				return outcome{exhausted: true, retryAfter: oe.RetryAfter, shut: true}, routeExhausted
			}
			return outcome{transient: err}, routeTransient
		}
		lease, err := d.pool.Acquire(ctx, r, est)
		if err != nil {
			_ = permit.Done(ctx, breaker.Ignore)
			var ee *keypool.ExhaustedError
			switch {
			case errors.As(err, &ee):
				shut := ee.Reason == keypool.ReasonCooling || ee.Reason == keypool.ReasonDisabled
				return outcome{exhausted: true, retryAfter: ee.RetryAfter, shut: shut}, routeExhausted
			case errors.Is(err, keypool.ErrUnknownRoute):
				return outcome{}, routeNoKeys
			case errors.Is(err, keypool.ErrTooLarge):
				return outcome{permanent: err}, routePermanent
			default:
				return outcome{transient: err}, routeTransient
			}
		}
		start := time.Now()
		res, err := client.Complete(ctx, lease.APIKey, &req)
		d.metrics.ObserveCall(r, lease.KeyID, err, time.Since(start))
		if err == nil {
			if err := d.pool.Success(ctx, lease, res.Response.Usage, res.RateLimit); err != nil {
				log.Warn("dispatch: settle key", "key_id", lease.KeyID, "err", err)
			}
			_ = permit.Done(ctx, breaker.Success)
			return outcome{resp: res.Response, route: r, keyID: lease.KeyID}, routeOK
		}
		if ctx.Err() != nil {
			_ = d.pool.Release(context.WithoutCancel(ctx), lease)
			_ = permit.Done(context.WithoutCancel(ctx), breaker.Ignore)
			return outcome{}, routeCancelled
		}
		if ferr := d.pool.Failure(ctx, lease, err); ferr != nil {
			log.Warn("dispatch: record key failure", "key_id", lease.KeyID, "err", ferr)
		}
		lastErr = err
		class, _ := llm.ClassOf(err)
		log.Info("dispatch: provider call failed", "route", r.String(), "key_id", lease.KeyID, "class", string(class), "err", err)
		switch class {
		case llm.ClassRateLimited:
			d.metrics.KeyCooldowns.WithLabelValues(lease.KeyID).Inc()
			_ = permit.DoneReason(ctx, breaker.Failure, "429 from "+lease.KeyID)
			d.event(ctx, rec, job.Event{Type: job.EventRetrying, Provider: r.Provider, Tier: r.Tier, Error: "rate limited"})
		case llm.ClassQuota, llm.ClassAuth:
			_ = permit.Done(ctx, breaker.Ignore)
			d.metrics.KeysDisabled.WithLabelValues(lease.KeyID).Inc()
			if d.alerter != nil {
				d.alerter.KeyDisabled(ctx, lease.KeyID, r, string(class))
			}
			d.event(ctx, rec, job.Event{Type: job.EventRetrying, Provider: r.Provider, Tier: r.Tier, Error: "key unavailable (" + string(class) + ")"})
		case llm.ClassOverloaded:
			// The provider is overloaded for everyone: another key of it
			// would fare no better; the other provider might.
			_ = permit.DoneReason(ctx, breaker.Failure, "provider overloaded")
			return outcome{transient: err}, routeOverloaded
		case llm.ClassPermanent:
			_ = permit.Done(ctx, breaker.Ignore)
			return outcome{permanent: err}, routePermanent
		default: // transient and unclassified
			_ = permit.Done(ctx, breaker.Ignore)
			if !sleep(ctx, backoff/2+rand.N(backoff/2+1)) {
				return outcome{}, routeCancelled
			}
			backoff *= 2
		}
	}
	return outcome{transient: lastErr}, routeTransient
}

func (d *Dispatcher) event(ctx context.Context, rec *job.Record, ev job.Event) {
	if _, err := d.jobs.Apply(ctx, rec.Job.ID, job.Change{Event: &ev}); err != nil && !errors.Is(err, job.ErrTerminal) {
		d.logger.Warn("dispatch: event", "request_id", rec.Job.ID, "err", err)
	}
}

// sleep waits d or until ctx ends; it reports whether it waited in full.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
