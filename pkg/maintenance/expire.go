package maintenance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/finish"
	"bulwark/pkg/job"
	"bulwark/pkg/priority"
)

// TaskExpire fails queued requests whose deadline passed while no worker
// took them (all workers down or the queue paused), so no request waits
// forever in silence.
const TaskExpire = "bulwark:queue:expire"

// JobStore is the live request store.
type JobStore interface {
	Get(ctx context.Context, id string) (*job.Record, error)
	Apply(ctx context.Context, id string, c job.Change) (string, error)
}

// Queues lists pending requests and removes them.
type Queues interface {
	Pending(ctx context.Context, p priority.Priority) ([]string, error)
	Cancel(ctx context.Context, id string, p priority.Priority) (bool, error)
}

func (j *Jobs) expire(ctx context.Context, _ *asynq.Task) error {
	if j.d.Jobs == nil || j.d.Queues == nil || j.d.Finisher == nil {
		return nil
	}
	now := time.Now()
	expired := 0
	for _, p := range priority.All {
		ids, err := j.d.Queues.Pending(ctx, p)
		if err != nil {
			return fmt.Errorf("maintenance: expire: %w", err)
		}
		for _, id := range ids {
			rec, err := j.d.Jobs.Get(ctx, id)
			if err != nil || rec.Status.Terminal() || now.Before(rec.Job.Deadline) {
				continue
			}
			reason := fmt.Sprintf("deadline_exceeded: waited %s in the %s queue (queue_max_wait %s) and no worker took it",
				now.Sub(rec.Job.CreatedAt).Round(time.Second), p, rec.Job.Deadline.Sub(rec.Job.CreatedAt).Round(time.Second))
			err = j.d.Finisher.Finish(ctx, rec, finish.Failed(rec.State, job.CodeDeadline, reason))
			if err != nil && !errors.Is(err, finish.ErrEnded) {
				continue
			}
			if _, err := j.d.Queues.Cancel(ctx, id, p); err != nil {
				j.d.Logger.Warn("maintenance: expire: remove task", "request_id", id, "err", err)
			}
			expired++
			j.d.Logger.Warn("maintenance: request expired in the queue", "request_id", id)
		}
	}
	if expired > 0 {
		j.d.Logger.Info("maintenance: expired queued requests", "count", expired)
	}
	return nil
}
