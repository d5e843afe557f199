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
	"bulwark/pkg/priority"
	"bulwark/pkg/provider"
)

// step is what an attempt does after a failed call.
type step int

const (
	nextKey        step = iota // another key of the same route, at once
	nextKeyBackoff             // another key of the same route, after a jittered backoff
	nextRoute                  // leave this route for this attempt: the other provider
	failRequest                // the request itself is wrong: it fails
)

// consequence is everything one failure class causes, said once.
type consequence struct {
	// breaker is reported to the route's breaker. Only the provider
	// refusing the route counts: overload, a missing model, and a 429 on a
	// key the provider refuses again after its cooldown (againOnly). 5xx
	// and timeouts are noise a retry absorbs; they never open a breaker.
	breaker breaker.Outcome
	// againOnly: the breaker outcome counts only for a key the provider
	// refuses again after its cooldown (its consecutive 429s >= 2); a
	// first 429 on a paced key is arrival jitter, information about that
	// key, and is Ignored.
	againOnly bool
	// key is done to the key that failed (keypool.Action).
	key keypool.Action
	// next is where the attempt goes.
	next step
	// event is the error text of the "retrying" event the caller sees;
	// empty sends none. It never quotes the provider's message.
	event string
}

// consequences is the one table of what each failure class does. An error
// that is not an *llm.Error (a transport failure we could not classify) is
// treated as transient.
var consequences = map[llm.Class]consequence{
	llm.ClassRateLimited:      {breaker.Failure, true, keypool.Cool, nextKey, "rate limited"},
	llm.ClassQuota:            {breaker.Ignore, false, keypool.Disable, nextKey, "key unavailable (quota)"},
	llm.ClassAuth:             {breaker.Ignore, false, keypool.Disable, nextKey, "key unavailable (auth)"},
	llm.ClassOverloaded:       {breaker.Failure, false, keypool.Refund, nextRoute, "provider overloaded"},
	llm.ClassModelUnavailable: {breaker.Failure, false, keypool.Refund, nextRoute, "model unavailable"},
	llm.ClassTransient:        {breaker.Ignore, false, keypool.Refund, nextKeyBackoff, "provider error"},
	llm.ClassPermanent:        {breaker.Ignore, false, keypool.Refund, failRequest, ""},
}

// capacityFull is the row of a provisioned deployment's 429
// (llm.CodeCapacityFull): the key waits out its Retry-After and the next
// key is tried at once; the breaker does not count it, the provider is
// not refusing.
var capacityFull = consequence{breaker.Ignore, false, keypool.Full, nextKey, "provisioned capacity full"}

// consequenceOf returns the table row for err.
func consequenceOf(err error) consequence {
	if e, ok := errors.AsType[*llm.Error](err); ok && e.Code == llm.CodeCapacityFull {
		return capacityFull
	}
	class, ok := llm.ClassOf(err)
	if !ok {
		class = llm.ClassTransient
	}
	c, ok := consequences[class]
	if !ok {
		return consequences[llm.ClassTransient]
	}
	return c
}

// outcome of trying every route once.
type outcome struct {
	resp  *llm.Response
	route llm.Route
	keyID string
	// clamped is set when resp's call was sent with fewer max_tokens than
	// the request asked (clampMaxTokens).
	clamped *job.Clamp
	// permanent is a caller fault: fail the request with code.
	permanent error
	code      job.Code
	// transient is the last transient failure, if any.
	transient error
	// exhausted is true when some route had no capacity; retryAfter is the
	// earliest time any route will have.
	exhausted  bool
	retryAfter time.Duration
	// saved is what prompt compression took off the request's tokens.
	saved int
	// refused is true when the provider refuses the route: its breaker is
	// open, every key is disabled, or it answered overloaded / model
	// unavailable. Our own pacing, cooling keys, 5xx, timeouts and Redis
	// errors are not refusals.
	refused bool
}

// routeResult of one route.
type routeResult int

const (
	routeOK routeResult = iota
	routeExhausted
	routePermanent
	routeTransient
	routeCancelled
	routeNoKeys // the pool has no key for the route: skip it
)

// halfOpenRecheck bounds how long a request waits on a half-open breaker
// whose probe is out: the probe usually reports within a call's latency,
// long before its lease (the longest call) would expire.
const halfOpenRecheck = 2 * time.Second

// allRecheck bounds the wait on an open "all" breaker, so a queued request
// re-checks soon after recovery.
const allRecheck = 5 * time.Second

// callRoutes tries the asked route, then its fallback. The "all" breaker
// guards the whole attempt and counts a failure only when every route with
// keys refused (see outcome.refused): a storm our own pacing holds back,
// keys cooling after a few 429s, or a provider's 5xx never open it.
func (d *Dispatcher) callRoutes(ctx context.Context, rec *job.Record, p priority.Priority, log *slog.Logger) outcome {
	var out outcome
	all, err := d.breakers.Allow(ctx, breaker.AllName)
	if err != nil {
		var oe *breaker.OpenError
		if errors.As(err, &oe) {
			out.exhausted, out.refused, out.retryAfter = true, true, min(oe.RetryAfter, allRecheck)
			return out
		}
		out.transient = err
		return out
	}
	routes := []llm.Route{rec.Job.Route}
	if d.cfg.RouteOrder != nil {
		routes = d.cfg.RouteOrder(rec.Job.Route, rec.Job.Layer)
	}
	req, saved := rec.Job.Request, 0
	if d.cfg.Compress != nil && !rec.Job.NoCompress {
		req, saved = d.cfg.Compress(&rec.Job.Request)
	}
	refused, tried := 0, 0
	// The wait is the soonest any route may go again, whatever order
	// the routes failed in.
	waitSet := false
	soonest := func(d time.Duration) {
		if !waitSet || d < out.retryAfter {
			out.retryAfter = d
		}
		waitSet = true
	}
	for i, r := range routes {
		res, rr := d.callRoute(ctx, rec, r, req, p, log)
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
		if res.refused {
			refused++
		}
		switch rr {
		case routeOK:
			_ = all.Done(ctx, breaker.Success)
			res.saved = saved
			return res
		case routeCancelled:
			_ = all.Done(context.WithoutCancel(ctx), breaker.Ignore)
			return res
		case routePermanent:
			_ = all.Done(ctx, breaker.Ignore)
			return res
		case routeExhausted:
			soonest(res.retryAfter)
			out.exhausted = true
		case routeTransient:
			out.transient = res.transient
			soonest(time.Second)
		}
	}
	if tried == 0 {
		_ = all.Done(ctx, breaker.Ignore)
		out.permanent = fmt.Errorf("no provider key is configured for %s or its fallback", rec.Job.Route)
		out.code = job.CodeNoRoute
		return out
	}
	if refused == tried {
		out.refused = true
		_ = all.DoneReason(ctx, breaker.Failure, "every provider route refuses")
	} else {
		_ = all.Done(ctx, breaker.Ignore)
	}
	if out.transient != nil && out.exhausted {
		out.transient = nil // capacity, not an error, is what we wait for
	}
	return out
}

// callRoute makes up to MaxKeyTries calls on one route. The request waits
// for a key in the route's line as priority p (most urgent first, then
// oldest first); a turn further than PaceWait away returns routeExhausted.
func (d *Dispatcher) callRoute(ctx context.Context, rec *job.Record, r llm.Route, req llm.Request, p priority.Priority,
	log *slog.Logger) (outcome, routeResult) {
	client := d.cfg.Clients[r.Provider]
	req.Model = d.cfg.ModelName(r)
	clamped := d.clampMaxTokens(&req, r)
	if req.MaxTokensDefault && r.Provider == llm.ProviderClaude && d.cfg.OutputLimit != nil {
		// Anthropic requires max_tokens: the model's limit, which it also
		// meters (its OTPM is estimated from max_tokens), so the estimate
		// below reserves it too. OpenAI is sent none (llm.Request).
		req.MaxTokens = d.cfg.OutputLimit(r)
	}
	// Split: an Anthropic key meters the prompt and max_tokens apart.
	est := llm.EstimateRequest(&req)
	var lastErr error
	backoff := 100 * time.Millisecond
	for try := 0; try < d.cfg.MaxKeyTries; try++ {
		permit, err := d.breakers.Allow(ctx, r.String())
		if err != nil {
			var oe *breaker.OpenError
			if errors.As(err, &oe) {
				wait := oe.RetryAfter
				if oe.State == breaker.StateHalfOpen {
					wait = min(wait, halfOpenRecheck)
				}
				return outcome{exhausted: true, retryAfter: wait, refused: true}, routeExhausted
			}
			return outcome{transient: err}, routeTransient
		}
		lease, out, rr := d.acquire(ctx, r, est, keypool.Waiter{ID: rec.Job.ID, Priority: p, Since: rec.Job.CreatedAt})
		if lease == nil {
			_ = permit.Done(context.WithoutCancel(ctx), breaker.Ignore)
			return out, rr
		}
		if !sleep(ctx, lease.Delay()) {
			_ = d.pool.Return(context.WithoutCancel(ctx), lease)
			_ = permit.Done(context.WithoutCancel(ctx), breaker.Ignore)
			return outcome{}, routeCancelled
		}
		start := time.Now()
		res, streamed, err := d.callKey(ctx, client, lease, permit, rec, &req, log)
		d.metrics.ObserveCall(r, lease.KeyID, err, time.Since(start))
		if streamed {
			rec.State.Streamed = true
		}
		if err == nil {
			if err := d.pool.Success(ctx, lease, res.Response.Usage, res.RateLimit); err != nil {
				log.Warn("dispatch: settle key", "key_id", lease.KeyID, "err", err)
			}
			_ = permit.Done(ctx, breaker.Success)
			return outcome{resp: res.Response, route: r, keyID: lease.KeyID, clamped: clamped}, routeOK
		}
		if ctx.Err() != nil {
			_ = d.pool.Release(context.WithoutCancel(ctx), lease)
			_ = permit.Done(context.WithoutCancel(ctx), breaker.Ignore)
			return outcome{}, routeCancelled
		}
		lastErr = err
		c := d.failed(ctx, rec, r, lease, permit, err, log)
		if streamed {
			// The caller holds part of this answer: no other key, route
			// or retry may write a second one after it.
			return outcome{permanent: err, code: job.CodeInterrupted}, routePermanent
		}
		switch c.next {
		case nextRoute:
			return outcome{transient: err, refused: true}, routeTransient
		case failRequest:
			return outcome{permanent: err, code: job.CodeProviderError}, routePermanent
		case nextKeyBackoff:
			if !sleep(ctx, backoff/2+rand.N(backoff/2+1)) {
				return outcome{}, routeCancelled
			}
			backoff *= 2
		}
	}
	return outcome{transient: lastErr}, routeTransient
}

// clampMaxTokens lowers req's max_tokens to what route r's model accepts
// and reports the change, nil when there was none. Intake refused a
// request above its own route's limit, so only another route (a
// fallback, a routing rule's route first) with a smaller model clamps:
// sending more would be a 400, the request failing for a limit its
// caller never chose.
func (d *Dispatcher) clampMaxTokens(req *llm.Request, r llm.Route) *job.Clamp {
	if d.cfg.OutputLimit == nil {
		return nil
	}
	limit := d.cfg.OutputLimit(r)
	if limit <= 0 || req.MaxTokens <= limit {
		return nil
	}
	c := &job.Clamp{From: req.MaxTokens, To: limit}
	req.MaxTokens = limit
	return c
}

// callKey makes the call on lease's key, streamed (stream.go) when rec
// asks for it and the adapter can; streamed reports that deltas reached
// the request's events. Should the adapter panic, the key's lease is
// released and the breaker permit (maybe a half-open probe) handed back
// before the panic goes on to asynq's recovery: neither waits for its
// expiry.
func (d *Dispatcher) callKey(ctx context.Context, client llm.Client, lease *keypool.Lease, permit *breaker.Permit,
	rec *job.Record, req *llm.Request, log *slog.Logger) (res *llm.Result, streamed bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			_ = d.pool.Release(context.WithoutCancel(ctx), lease)
			_ = permit.Done(context.WithoutCancel(ctx), breaker.Ignore)
			panic(p)
		}
	}()
	s, ok := client.(llm.Streamer)
	if !rec.Job.Stream || !ok {
		res, err = client.Complete(ctx, lease.Cred, req)
		return res, false, err
	}
	w := d.streamTo(ctx, rec, log)
	defer func() { streamed = w.close() }() // sets the result once every delta is written
	res, err = s.Stream(ctx, lease.Cred, req, w.emit)
	return res, false, err
}

// acquire reserves a key of r for waiter w. Without a lease it returns
// the route's outcome instead.
//
// The request waits in the route's line (keypool.InLine), holding its
// slot, while its turn is at most PaceWait away: the keys' requests go to
// the waiters most urgent first, then oldest first, whoever asks first, so
// a CRITICAL request never waits behind LOW ones and a request is not
// overtaken by younger ones of its priority. A turn further away leaves
// the line: the route counts as exhausted (fallback, or the slot is given
// back while the request waits).
func (d *Dispatcher) acquire(ctx context.Context, r llm.Route, est llm.Estimate, w keypool.Waiter) (*keypool.Lease, outcome, routeResult) {
	var ee *keypool.ExhaustedError
	start := time.Now()
	for {
		lease, err := d.pool.Acquire(ctx, r, est.Total(), keypool.Split(est.Input, est.Output),
			keypool.Within(reserveAhead), keypool.InLine(w))
		if err == nil {
			d.metrics.KeyWait.WithLabelValues(w.Priority.String(), string(r.Provider), r.Tier).
				Observe((time.Since(start) + lease.Delay()).Seconds())
			return lease, outcome{}, routeOK
		}
		soft := errors.As(err, &ee) && softReason(ee.Reason)
		if !soft || ee.RetryAfter > d.cfg.PaceWait {
			d.leaveLine(ctx, r, w.ID)
			return d.notAcquired(err)
		}
		if !sleep(ctx, min(max(ee.RetryAfter, minPaceRecheck), lineRecheckMax)) {
			d.leaveLine(ctx, r, w.ID)
			return nil, outcome{}, routeCancelled
		}
	}
}

// leaveLine takes a waiter that stops asking out of r's line, so that its
// place does not hold back the waiters behind it until it lapses.
func (d *Dispatcher) leaveLine(ctx context.Context, r llm.Route, id string) {
	if err := d.pool.Leave(context.WithoutCancel(ctx), r, id); err != nil && !errors.Is(err, keypool.ErrUnknownRoute) {
		d.logger.Warn("dispatch: leave the key line", "request_id", id, "route", r.String(), "err", err)
	}
}

// reserveAhead is how far ahead of a key's next free moment a waiter may
// reserve it (keypool.Within): the head of the line reserves the moment
// just before it comes and calls exactly on it. It also bounds how much of
// the keys' time is already promised when a more urgent request arrives:
// at most this long, plus one refill, stands between a CRITICAL request
// and its key.
const reserveAhead = 20 * time.Millisecond

// minPaceRecheck and lineRecheckMax bound the sleep of a waiter between
// two asks: the pool's estimate of its turn, within these bounds. The
// upper one keeps its place alive (keypool.Config.LineTTL, 1 s) and
// notices a turn that came sooner than estimated (calls ending early).
const (
	minPaceRecheck = 5 * time.Millisecond
	lineRecheckMax = 200 * time.Millisecond
)

// softReason reports whether a key pool refusal is a bucket refilling
// (worth waiting for in line) rather than a cooling, full or disabled key.
func softReason(reason string) bool {
	switch reason {
	case keypool.ReasonRequests, keypool.ReasonTokens, keypool.ReasonInputTokens, keypool.ReasonOutputTokens:
		return true
	}
	return false
}

// notAcquired turns a failed Acquire into the route's outcome.
func (d *Dispatcher) notAcquired(err error) (*keypool.Lease, outcome, routeResult) {
	var ee *keypool.ExhaustedError
	switch {
	case errors.As(err, &ee):
		return nil, outcome{exhausted: true, retryAfter: ee.RetryAfter, refused: ee.Reason == keypool.ReasonDisabled}, routeExhausted
	case errors.Is(err, keypool.ErrUnknownRoute):
		return nil, outcome{}, routeNoKeys
	case errors.Is(err, keypool.ErrTooLarge):
		return nil, outcome{permanent: err, code: job.CodeProviderError}, routePermanent
	default:
		return nil, outcome{transient: err}, routeTransient
	}
}

// failed carries out the consequence of a failed call: the key's action,
// the breaker's outcome, metrics, alerts and the caller's event.
func (d *Dispatcher) failed(ctx context.Context, rec *job.Record, r llm.Route, lease *keypool.Lease,
	permit *breaker.Permit, err error, log *slog.Logger) consequence {
	c := consequenceOf(err)
	class, _ := llm.ClassOf(err)
	// Adapters redact what the provider said; the transport error they
	// wrap (an address, a proxy's URL) is redacted here.
	log.Info("dispatch: provider call failed", "route", r.String(), "key_id", lease.KeyID, "class", string(class),
		"err", provider.Redact(err.Error()))
	if ferr := d.pool.Failure(ctx, lease, c.key, err); ferr != nil {
		log.Warn("dispatch: record key failure", "key_id", lease.KeyID, "err", ferr)
	}
	outcome := c.breaker
	if c.againOnly && lease.Consecutive429s() < 2 {
		outcome = breaker.Ignore
	}
	_ = permit.DoneReason(ctx, outcome, fmt.Sprintf("%s from %s", class, lease.KeyID))
	switch c.key {
	case keypool.Cool:
		d.metrics.KeyCooldowns.WithLabelValues(lease.KeyID).Inc()
	case keypool.Disable:
		d.metrics.KeysDisabled.WithLabelValues(lease.KeyID).Inc()
		if d.alerter != nil {
			d.alerter.KeyDisabled(ctx, lease.KeyID, r, string(class))
		}
	}
	if c.event != "" {
		d.event(ctx, rec, job.Event{Type: job.EventRetrying, Provider: r.Provider, Tier: r.Tier, Error: c.event})
	}
	return c
}

// event records ev of a request being served: its status is running.
func (d *Dispatcher) event(ctx context.Context, rec *job.Record, ev job.Event) {
	ev.Status = job.StatusRunning
	if _, err := d.jobs.Apply(ctx, rec.Job.ID, job.Change{Event: &ev, Tenant: rec.Job.Tenant}); err != nil && !errors.Is(err, job.ErrTerminal) {
		d.logger.Warn("dispatch: event", "request_id", rec.Job.ID, "err", err)
	}
}

// sleep waits d or until ctx ends; it reports whether it waited in full.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
