package queue

import "bulwark/pkg/priority"

// asynq keeps a queue's tasks under "asynq:{<queue>}:<kind>" (its
// internal/base package: PendingKey, ScheduledKey, RetryKey; v0.26). Its
// Inspector reads them too, but one task at a time (an HGETALL per task),
// and the queue reads every pending id on each position update, so Bulwark
// reads the lists itself, through these functions only.
// TestAsynqKeyLayout fails if asynq moves them.

// pendingKey is the list of p's tasks ready to run, newest first (LPUSH
// on enqueue, RPOP-like dequeue from the right).
func pendingKey(p priority.Priority) string { return asynqKey(p, "pending") }

// scheduledKey is the sorted set of p's tasks to run later (ProcessIn).
func scheduledKey(p priority.Priority) string { return asynqKey(p, "scheduled") }

// retryKey is the sorted set of p's tasks waiting to retry.
func retryKey(p priority.Priority) string { return asynqKey(p, "retry") }

func asynqKey(p priority.Priority, kind string) string { return "asynq:{" + Name(p) + "}:" + kind }

// Bulwark's own keys of the queue, under Config.Prefix.

// startsKey is the sorted set of recent starts, for the drain rate.
func (q *Queue) startsKey() string { return q.cfg.Prefix + "queue:starts" }

// DequeuedChannel is published on at every start, to drive position updates.
func (q *Queue) DequeuedChannel() string { return q.cfg.Prefix + "queue:dequeued" }
