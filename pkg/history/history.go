// Package history writes every request to the PostgreSQL requests table:
// a row at submission and its outcome at the end. The live state is in
// Redis (pkg/job); history is for reports and for status look-ups after the
// live record expired. Writes fail open: with PostgreSQL down a request
// still runs, and the failure is counted and logged at most once per
// interval. An outcome that could not be written waits in a Redis outbox
// (Outbox) and is written by Replay once PostgreSQL is back, so that every
// request that has a row reaches a terminal one.
package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"bulwark/pkg/groupcommit"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

// ErrNotFound is returned for an unknown id.
var ErrNotFound = errors.New("history: not found")

// Store writes and reads history rows. It is safe for concurrent use.
type Store struct {
	pool     *pgxpool.Pool
	logger   *slog.Logger
	interval time.Duration
	// OnError is called for every failed write (metrics); may be nil.
	OnError func()
	// OnDrop is called for every outcome the full outbox could not keep
	// (metrics); may be nil.
	OnDrop func()
	// FlushTimeout bounds Close as a whole: the queued rows not written
	// by then go to the outbox. Zero means FlushTimeoutDefault (3s). Set
	// it before Start.
	FlushTimeout time.Duration
	outbox       *outbox                                 // nil: a failed outcome is only counted
	writer       atomic.Pointer[groupcommit.Writer[row]] // nil until Start: writes are synchronous

	expire  sync.Once
	expired chan struct{} // closed once Close's bound has passed; made by Start

	mu         sync.Mutex
	lastWarned time.Time
}

// New returns a store that logs write failures at most once per interval.
func New(pool *pgxpool.Pool, logger *slog.Logger, interval time.Duration) *Store {
	if interval == 0 {
		interval = time.Minute
	}
	return &Store{pool: pool, logger: logger, interval: interval}
}

func (s *Store) failed(op string, err error) {
	if s.OnError != nil {
		s.OnError()
	}
	s.mu.Lock()
	warn := time.Since(s.lastWarned) >= s.interval
	if warn {
		s.lastWarned = time.Now()
	}
	s.mu.Unlock()
	if warn {
		s.logger.Warn("history: write failed; requests keep running without history", "op", op, "err", err)
	}
}

// submitTimeout bounds the insert on the submission path: with PostgreSQL
// hanging rather than refusing, history must not add seconds to every
// submission.
const submitTimeout = 300 * time.Millisecond

// Submitted records an accepted request. Failures are logged, not returned.
// While the writer runs (Start) the row is written in the next batch, off
// the caller's path.
func (s *Store) Submitted(ctx context.Context, j *job.Job, status job.Status, cached job.Cached) {
	if s.enqueue(row{sub: submitted(j, status, cached)}) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, submitTimeout)
	defer cancel()
	if _, err := s.pool.Exec(ctx, submitSQL, submitted(j, status, cached)...); err != nil {
		s.failed("insert", err)
	}
}

const submitSQL = `
		INSERT INTO requests (id, tenant, priority, status, provider, model_tier, cached, case_id, cache_layer, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, ''), NULLIF($9, ''), $10)
		ON CONFLICT (id) DO NOTHING`

// submitted are submitSQL's arguments.
func submitted(j *job.Job, status job.Status, cached job.Cached) []any {
	return []any{text(j.ID), text(j.Tenant), int(j.Priority), string(status), text(string(j.Route.Provider)), text(j.Route.Tier),
		text(string(cached)), text(j.CaseID), text(string(j.Layer)), j.CreatedAt}
}

// Finished records a request's outcome (upsert: the submission row may be
// missing if PostgreSQL was down then). costUSD is the estimated cost.
// While the writer runs (Start) the row is written in the next batch; a
// failed write goes to the outbox either way.
func (s *Store) Finished(ctx context.Context, rec *job.Record, costUSD float64) {
	cp := *rec // the caller's record may change once this returns
	if s.enqueue(row{rec: &cp, cost: costUSD}) {
		return
	}
	s.finishedOrKeep(ctx, rec, costUSD)
}

// finishedOrKeep writes an outcome, or keeps it in the outbox when
// PostgreSQL is away.
func (s *Store) finishedOrKeep(ctx context.Context, rec *job.Record, costUSD float64) {
	if err := s.finished(ctx, rec, costUSD); err != nil {
		s.failed("finish", err)
		if refused(err) {
			s.lost(rec.Job.ID, err) // would fail again on every replay
			return
		}
		s.keep(ctx, rec, costUSD)
	}
}

// finished writes an outcome.
func (s *Store) finished(ctx context.Context, rec *job.Record, costUSD float64) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := s.pool.Exec(ctx, finishSQL, outcome(rec, costUSD)...)
	return err
}

const finishSQL = `
		INSERT INTO requests (id, tenant, priority, status, provider, model_tier, served_provider, served_tier, key_id,
			attempts, cached, case_id, cache_layer, input_tokens, output_tokens, cost_usd, created_at, started_at,
			finished_at, queue_wait_ms, error, response, tokens_saved)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,NULLIF($9,''),$10,$11,NULLIF($12,''),NULLIF($13,''),$14,$15,$16,$17,$18,$19,$20,NULLIF($21,''),$22,$23)
		ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, served_provider = EXCLUDED.served_provider,
			served_tier = EXCLUDED.served_tier, key_id = EXCLUDED.key_id, attempts = EXCLUDED.attempts,
			cached = EXCLUDED.cached, input_tokens = EXCLUDED.input_tokens, output_tokens = EXCLUDED.output_tokens,
			cost_usd = EXCLUDED.cost_usd, started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
			queue_wait_ms = EXCLUDED.queue_wait_ms, error = EXCLUDED.error, response = EXCLUDED.response,
			tokens_saved = EXCLUDED.tokens_saved`

// outcome are finishSQL's arguments.
func outcome(rec *job.Record, costUSD float64) []any {
	j, st := rec.Job, rec.State
	var served struct{ p, t *string }
	if st.ServedRoute != nil {
		p, t := text(string(st.ServedRoute.Provider)), text(st.ServedRoute.Tier)
		served.p, served.t = &p, &t
	}
	var resp []byte
	var usage llm.Usage
	if st.Result != nil {
		resp, _ = storedJSON(st.Result)
		usage = st.Result.Usage
	}
	var started, finished *time.Time
	var waitMS *int64
	if !st.StartedAt.IsZero() {
		started = &st.StartedAt
		w := st.StartedAt.Sub(j.CreatedAt).Milliseconds()
		waitMS = &w
	}
	if !st.FinishedAt.IsZero() {
		finished = &st.FinishedAt
	}
	return []any{text(j.ID), text(j.Tenant), int(j.Priority), string(rec.Status), text(string(j.Route.Provider)), text(j.Route.Tier),
		served.p, served.t, text(st.KeyID), st.Attempts, text(string(st.Cached.OrNone())), text(j.CaseID), text(string(j.Layer)),
		usage.InputTokens, usage.OutputTokens, costUSD, j.CreatedAt, started, finished, waitMS, text(rec.Reason), resp, st.TokensSaved}
}

// pruneBatch bounds the rows one DELETE removes: short transactions that
// never hold the table for long.
const pruneBatch = 5000

// Prune deletes the rows of requests created before before, in batches,
// and returns how many it deleted.
func (s *Store) Prune(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, `
			DELETE FROM requests WHERE id IN (
				SELECT id FROM requests WHERE created_at < $1 ORDER BY created_at LIMIT $2)`, before, pruneBatch)
		if err != nil {
			return total, fmt.Errorf("history: prune: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}

// openRow is the condition on a row with no ending recorded (a status that
// is not job.Status.Terminal).
const openRow = `status NOT IN ('completed', 'failed', 'cancelled')`

// Unended is a row with no ending recorded.
type Unended struct {
	ID        string
	CreatedAt time.Time
}

// Unended returns the rows created in [from, to) that have no ending
// recorded, oldest first, at most limit. It reads the range through the
// created_at index.
func (s *Store) Unended(ctx context.Context, from, to time.Time, limit int) ([]Unended, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT id, created_at FROM requests
		WHERE created_at >= $1 AND created_at < $2 AND `+openRow+`
		ORDER BY created_at LIMIT $3`, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("history: unended rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Unended, error) {
		var u Unended
		return u, r.Scan(&u.ID, &u.CreatedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("history: unended rows: %w", err)
	}
	return out, nil
}

// MarkLost records the end of requests Redis lost: the rows of ids that
// still have no ending become failed with job.LostReason. A row that got
// its ending meanwhile keeps it; an ending written later (the outbox)
// replaces this one. It returns the rows it changed.
func (s *Store) MarkLost(ctx context.Context, ids []string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, `
		UPDATE requests SET status = 'failed', error = $2, finished_at = now()
		WHERE id = ANY($1) AND `+openRow, ids, job.LostReason)
	if err != nil {
		return 0, fmt.Errorf("history: mark %d requests lost: %w", len(ids), err)
	}
	return tag.RowsAffected(), nil
}

// Row is a request as history knows it.
type Row struct {
	ID          string
	Tenant      string
	Priority    priority.Priority
	Status      job.Status
	Route       llm.Route
	ServedRoute *llm.Route
	Cached      job.Cached
	Error       string
	Response    *llm.Response
	CreatedAt   time.Time
}

// Get reads one row.
func (s *Store) Get(ctx context.Context, id string) (*Row, error) {
	var r Row
	var p int
	var sp, st, errText *string
	var resp []byte
	err := s.pool.QueryRow(ctx, `
		SELECT id, tenant, priority, status, provider, model_tier, served_provider, served_tier, cached, error, response, created_at
		FROM requests WHERE id = $1`, id).Scan(&r.ID, &r.Tenant, &p, &r.Status, &r.Route.Provider, &r.Route.Tier,
		&sp, &st, &r.Cached, &errText, &resp, &r.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("history: get %s: %w", id, err)
	}
	r.Priority = priority.Priority(p)
	if sp != nil && st != nil {
		r.ServedRoute = &llm.Route{Provider: llm.Provider(*sp), Tier: *st}
	}
	if errText != nil {
		r.Error = *errText
	}
	if len(resp) > 0 {
		r.Response = &llm.Response{}
		if resp, err = decodeStored(resp); err != nil {
			return nil, fmt.Errorf("history: decode %s: %w", id, err)
		}
		if err := json.Unmarshal(resp, r.Response); err != nil {
			return nil, fmt.Errorf("history: decode %s: %w", id, err)
		}
	}
	return &r, nil
}
