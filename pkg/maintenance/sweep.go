package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/finish"
	"bulwark/pkg/job"
	"bulwark/pkg/priority"
)

// Defaults of the orphan sweep.
const (
	// SweepEveryDefault is how often a worker sweeps.
	SweepEveryDefault = 5 * time.Second
	// OrphanAgeDefault is how old a live request must be before the sweep
	// looks at it: longer than storing and enqueueing take.
	OrphanAgeDefault = 10 * time.Second
	// sweepBatch bounds the requests one sweep reads.
	sweepBatch = 500
)

// LiveJobs is the part of the live store the sweep reads.
type LiveJobs interface {
	Get(ctx context.Context, id string) (*job.Record, error)
	Apply(ctx context.Context, id string, c job.Change) (string, error)
	Live(ctx context.Context, olderThan time.Time, limit int) ([]string, error)
	Forget(ctx context.Context, id string) error
}

// Requeuer re-enqueues a request that has no task (queue.Queue).
type Requeuer interface {
	Requeue(ctx context.Context, id string, p priority.Priority) (requeued, archived bool, err error)
}

// HistoryReplayer writes the request outcomes that history kept while
// PostgreSQL was down (history.Store).
type HistoryReplayer interface {
	Replay(ctx context.Context) (int, error)
}

// Finisher ends requests (pkg/finish).
type Finisher interface {
	Finish(ctx context.Context, rec *job.Record, e finish.Ending) error
}

// Sweeper finds every accepted request that nothing will end on its own,
// and ends or re-runs it, so that each reaches a terminal state:
//
//   - a record with no task (the API died between storing it and
//     enqueueing it, or the enqueue was lost) is enqueued again;
//   - a request whose task asynq archived after its retries fails with
//     job.CodeLost;
//   - a coalesced follower past its own deadline while the shared call has
//     not started fails with it;
//   - a coalesced follower whose leader ended gets its own ending: the
//     leader's answer, the leader's provider failure, or — when the leader
//     ended for a reason of its own (cancelled, its deadline) — a call of
//     its own;
//   - a record that expired without ending leaves the live set;
//   - outcomes that history could not write while PostgreSQL was down are
//     written once it is back.
//
// Every worker runs one; a Redis lock lets one sweep at a time.
type Sweeper struct {
	d       SweeperDeps
	lockKey string

	stop chan struct{}
	done chan struct{}
}

// SweeperDeps are a Sweeper's collaborators and timing.
type SweeperDeps struct {
	Jobs     LiveJobs
	Queue    Requeuer
	Finisher Finisher
	History  HistoryReplayer // optional
	Redis    redis.Cmdable
	Prefix   string // of the lock key
	Logger   *slog.Logger
	// Every is how often it sweeps; default SweepEveryDefault (5s).
	Every time.Duration
	// Age is how old a live request must be to be looked at; default
	// OrphanAgeDefault (10s).
	Age time.Duration
}

// NewSweeper returns a sweeper.
func NewSweeper(d SweeperDeps) *Sweeper {
	if d.Every == 0 {
		d.Every = SweepEveryDefault
	}
	if d.Age == 0 {
		d.Age = OrphanAgeDefault
	}
	return &Sweeper{d: d, lockKey: sweepLockKey(d.Prefix)}
}

// Start runs the sweep every interval until Stop or ctx ends.
func (s *Sweeper) Start(ctx context.Context) {
	if s.stop != nil {
		return
	}
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.d.Every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.stop:
				return
			case <-t.C:
				if err := s.Sweep(ctx); err != nil {
					s.d.Logger.Warn("maintenance: sweep", "err", err)
				}
			}
		}
	}()
}

// Stop ends the loop and waits for it. Safe to call twice or before Start.
func (s *Sweeper) Stop() {
	if s.stop == nil {
		return
	}
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// Sweep runs one sweep unless another process holds the lock.
func (s *Sweeper) Sweep(ctx context.Context) error {
	ok, err := s.d.Redis.SetNX(ctx, s.lockKey, "1", s.d.Every).Result()
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if !ok {
		return nil
	}
	ids, err := s.d.Jobs.Live(ctx, time.Now().Add(-s.d.Age), sweepBatch)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := s.one(ctx, id); err != nil {
			s.d.Logger.Warn("maintenance: sweep a request", "request_id", id, "err", err)
		}
	}
	return s.replayHistory(ctx)
}

// replayHistory writes what history kept; a PostgreSQL still down is the
// normal case of an outage, not worth a warning every sweep.
func (s *Sweeper) replayHistory(ctx context.Context) error {
	if s.d.History == nil {
		return nil
	}
	n, err := s.d.History.Replay(ctx)
	if n > 0 {
		s.d.Logger.Info("maintenance: history caught up", "outcomes_written", n, "err", err)
	}
	if err != nil {
		s.d.Logger.Debug("maintenance: history replay stopped", "err", err)
	}
	return nil
}

// one looks at one live request.
func (s *Sweeper) one(ctx context.Context, id string) error {
	rec, err := s.d.Jobs.Get(ctx, id)
	if errors.Is(err, job.ErrNotFound) {
		return s.d.Jobs.Forget(ctx, id)
	}
	if err != nil {
		return err
	}
	if rec.Status.Terminal() {
		return s.d.Jobs.Forget(ctx, id)
	}
	if rec.State.CoalescedInto != "" {
		return s.follow(ctx, rec)
	}
	requeued, archived, err := s.d.Queue.Requeue(ctx, id, rec.Job.Priority)
	switch {
	case err != nil:
		return err
	case archived:
		s.d.Logger.Warn("maintenance: a request's task was archived after its retries; failing it", "request_id", id)
		return s.end(ctx, rec, finish.Failed(rec.State, job.CodeLost, "lost: its task was archived after its retries"))
	case requeued:
		s.d.Logger.Warn("maintenance: a request had no task (a crash between storing and enqueueing it?); enqueued it again",
			"request_id", id)
	}
	return nil
}

// follow ends a coalesced follower once its leader has ended.
func (s *Sweeper) follow(ctx context.Context, rec *job.Record) error {
	leader, err := s.d.Jobs.Get(ctx, rec.State.CoalescedInto)
	if err != nil && !errors.Is(err, job.ErrNotFound) {
		return err
	}
	if err == nil && !leader.Status.Terminal() {
		if leader.State.StartedAt.IsZero() && time.Now().After(rec.Job.Deadline) {
			// Its own deadline, not the leader's: the wait for a start it
			// was promised is over, whoever else still waits. (Once the
			// shared call runs, the follower runs too: no deadline, as for
			// any running request.)
			reason := fmt.Sprintf("deadline_exceeded: waited %s (queue_max_wait %s) for an identical request still running",
				time.Since(rec.Job.CreatedAt).Round(time.Second), rec.Job.Deadline.Sub(rec.Job.CreatedAt).Round(time.Second))
			return s.end(ctx, rec, finish.Failed(rec.State, job.CodeDeadline, reason))
		}
		return nil
	}
	switch {
	case err == nil && leader.Status == job.StatusCompleted && leader.State.Result != nil:
		st := leader.State
		st.Cached, st.CoalescedInto, st.KeyID, st.FinishedAt = job.CachedCoalesced, leader.Job.ID, "", time.Time{}
		return s.end(ctx, rec, finish.Completed(st))
	case err == nil && leader.Status == job.StatusFailed && leader.SharedEnding():
		return s.end(ctx, rec, finish.Failed(rec.State, leader.Code, leader.Reason))
	}
	// The leader ended for a reason of its own (cancelled, its deadline,
	// lost) or is gone: the follower gets a call of its own.
	st := rec.State
	st.CoalescedInto, st.Cached = "", ""
	if _, err := s.d.Jobs.Apply(ctx, rec.Job.ID, job.Change{State: &st, Tenant: rec.Job.Tenant}); err != nil {
		return err
	}
	_, _, err = s.d.Queue.Requeue(ctx, rec.Job.ID, rec.Job.Priority)
	return err
}

func (s *Sweeper) end(ctx context.Context, rec *job.Record, e finish.Ending) error {
	if err := s.d.Finisher.Finish(ctx, rec, e); err != nil && !errors.Is(err, finish.ErrEnded) {
		return err
	}
	return nil
}
