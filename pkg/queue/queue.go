// Package queue is layer 2's view of the asynq queues: enqueueing a request
// on the queue of its priority, admission control, queue positions, the
// measured drain rate and the ETA derived from it, and cancellation.
//
// There is one asynq queue per priority, named after it (critical, high,
// normal, low). asynq pushes new tasks on the left of a queue's pending
// list and workers take them from the right, so a task's position in its
// own queue is its distance from the right end. A request's position counts
// every pending request of more urgent priorities too (they run first under
// strict priority and mostly first under weights), plus its own queue ahead
// of it: exact for FIFO within a priority, conservative across priorities.
//
// A request a worker has taken from asynq but that still waits for a
// global slot (pkg/slots) is still queued: positions and depths count
// those waiters first (they left asynq earlier), in the order the slots
// will be granted, then the pending lists.
//
// The drain rate is measured, not assumed: every worker records each
// request's first start in a sorted set (Redis TIME), and the rate is the
// starts of the last RateWindow over the time they span. Before enough
// starts were seen, and as a ceiling (a storm's first seconds start a
// burst of requests at once that then wait for their keys), the rate is
// Capacity, the requests per second the keys can carry. The ETA of
// position n is n / rate.
package queue

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/job"
	"bulwark/pkg/priority"
	"bulwark/pkg/recent"
	"bulwark/pkg/slots"
)

// TaskType is the asynq task type of a provider call.
const TaskType = "bulwark:call"

// Defaults.
const (
	RateWindowDefault   = 20 * time.Second
	MaxDepthDefault     = 200
	TaskTimeoutDefault  = 15 * time.Minute
	MaxRetryDefault     = 8
	PrefixDefault       = "bulwark:"
	MaxWaitDefault      = 300 * time.Second
	FallbackRateDefault = 1.0 // requests/s assumed without Capacity before anything was measured
	// minRateSamples is how many starts a measured rate needs.
	minRateSamples = 5
)

// Waiters lists the requests that left asynq but wait for a global slot,
// per priority in the order they will be granted, and the slots each
// priority could take now with the ages of those in use (slots.Limiter).
type Waiters interface {
	Waiting(ctx context.Context) (map[priority.Priority][]string, error)
	Occupancy(ctx context.Context) (slots.Occupancy, error)
}

// ErrQueueFull is returned by Admit when the queues are at MaxDepth.
var ErrQueueFull = errors.New("queue: full")

// FullError says how long until there is room again.
type FullError struct {
	Depth      int
	RetryAfter time.Duration
}

func (e *FullError) Error() string {
	return fmt.Sprintf("queue: full (%d requests waiting), retry after %s", e.Depth, e.RetryAfter)
}

func (e *FullError) Is(target error) bool { return target == ErrQueueFull }

// Name returns the asynq queue of a priority.
func Name(p priority.Priority) string { return p.String() }

// Payload is the task payload: only the request id; the request itself is
// in the job store.
type Payload struct {
	ID string `json:"id"`
}

// Config configures the queue view.
type Config struct {
	// MaxDepth is the admission limit of waiting requests. Default
	// MaxDepthDefault (200).
	MaxDepth int
	// RateWindow over which the drain rate is measured. Default 20s.
	RateWindow time.Duration
	// Capacity is the requests per second the provider keys can carry
	// (Σ RPM/60): the drain rate before one was measured, and its ceiling.
	// 0 means unknown: FallbackRateDefault, no ceiling.
	Capacity float64
	// Waiters, when set, adds the requests waiting for a global slot to
	// positions and depths.
	Waiters Waiters
	// TaskTimeout bounds one processing attempt of a task: asynq cancels
	// its handler after it. Default TaskTimeoutDefault (15m).
	TaskTimeout time.Duration
	// MaxRetry of a task (transient failures; waits for capacity do not
	// count). Default MaxRetryDefault (8).
	MaxRetry int
	// Prefix of Bulwark's own keys. Default PrefixDefault ("bulwark:").
	Prefix string
	// MaxWait is the longest a request waits to start before it fails
	// (queue_max_wait): a full queue has room by then at the latest, so it
	// bounds the Retry-After of a refusal. Default MaxWaitDefault (300s).
	MaxWait time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxDepth == 0 {
		c.MaxDepth = MaxDepthDefault
	}
	if c.RateWindow == 0 {
		c.RateWindow = RateWindowDefault
	}
	if c.TaskTimeout == 0 {
		c.TaskTimeout = TaskTimeoutDefault
	}
	if c.MaxRetry == 0 {
		c.MaxRetry = MaxRetryDefault
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.MaxWait == 0 {
		c.MaxWait = MaxWaitDefault
	}
	return c
}

// Validate reports the first field of c (defaults applied) out of range.
func (c Config) Validate() error {
	switch {
	case c.MaxDepth < 1:
		return fmt.Errorf("queue: Config.MaxDepth must be at least 1, got %d", c.MaxDepth)
	case c.RateWindow <= 0:
		return fmt.Errorf("queue: Config.RateWindow must be positive, got %s", c.RateWindow)
	case c.TaskTimeout <= 0:
		return fmt.Errorf("queue: Config.TaskTimeout must be positive, got %s", c.TaskTimeout)
	case c.MaxWait <= 0:
		return fmt.Errorf("queue: Config.MaxWait must be positive, got %s", c.MaxWait)
	case c.MaxRetry < 0:
		return fmt.Errorf("queue: Config.MaxRetry must be at least 0, got %d", c.MaxRetry)
	case !(c.Capacity >= 0) || math.IsInf(c.Capacity, 0):
		return fmt.Errorf("queue: Config.Capacity must be finite and >= 0, got %g", c.Capacity)
	}
	return nil
}

// Queue enqueues and inspects. It is safe for concurrent use.
type Queue struct {
	rdb       redis.UniversalClient
	client    *asynq.Client
	inspector *asynq.Inspector
	cfg       Config
	admit     admission
	// spots is the process's latest snapshot of every queued request's
	// spot (SpotOf).
	spots *recent.Value[map[string]Spot]
}

// New returns a Queue on rdb; rdb stays owned by the caller.
func New(rdb redis.UniversalClient, cfg Config) *Queue {
	cfg = cfg.WithDefaults()
	q := &Queue{
		rdb:       rdb,
		client:    asynq.NewClientFromRedisClient(rdb),
		inspector: asynq.NewInspectorFromRedisClient(rdb),
		cfg:       cfg,
	}
	q.spots = &recent.Value[map[string]Spot]{MaxAge: spotsMaxAge, Load: q.Spots}
	return q
}

// spotsMaxAge is how old a snapshot of every queued request's spot may be
// when SpotOf finds a request in it. Computing the spots reads every
// pending list (O(queue depth)): a flood of GETs of queued requests, each
// computing them afresh, cost Redis that much per read. The hub
// recomputes its streams' positions at about this pace too.
const spotsMaxAge = 100 * time.Millisecond

// Close releases the asynq client and inspector (not the Redis client).
func (q *Queue) Close() error {
	return errors.Join(q.client.Close(), q.inspector.Close())
}

// Enqueue puts request id on the queue of p, to run after delay.
func (q *Queue) Enqueue(ctx context.Context, id string, p priority.Priority, delay time.Duration) error {
	payload, _ := json.Marshal(Payload{ID: id})
	opts := []asynq.Option{
		asynq.Queue(Name(p)), asynq.TaskID(id), asynq.MaxRetry(q.cfg.MaxRetry),
		asynq.Timeout(q.cfg.TaskTimeout),
	}
	if delay > 0 {
		opts = append(opts, asynq.ProcessIn(delay))
	}
	if _, err := q.client.EnqueueContext(ctx, asynq.NewTask(TaskType, payload), opts...); err != nil {
		return fmt.Errorf("queue: enqueue %s on %s: %w", id, Name(p), err)
	}
	return nil
}

// depths reads pending and delayed (scheduled + retry) counts per queue in
// one round trip.
func (q *Queue) depths(ctx context.Context) (pending, delayed map[priority.Priority]int64, err error) {
	pipe := q.rdb.Pipeline()
	pc := map[priority.Priority]*redis.IntCmd{}
	sc := map[priority.Priority]*redis.IntCmd{}
	rc := map[priority.Priority]*redis.IntCmd{}
	for _, p := range priority.All {
		pc[p] = pipe.LLen(ctx, pendingKey(p))
		sc[p] = pipe.ZCard(ctx, scheduledKey(p))
		rc[p] = pipe.ZCard(ctx, retryKey(p))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, fmt.Errorf("queue: depth: %w", err)
	}
	pending, delayed = map[priority.Priority]int64{}, map[priority.Priority]int64{}
	for _, p := range priority.All {
		pending[p] = pc[p].Val()
		delayed[p] = sc[p].Val() + rc[p].Val()
	}
	return pending, delayed, nil
}

// Depth returns the waiting requests per priority (pending plus delayed).
func (q *Queue) Depth(ctx context.Context) (map[priority.Priority]int, error) {
	pending, delayed, err := q.depths(ctx)
	if err != nil {
		return nil, err
	}
	waiting, err := q.waiting(ctx)
	if err != nil {
		return nil, err
	}
	out := map[priority.Priority]int{}
	for _, p := range priority.All {
		out[p] = int(pending[p]+delayed[p]) + len(waiting[p])
	}
	return out, nil
}

// free returns the slots each priority could take now, or none without
// Config.Waiters.
func (q *Queue) occupancy(ctx context.Context) (slots.Occupancy, error) {
	if q.cfg.Waiters == nil {
		return slots.Occupancy{}, nil
	}
	o, err := q.cfg.Waiters.Occupancy(ctx)
	if err != nil {
		return o, fmt.Errorf("queue: slots in use: %w", err)
	}
	return o, nil
}

// waiting returns the slot waiters, or none without Config.Waiters.
func (q *Queue) waiting(ctx context.Context) (map[priority.Priority][]string, error) {
	if q.cfg.Waiters == nil {
		return nil, nil
	}
	w, err := q.cfg.Waiters.Waiting(ctx)
	if err != nil {
		return nil, fmt.Errorf("queue: slot waiters: %w", err)
	}
	return w, nil
}

// RecordStart notes that a request started (drain rate) and wakes position
// trackers. Workers call it when a task leaves the queue.
func (q *Queue) RecordStart(ctx context.Context, id string) error {
	pipe := q.rdb.Pipeline()
	pipe.Eval(ctx, recordStartScript, []string{q.startsKey()}, id, q.cfg.RateWindow.Milliseconds()*5)
	pipe.Publish(ctx, q.DequeuedChannel(), id)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("queue: record start: %w", err)
	}
	return nil
}

// recordStartScript: KEYS[1] starts zset; ARGV[1] id, ARGV[2] keep ms.
const recordStartScript = `
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZADD", KEYS[1], now, ARGV[1])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - tonumber(ARGV[2]))
return 1`

// Rate returns the drain rate in requests per second: the starts of the
// last RateWindow over the time they span (at least one second), at most
// Capacity; Capacity (or FallbackRateDefault) until minRateSamples starts
// were seen.
func (q *Queue) Rate(ctx context.Context) (float64, error) {
	v, err := q.rdb.Eval(ctx, drainScript, []string{q.startsKey()}, q.cfg.RateWindow.Milliseconds()).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("queue: rate: %w", err)
	}
	if len(v) != 2 {
		return 0, fmt.Errorf("queue: rate: unexpected reply %v", v)
	}
	return rateOf(v[0], time.Duration(v[1])*time.Millisecond, q.cfg.Capacity), nil
}

// rateOf is the drain rate of n starts spanning span, capped by capacity
// (0: none).
func rateOf(n int64, span time.Duration, capacity float64) float64 {
	if n < minRateSamples {
		if capacity > 0 {
			return capacity
		}
		return FallbackRateDefault
	}
	r := float64(n) / max(span.Seconds(), 1)
	if capacity > 0 {
		r = min(r, capacity)
	}
	return r
}

// ETAFor is the expected wait of the request whose turn is n (1: the next
// slot that frees is its) when requests drain at rate per second, to the
// millisecond.
func ETAFor(n int, rate float64) time.Duration {
	if n <= 0 || rate <= 0 {
		return 0
	}
	return time.Duration(math.Round(float64(n)/rate*1000)) * time.Millisecond
}

// Spot is a queued request's place: Position counts the requests that
// start before it, itself included (1-based); ETA is its expected wait.
type Spot struct {
	Position int
	ETA      time.Duration
}

// Spots returns the spot of every queued request, keyed by id: most urgent
// priority first, and within one the order the slots will serve them
// (inTurn). The ETA counts the request's turn, its position less the slots
// its priority could take at once (the first requests of a storm start at
// once rather than behind each other), and waits for that many slot
// releases (eta.go).
func (q *Queue) Spots(ctx context.Context) (map[string]Spot, error) {
	pipe := q.rdb.Pipeline()
	lists := map[priority.Priority]*redis.StringSliceCmd{}
	for _, p := range priority.All {
		lists[p] = pipe.LRange(ctx, pendingKey(p), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("queue: positions: %w", err)
	}
	waiting, err := q.waiting(ctx)
	if err != nil {
		return nil, err
	}
	occ, err := q.occupancy(ctx)
	if err != nil {
		return nil, err
	}
	rate, err := q.Rate(ctx)
	if err != nil {
		return nil, err
	}
	d := newDrain(rate, append(occ.Ages, joining(lists, waiting, occ.Free)...))
	out := map[string]Spot{}
	ahead := 0 // requests before the current one
	for _, p := range priority.All {
		for _, id := range inTurn(waiting[p], lists[p].Val(), occ.Free[p]-ahead) {
			ahead++
			out[id] = Spot{Position: ahead, ETA: d.eta(ahead - occ.Free[p])}
		}
	}
	return out, nil
}

// joining returns the holds about to begin: the free slots queued requests
// take at once, as holds of age 0. Without them a cold start's model saw
// the few slots taken in the first milliseconds as all there would be
// (mean hold = in use ÷ rate, a fraction of a call) and promised the
// first waiters a release long before any call could end.
func joining(lists map[priority.Priority]*redis.StringSliceCmd, waiting map[priority.Priority][]string,
	free map[priority.Priority]int) []time.Duration {
	queued, most := 0, 0
	for _, p := range priority.All {
		queued += len(lists[p].Val()) + len(waiting[p])
		most = max(most, free[p])
	}
	return make([]time.Duration, min(queued, most))
}

// inTurn returns one priority's queued requests in the order they will get
// a slot, when free of the slots it could take are free now. Those go to
// the first to ask: the waiters, then the pending requests in the order
// asynq hands them out (its list, oldest enqueue first; a storm's
// submissions reach it in any order). The others are served oldest first:
// the slots grant waiters by age, and a pending request joins them as soon
// as a worker takes it, so an older one overtakes younger waiters. Ids that
// carry no creation time (job.IDTime) keep their place, ahead of the
// others. pending is asynq's list, newest first.
func inTurn(waiters, pending []string, free int) []string {
	ids := make([]string, 0, len(waiters)+len(pending))
	ids = append(ids, waiters...)
	for i := len(pending) - 1; i >= 0; i-- {
		ids = append(ids, pending[i])
	}
	rest := ids[min(max(free, 0), len(ids)):]
	slices.SortStableFunc(rest, func(a, b string) int {
		ta, oka := job.IDTime(a)
		tb, okb := job.IDTime(b)
		if !oka || !okb {
			return cmp.Compare(b2i(oka), b2i(okb))
		}
		return cmp.Or(ta.Compare(tb), strings.Compare(a, b)) // the slots' order: Since, then id
	})
	return ids
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// SpotOf returns one request's spot; a zero Spot when it is not queued
// (started). A request whose task has just left asynq is in neither
// asynq's list nor the slots' line for the few milliseconds before its
// worker asks for a slot (a storm's request read then was promised no
// wait and waited 4.5 s): when others are queued, so that it may well
// wait too, one more read tells it from a started one. A request found in
// the process's latest snapshot (at most spotsMaxAge old) is answered from
// it: reads of queued requests cost one computation per snapshot, not one
// each; one not found there is looked for afresh.
func (q *Queue) SpotOf(ctx context.Context, id string) (Spot, error) {
	first := 0
	if spots, fresh, err := q.spots.Get(ctx); err == nil {
		sp, ok := spots[id]
		if ok || (fresh && len(spots) == 0) {
			return sp, nil
		}
		if fresh {
			first = 1 // that was the first read
		}
	}
	for try := first; ; try++ {
		spots, err := q.Spots(ctx)
		if err != nil {
			return Spot{}, err
		}
		q.spots.Put(spots)
		sp, ok := spots[id]
		if ok || len(spots) == 0 || try == 1 {
			return sp, nil
		}
	}
}

// Pending returns the ids of p's pending requests, oldest first.
func (q *Queue) Pending(ctx context.Context, p priority.Priority) ([]string, error) {
	ids, err := q.rdb.LRange(ctx, pendingKey(p), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("queue: pending %s: %w", Name(p), err)
	}
	slices.Reverse(ids)
	return ids, nil
}

// Cancel removes a waiting request from its queue, or asks the worker
// running it to stop. It reports whether the task was found at all.
func (q *Queue) Cancel(ctx context.Context, id string, p priority.Priority) (bool, error) {
	err := q.inspector.DeleteTask(Name(p), id)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return false, nil
	}
	// DeleteTask refuses active tasks: cancel the running handler.
	if cerr := q.inspector.CancelProcessing(id); cerr != nil {
		return false, fmt.Errorf("queue: cancel %s: %w", id, cerr)
	}
	return true, nil
}

// Promote moves request id's task from from's queue to to's while it is
// still pending there, so that it is dequeued as to; a task a worker has
// taken, a delayed one, or one that is gone stays as it is (the caller
// promotes its slot wait too: slots.Limiter.Promote). It reports whether
// it moved the task. Between the delete and the enqueue the request has no
// task; the orphan sweep re-enqueues it should this process die there.
func (q *Queue) Promote(ctx context.Context, id string, from, to priority.Priority) (bool, error) {
	if to >= from {
		return false, nil
	}
	info, err := q.inspector.GetTaskInfo(Name(from), id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("queue: promote %s: %w", id, err)
	case info.State != asynq.TaskStatePending:
		return false, nil
	}
	if err := q.inspector.DeleteTask(Name(from), id); err != nil {
		// Taken by a worker between the two calls (it refuses to delete
		// an active task), or gone.
		return false, nil
	}
	if err := q.Enqueue(ctx, id, to, 0); err != nil {
		return false, fmt.Errorf("queue: promote %s: %w", id, err)
	}
	return true, nil
}

// OldestPending returns, per priority, the id of the request that has
// waited longest (the next to run); the caller reads its creation time.
func (q *Queue) OldestPending(ctx context.Context) (map[priority.Priority]string, error) {
	pipe := q.rdb.Pipeline()
	cmds := map[priority.Priority]*redis.StringCmd{}
	for _, p := range priority.All {
		cmds[p] = pipe.LIndex(ctx, pendingKey(p), -1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("queue: oldest: %w", err)
	}
	out := map[priority.Priority]string{}
	for p, c := range cmds {
		if v, err := c.Result(); err == nil {
			out[p] = v
		}
	}
	return out, nil
}

// Duplicate reports whether Enqueue failed because the request has a task
// already.
func Duplicate(err error) bool { return errors.Is(err, asynq.ErrTaskIDConflict) }

// Requeue enqueues request id again unless asynq still holds a task for
// it: requeued reports that it had none (the request was orphaned: a
// crash between storing it and enqueueing it); archived that asynq holds
// it archived (its retries ran out), in which case the archived task is
// deleted and the caller ends the request.
func (q *Queue) Requeue(ctx context.Context, id string, p priority.Priority) (requeued, archived bool, err error) {
	err = q.Enqueue(ctx, id, p, 0)
	if err == nil {
		return true, false, nil
	}
	if !errors.Is(err, asynq.ErrTaskIDConflict) {
		return false, false, err
	}
	info, err := q.inspector.GetTaskInfo(Name(p), id)
	if err != nil {
		if errors.Is(err, asynq.ErrTaskNotFound) {
			return false, false, nil // finished between the two calls
		}
		return false, false, fmt.Errorf("queue: task %s: %w", id, err)
	}
	if info.State != asynq.TaskStateArchived {
		return false, false, nil
	}
	if err := q.inspector.DeleteTask(Name(p), id); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
		return false, true, fmt.Errorf("queue: delete archived %s: %w", id, err)
	}
	return false, true, nil
}
