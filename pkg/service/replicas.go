package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/redisconn"
)

// replicatedJobs is the live store intake writes through when
// redis.min_replicas_acked is set: a request counts as accepted only once
// that many replicas hold its record, so a failover (Sentinel promoting a
// replica, even of a killed master) cannot lose a request answered 202.
//
// Only the record needs confirming: its task, its coalescing state and
// later changes may be lost in a failover and are redone — the orphan
// sweep re-enqueues a record with no task (and gives a follower whose
// state is lost a call of its own), asynq re-runs a task whose end it
// could not write.
//
// When the replicas do not confirm in time, or the confirmation itself
// fails (the connection broke, MOVED mid-failover), submitting fails (503,
// "retry shortly", intake.ErrUnconfirmed) but the request goes on: it is
// queued and runs should the master survive, which it almost always does
// (the replica was only slow, the connection only dropped); should its
// enqueue fail too, the orphan sweep queues it. A retry with the same
// Idempotency-Key finds that request, confirms it again and gets its
// status; one without may run the prompt twice. Nothing accepted is lost
// either way. A record gone from the master by the time it is confirmed
// (ErrKeyGone: a failover in between) is a plain failure: there is
// nothing to run.
type replicatedJobs struct {
	*job.Store
	rdb     redis.UniversalClient
	n       int
	timeout time.Duration
}

var _ intake.Jobs = replicatedJobs{}

// intakeJobs is the store intake uses: the plain one unless
// redis.min_replicas_acked asks for confirmed acceptance.
func (b *Base) intakeJobs() intake.Jobs {
	rc := b.Cfg.RedisConnConfig().WithDefaults()
	if rc.MinReplicasAcked <= 0 {
		return b.Jobs
	}
	return replicatedJobs{Store: b.Jobs, rdb: b.Redis, n: rc.MinReplicasAcked, timeout: rc.ReplicaAckTimeout}
}

// Create stores the request, then waits for the replicas. An earlier
// request found by its idempotency key is confirmed too: its first
// submission may have been answered 503.
func (r replicatedJobs) Create(ctx context.Context, j *job.Job, ev job.Event, idemKey string, maxLive int) (string, bool, error) {
	id, created, err := r.Store.Create(ctx, j, ev, idemKey, maxLive)
	if err != nil {
		return id, created, err
	}
	if err := r.confirm(ctx, id); err != nil {
		if created && !errors.Is(err, redisconn.ErrKeyGone) {
			return id, true, fmt.Errorf("%w: %w", intake.ErrUnconfirmed, err)
		}
		return "", false, err
	}
	return id, created, nil
}

// Idempotent finds the request of an idempotency key and confirms it.
func (r replicatedJobs) Idempotent(ctx context.Context, tenant, idemKey string) (string, error) {
	id, err := r.Store.Idempotent(ctx, tenant, idemKey)
	if err != nil || id == "" {
		return id, err
	}
	if err := r.confirm(ctx, id); err != nil && !errors.Is(err, redisconn.ErrKeyGone) {
		return "", err // a record gone is intake's to report (not found)
	}
	return id, nil
}

func (r replicatedJobs) confirm(ctx context.Context, id string) error {
	if err := redisconn.WaitReplicas(ctx, r.rdb, r.RecordKey(id), r.ReplicatedKey(), r.n, r.timeout); err != nil {
		return fmt.Errorf("service: request %s stored but not confirmed by %d replicas: %w", id, r.n, err)
	}
	return nil
}
