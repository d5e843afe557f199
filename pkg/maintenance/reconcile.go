package maintenance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/history"
)

// TaskReconcile ends the history rows of requests Redis lost.
const TaskReconcile = "bulwark:history:reconcile"

// Defaults and bounds of the reconcile job.
const (
	// ReconcileAfterDefault is how old a request must be before its history
	// row is looked at: well past queue_max_wait's default (5 minutes), so
	// that nearly every request has ended on its own by then.
	ReconcileAfterDefault = 10 * time.Minute
	// reconcileStep bounds the creation times one query reads: the rows of
	// a step are read through the created_at index, ended ones included,
	// so a catch-up after a long gap is many short queries, not one long
	// one.
	reconcileStep = 10 * time.Minute
	// reconcileBudget bounds the time of one run, well inside its minute;
	// the next run goes on from the cursor.
	reconcileBudget = 20 * time.Second
	// reconcileBatch bounds the rows one step ends.
	reconcileBatch = 1000
	// reconcileMargin keeps the job away from the oldest requests whose
	// records may have expired (result_ttl after creation at the
	// earliest) rather than been lost.
	reconcileMargin = 10 * time.Minute
)

// UnendedHistory finds and ends history rows (history.Store).
type UnendedHistory interface {
	Unended(ctx context.Context, from, to time.Time, limit int) ([]history.Unended, error)
	MarkLost(ctx context.Context, ids []string) (int64, error)
	// Backlog is how many endings wait in the outbox for PostgreSQL.
	Backlog(ctx context.Context) (int64, error)
}

// Records tells which requests have no live record (job.Store).
type Records interface {
	Missing(ctx context.Context, ids []string) ([]string, error)
}

// reconcile ends, in history, the requests Redis lost. A request's live
// record is stored before its history row and kept at least result_ttl
// after its creation, so a row with no ending whose record is gone
// before then belongs to a request that nothing will run or end: a write
// Redis acknowledged and lost in a failover, or everything after a restart
// without persistence. Its row becomes failed with job.LostReason, so
// reports stop counting it as queued (GET and event streams already say
// lost). Each row is looked at ReconcileAfter after its creation; one
// whose request still runs then is watched and judged again at every run
// until its record goes. A cursor in Redis says how far it got; when Redis
// lost the cursor too, it starts again from the oldest rows it may judge.
func (j *Jobs) reconcile(ctx context.Context, _ *asynq.Task) error {
	d := j.d
	if d.Unended == nil || d.Records == nil {
		return nil
	}
	err := j.reconcileRun(ctx)
	if errors.Is(err, errOutboxBusy) {
		d.Logger.Info("maintenance: reconcile waits for the history outbox")
		return nil
	}
	return err
}

// errOutboxBusy stops a run: endings wait in the history outbox, or a
// replay holds some.
var errOutboxBusy = errors.New("maintenance: reconcile: endings wait in the history outbox")

// outboxClear returns errOutboxBusy while any ending waits in the history
// outbox or is held by a replay (taken, not yet written): a row still open
// only for that, of a request whose record has gone since (a compat
// call's, 5 minutes after its end; or a record Redis lost after the
// ending was kept), is not lost. Checked at the start of a run and again
// right before each MarkLost, so an ending kept during a run stops it.
func (j *Jobs) outboxClear(ctx context.Context) error {
	n, err := j.d.Unended.Backlog(ctx)
	if err != nil {
		return fmt.Errorf("maintenance: reconcile: %w", err)
	}
	if n > 0 {
		return errOutboxBusy
	}
	return nil
}

func (j *Jobs) reconcileRun(ctx context.Context) error {
	d := j.d
	if err := j.outboxClear(ctx); err != nil {
		return err
	}
	now := time.Now()
	to, floor := now.Add(-d.ReconcileAfter), now.Add(-d.RecordTTL+reconcileMargin)
	if err := j.rejudge(ctx, floor); err != nil {
		return err
	}
	from, err := j.reconcileCursor(ctx, floor)
	if err != nil {
		return err
	}
	for from.Before(to) && time.Since(now) < reconcileBudget {
		next, err := j.reconcileStep(ctx, from, earlier(to, from.Add(reconcileStep)))
		if err != nil {
			return err
		}
		if err := d.Redis.Set(ctx, reconcileKey(d.Prefix), next.UnixMicro(), 0).Err(); err != nil {
			return fmt.Errorf("maintenance: reconcile: save the cursor: %w", err)
		}
		from = next
	}
	return nil
}

// reconcileCursor is where the last run stopped, but never before floor.
func (j *Jobs) reconcileCursor(ctx context.Context, floor time.Time) (time.Time, error) {
	v, err := j.d.Redis.Get(ctx, reconcileKey(j.d.Prefix)).Result()
	if errors.Is(err, redis.Nil) {
		return floor, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("maintenance: reconcile: read the cursor: %w", err)
	}
	us, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return floor, nil // not ours to trust: start again from the floor
	}
	return later(time.UnixMicro(us), floor), nil
}

// reconcileStep ends the lost requests created in [from, to) and returns
// where the next step starts.
func (j *Jobs) reconcileStep(ctx context.Context, from, to time.Time) (time.Time, error) {
	d := j.d
	rows, err := d.Unended.Unended(ctx, from, to, reconcileBatch)
	if err != nil {
		return from, fmt.Errorf("maintenance: reconcile: %w", err)
	}
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	missing, err := j.judge(ctx, ids)
	if err != nil {
		return from, err
	}
	if err := j.watch(ctx, rows, missing); err != nil {
		return from, err
	}
	if len(rows) < reconcileBatch {
		return to, nil
	}
	// A full batch: go on from its last row. Rows created at that same
	// instant are read again; those just ended no longer match, so the
	// next step reads others. Only a batch of live requests all created
	// in one microsecond (PostgreSQL's resolution) could hold it still:
	// then it steps over that microsecond.
	last := rows[len(rows)-1].CreatedAt
	if !last.After(from) && len(missing) == 0 {
		last = from.Add(time.Microsecond)
	}
	return last, nil
}

// judge ends in history those of ids whose live record is gone, and
// returns them.
func (j *Jobs) judge(ctx context.Context, ids []string) ([]string, error) {
	d := j.d
	missing, err := d.Records.Missing(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("maintenance: reconcile: %w", err)
	}
	if len(missing) == 0 {
		return nil, nil
	}
	if err := j.outboxClear(ctx); err != nil {
		return nil, err
	}
	n, err := d.Unended.MarkLost(ctx, missing)
	if err != nil {
		return nil, fmt.Errorf("maintenance: reconcile: %w", err)
	}
	if n > 0 {
		if d.OnLost != nil {
			d.OnLost(n)
		}
		d.Logger.Warn("maintenance: requests lost by Redis ended in history as failed (lost)",
			"count", n, "request_ids", head(missing, 20))
	}
	return missing, nil
}

// watch remembers the rows still running when judged (their record
// lives), so that later runs judge them again until their record goes:
// lost in its turn, or expired after an ending history already has (then
// MarkLost changes nothing). A few at most: requests rarely run
// ReconcileAfter after their creation.
func (j *Jobs) watch(ctx context.Context, rows []history.Unended, missing []string) error {
	var zs []redis.Z
	for _, r := range rows {
		if !slices.Contains(missing, r.ID) {
			zs = append(zs, redis.Z{Score: float64(r.CreatedAt.UnixMilli()), Member: r.ID})
		}
	}
	if len(zs) == 0 {
		return nil
	}
	if err := j.d.Redis.ZAdd(ctx, watchKey(j.d.Prefix), zs...).Err(); err != nil {
		return fmt.Errorf("maintenance: reconcile: watch %d running requests: %w", len(zs), err)
	}
	return nil
}

// rejudge judges the watched requests again and forgets those whose
// record has gone, and those too old to judge (floor: their record may
// have expired rather than been lost).
func (j *Jobs) rejudge(ctx context.Context, floor time.Time) error {
	key := watchKey(j.d.Prefix)
	if err := j.d.Redis.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(floor.UnixMilli(), 10)).Err(); err != nil {
		return fmt.Errorf("maintenance: reconcile: watched requests: %w", err)
	}
	ids, err := j.d.Redis.ZRange(ctx, key, 0, reconcileBatch-1).Result()
	if err != nil {
		return fmt.Errorf("maintenance: reconcile: watched requests: %w", err)
	}
	if len(ids) == 0 {
		return nil
	}
	gone, err := j.judge(ctx, ids)
	if err != nil || len(gone) == 0 {
		return err
	}
	if err := j.d.Redis.ZRem(ctx, key, anys(gone)...).Err(); err != nil {
		return fmt.Errorf("maintenance: reconcile: forget %d watched requests: %w", len(gone), err)
	}
	return nil
}

func anys(ids []string) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

func reconcileKey(prefix string) string { return prefix + "history:reconciled" }

func watchKey(prefix string) string { return prefix + "history:reconcile:watch" }

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// head returns at most n of ids, for a log line.
func head(ids []string, n int) []string {
	return ids[:min(n, len(ids))]
}
