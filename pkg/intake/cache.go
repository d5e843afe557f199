package intake

import (
	"context"
	"time"

	"bulwark/pkg/cache"
	"bulwark/pkg/finish"
	"bulwark/pkg/job"
	"bulwark/pkg/metrics"
)

// fromCache answers from layer 1. A hit is stored as a completed request so
// that it can be read and streamed like any other.
func (in *Intake) fromCache(ctx context.Context, j *job.Job, s Submission) (*Accepted, bool) {
	layer := j.Layer
	if in.cache == nil || !in.cfg.CacheEnabled || j.CacheKey == "" {
		return nil, false
	}
	if !j.CacheRead {
		in.metrics.CacheLookups.WithLabelValues(layer, metrics.CacheResultBypass).Inc()
		return nil, false
	}
	hit, err := in.cache.AnswerFor(ctx, j)
	if hit.Embedding != nil {
		j.Embedding = hit.Embedding // for the answer's cache entry: embedded once
	}
	if err != nil {
		in.metrics.CacheLookups.WithLabelValues(layer, metrics.CacheResultError).Inc()
		in.metrics.CacheUnavailable.Inc()
		return nil, false // fail open: the cache logs its own outage
	}
	if !hit.Kind.FromCache() {
		in.metrics.CacheLookups.WithLabelValues(layer, metrics.CacheResultMiss).Inc()
		return nil, false
	}
	in.metrics.CacheLookups.WithLabelValues(layer, string(hit.Kind)).Inc()
	if s.answeredInResponse() {
		// A compat caller has the answer in this response and nothing to
		// find it by again but its id, which history answers: no live
		// record, no Redis round trip (6 commands a hit before).
		rec, err := in.finisher.EndUnstored(ctx, j, finish.Completed(hitState(j, hit)))
		if err != nil {
			return nil, false
		}
		return hitAccepted(rec, hit), true
	}
	// Stored already ended, in one write: answered at once, it takes no
	// share of the queue.
	rec, id, created, err := in.finisher.FinishNew(ctx, j, s.IdempotencyKey, finish.Completed(hitState(j, hit)))
	if err != nil {
		return nil, false
	}
	if !created {
		a, err := in.existing(ctx, id, s)
		return a, err == nil
	}
	return hitAccepted(rec, hit), true
}

// hitState is the final state of j answered by the cache's hit.
func hitState(j *job.Job, hit cache.Found) job.State {
	now := time.Now()
	route := hit.Answer.Route
	if route.Provider == "" {
		route = j.Route
	}
	return job.State{Cached: hit.Kind, Similarity: hit.Similarity, CacheAge: hit.Age, Result: hit.Answer.Response,
		ServedRoute: &route, StartedAt: now, FinishedAt: now}
}

// hitAccepted is the answer to a request rec ended by the cache's hit.
func hitAccepted(rec *job.Record, hit cache.Found) *Accepted {
	return &Accepted{ID: rec.Job.ID, Status: job.StatusCompleted, Priority: rec.Job.Priority, Cached: hit.Kind,
		Similarity: hit.Similarity, CacheAge: hit.Age, Result: job.ResultOf(rec.State), Ended: rec}
}

// completeFromHit ends the stored job j with the cache's answer.
func (in *Intake) completeFromHit(ctx context.Context, j *job.Job, hit cache.Found) (*Accepted, error) {
	rec := &job.Record{Job: *j, Status: job.StatusQueued}
	if err := in.finisher.Finish(ctx, rec, finish.Completed(hitState(j, hit))); err != nil {
		return nil, err
	}
	return hitAccepted(rec, hit), nil
}

// answeredMeanwhile closes the race between a cache miss and winning the
// coalescing claim: an identical request that finished in between stored
// its answer before it released its claim, so the leader looks once more —
// for that exact entry only, one indexed query — and, on a hit, ends j
// with it (and releases the claim) instead of calling the provider again.
func (in *Intake) answeredMeanwhile(ctx context.Context, j *job.Job) (*Accepted, bool) {
	if in.cache == nil || !in.cfg.CacheEnabled || j.CacheKey == "" || !j.CacheRead || in.coalescer == nil {
		return nil, false
	}
	hit, err := in.cache.ExactAnswerFor(ctx, j)
	if err != nil {
		in.metrics.CacheUnavailable.Inc()
	}
	if err != nil || hit.Kind != job.CachedExact {
		return nil, false
	}
	a, err := in.completeFromHit(ctx, j, hit)
	if err != nil {
		return nil, false
	}
	in.metrics.CacheLookups.WithLabelValues(j.Layer, string(hit.Kind)).Inc()
	if err := in.coalescer.Release(ctx, j.CacheKey, j.ID); err != nil {
		in.logger.Warn("intake: release coalescing claim", "request_id", j.ID, "err", err)
	}
	return a, true
}

// coalesce attaches the stored job j to an identical request in flight,
// if there is one: j's record then points at the leader, and reading or
// streaming j follows the leader. A leader that has just completed hands
// over its answer directly.
func (in *Intake) coalesce(ctx context.Context, j *job.Job, s Submission) (*Accepted, bool, error) {
	if in.coalescer == nil || j.CacheKey == "" || !j.CacheRead {
		return nil, false, nil
	}
	leader, err := in.coalescer.Claim(ctx, j.CacheKey, j.ID, in.cfg.MaxWait)
	if err != nil || leader == j.ID {
		return nil, false, nil // we lead (or cannot tell): run it
	}
	lrec, err := in.jobs.Get(ctx, leader)
	if err != nil || lrec.Job.Tenant != j.Tenant {
		return nil, false, nil
	}
	switch {
	case lrec.Status == job.StatusCompleted && lrec.State.Result != nil:
		st := lrec.State
		st.Cached, st.CoalescedInto = job.CachedCoalesced, leader
		st.KeyID, st.StartedAt, st.FinishedAt = "", time.Now(), time.Time{}
		rec := &job.Record{Job: *j, Status: job.StatusQueued}
		if err := in.finisher.Finish(ctx, rec, finish.Completed(st)); err != nil {
			return nil, false, err
		}
		in.metrics.Coalesced.Inc()
		return &Accepted{ID: j.ID, Status: job.StatusCompleted, Priority: j.Priority, Cached: job.CachedCoalesced,
			Result: job.ResultOf(st), Ended: rec}, true, nil
	case lrec.Status.Terminal():
		return nil, false, nil // the leader failed or was cancelled: run our own
	}
	st := job.State{CoalescedInto: leader, Cached: job.CachedCoalesced}
	if _, err := in.jobs.Apply(ctx, j.ID, job.Change{State: &st, Tenant: j.Tenant}); err != nil {
		return nil, false, err
	}
	in.metrics.Coalesced.Inc()
	if in.history != nil {
		in.history.Submitted(ctx, j, job.StatusQueued, job.CachedCoalesced)
	}
	// The shared call runs at the most urgent priority of those waiting
	// on it: a CRITICAL caller must not wait behind a LOW flood because a
	// LOW caller asked first.
	if j.Priority < lrec.Job.Priority && in.promoter != nil {
		if err := in.promoter.Promote(ctx, lrec, j.Priority); err != nil {
			in.logger.Warn("intake: promote the shared call", "request_id", leader, "priority", j.Priority.String(), "err", err)
		}
	}
	a := &Accepted{ID: j.ID, Status: lrec.Status, Priority: j.Priority, CoalescedInto: leader}
	if lrec.Status == job.StatusQueued && !s.Waited {
		in.leaderSpot(ctx, a, leader, s.Lang)
	}
	return a, true, nil
}
