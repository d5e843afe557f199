package intake

import (
	"context"
	"time"

	"bulwark/pkg/job"
	"bulwark/pkg/metrics"
	"bulwark/pkg/progress"
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
	hit, err := in.cache.Lookup(ctx, j)
	if err != nil {
		in.metrics.CacheLookups.WithLabelValues(layer, metrics.CacheResultError).Inc()
		return nil, false // fail open: the cache logs and counts its own outage
	}
	if hit.Kind != "exact" && hit.Kind != "semantic" {
		in.metrics.CacheLookups.WithLabelValues(layer, metrics.CacheResultMiss).Inc()
		return nil, false
	}
	in.metrics.CacheLookups.WithLabelValues(layer, hit.Kind).Inc()
	now := time.Now()
	route := hit.Route
	if route.Provider == "" {
		route = j.Route
	}
	st := job.State{Cached: hit.Kind, Similarity: hit.Similarity, CacheAge: hit.Age, Result: hit.Response,
		ServedRoute: &route, StartedAt: now, FinishedAt: now}
	id, created, err := in.jobs.Create(ctx, j, job.Event{Type: job.EventQueued}, s.IdempotencyKey)
	if err != nil {
		return nil, false
	}
	if !created {
		a, err := in.existing(ctx, id, s.Lang)
		return a, err == nil
	}
	res := job.ResultOf(st)
	if _, err := in.jobs.Apply(ctx, id, job.Change{Status: job.StatusCompleted, State: &st,
		Event: &job.Event{Type: job.EventCompleted, Provider: route.Provider, Tier: route.Tier, Result: res}}); err != nil {
		return nil, false
	}
	if in.history != nil {
		in.history.Submitted(ctx, j, job.StatusCompleted, hit.Kind)
	}
	in.metrics.Requests.WithLabelValues(j.Priority.String(), metrics.StatusCompleted).Inc()
	in.metrics.RequestDuration.WithLabelValues(j.Priority.String(), metrics.CachedTrue).Observe(time.Since(j.CreatedAt).Seconds())
	return &Accepted{ID: id, Status: job.StatusCompleted, Priority: j.Priority, Cached: hit.Kind,
		Similarity: hit.Similarity, CacheAge: hit.Age, Result: res}, true
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
		st.Cached, st.CoalescedInto = "coalesced", leader
		res := job.ResultOf(st)
		if _, err := in.jobs.Apply(ctx, j.ID, job.Change{Status: job.StatusCompleted, State: &st,
			Event: &job.Event{Type: job.EventCompleted, Provider: res.Provider, Tier: res.Tier, Result: res}}); err != nil {
			return nil, false, err
		}
		in.metrics.Coalesced.Inc()
		if in.history != nil {
			in.history.Submitted(ctx, j, job.StatusCompleted, "coalesced")
		}
		return &Accepted{ID: j.ID, Status: job.StatusCompleted, Priority: j.Priority, Cached: "coalesced", Result: res}, true, nil
	case lrec.Status.Terminal():
		return nil, false, nil // the leader failed or was cancelled: run our own
	}
	st := job.State{CoalescedInto: leader, Cached: "coalesced"}
	if _, err := in.jobs.Apply(ctx, j.ID, job.Change{State: &st}); err != nil {
		return nil, false, err
	}
	in.metrics.Coalesced.Inc()
	if in.history != nil {
		in.history.Submitted(ctx, j, job.StatusQueued, "coalesced")
	}
	a := &Accepted{ID: j.ID, Status: lrec.Status, Priority: j.Priority, CoalescedInto: leader}
	if lrec.Status == job.StatusQueued {
		pos, _ := in.queue.Position(ctx, leader)
		a.Position = max(pos, 1)
		a.ETA, _ = in.queue.ETA(ctx, a.Position)
		a.Message = progress.QueuedMessage(s.Lang, a.Position, int(a.ETA.Seconds()))
	}
	return a, true, nil
}
