// Package report builds Bulwark's daily report from the request history in
// PostgreSQL (the requests table of migrations/0001_init.sql) and delivers
// it: as markdown to the alert webhooks (WeCom, DingTalk, generic) and by
// e-mail over SMTP.
//
// The report holds: requests by status; an hourly trend of requests,
// failures, retries and attempts (the 429 trend as the history sees it),
// with room for the provider-side 429 counts that only the metrics know
// (SetRateLimitedCalls); the cache hit rate and the calls saved by the cache
// and by in-flight coalescing; tokens and estimated cost per served
// provider/tier; fallbacks to the other provider; queue waits per priority;
// end-to-end latency.
//
// All figures are over requests created in [From, To).
package report

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// MaxRange is the longest period Build accepts; the hourly trend of a
// longer one would not be a report any more.
const MaxRange = 31 * 24 * time.Hour

// Querier is the part of a PostgreSQL client Build needs; *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Report is the summary of one period. Its JSON form is what the admin
// endpoint serves.
type Report struct {
	// From and To bound the period, [From, To). Times in the markdown are
	// shown in From's location.
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// GeneratedAt is when Build ran.
	GeneratedAt time.Time `json:"generated_at"`

	// Total is the number of requests created in the period.
	Total int64 `json:"total"`
	// ByStatus counts them by status (queued, running, waiting, completed,
	// failed, cancelled).
	ByStatus map[string]int64 `json:"by_status"`

	Cache CacheStats `json:"cache"`

	// Fallbacks counts provider calls answered by the other provider than
	// the one asked for (served_provider differs from provider).
	Fallbacks int64 `json:"fallbacks"`
	// FallbackRoutes breaks Fallbacks down by asked → served route, most
	// frequent first.
	FallbackRoutes []FallbackRoute `json:"fallback_routes"`

	// Usage is tokens and cost per served provider/tier, over requests that
	// called a provider (cached = 'none' and served_provider set), sorted by
	// provider then tier.
	Usage []Usage `json:"usage"`
	// InputTokens, OutputTokens and CostUSD are Usage's totals.
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	CostUSD      float64 `json:"cost_usd"`
	// TokensSaved is the estimated input tokens prompt compression took off
	// the period's requests.
	TokensSaved int64 `json:"tokens_saved"`

	// QueueWait is queue_wait_ms per priority (1 critical .. 4 low), over
	// requests that waited in the queue (queue_wait_ms set).
	QueueWait []QueueWait `json:"queue_wait"`

	// Latency is created → finished of completed requests that called a
	// provider (cache hits excluded: they would hide the slow path).
	Latency Latency `json:"latency"`

	// Hourly is the trend, one entry per hour (UTC hour boundaries) from
	// the hour holding From up to To, empty hours included.
	Hourly []Hour `json:"hourly"`
	// RateLimitedCalls is the sum of Hourly[].RateLimitedCalls; nil until
	// SetRateLimitedCalls is called.
	RateLimitedCalls *int64 `json:"rate_limited_calls,omitempty"`
}

// CacheStats are the cache's and the coalescer's savings.
type CacheStats struct {
	// Exact and Semantic count requests answered from the cache.
	Exact    int64 `json:"exact"`
	Semantic int64 `json:"semantic"`
	// Coalesced counts requests answered by attaching to an identical
	// in-flight request: each is a provider call saved.
	Coalesced int64 `json:"coalesced"`
	// HitRate is (Exact+Semantic)/Total, 0..1; 0 when Total is 0.
	HitRate float64 `json:"hit_rate"`
	// SavedCalls is Exact+Semantic+Coalesced.
	SavedCalls int64 `json:"saved_calls"`
	// EstimatedSavedUSD is SavedCalls times the average cost of a completed
	// provider call in the period: an estimate, the saved calls' own sizes
	// being unknown.
	EstimatedSavedUSD float64 `json:"estimated_saved_usd"`
}

// FallbackRoute is one asked → served pair.
type FallbackRoute struct {
	Provider       string `json:"provider"`
	Tier           string `json:"tier"`
	ServedProvider string `json:"served_provider"`
	ServedTier     string `json:"served_tier"`
	Count          int64  `json:"count"`
}

// Usage is one served provider/tier's consumption.
type Usage struct {
	Provider     string  `json:"provider"`
	Tier         string  `json:"tier"`
	Requests     int64   `json:"requests"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	CostUSD      float64 `json:"cost_usd"`
}

// QueueWait is one priority's queue waits, in milliseconds.
type QueueWait struct {
	Priority int     `json:"priority"`
	Count    int64   `json:"count"`
	P50Ms    float64 `json:"p50_ms"`
	P95Ms    float64 `json:"p95_ms"`
	MaxMs    int64   `json:"max_ms"`
}

// Latency is a distribution in milliseconds; zero with Count 0.
type Latency struct {
	Count int64   `json:"count"`
	P50Ms float64 `json:"p50_ms"`
	P95Ms float64 `json:"p95_ms"`
}

// Hour is one hour of the trend.
type Hour struct {
	// Start of the hour.
	Start time.Time `json:"start"`
	// Requests created in the hour, and how many of them failed.
	Requests int64 `json:"requests"`
	Failed   int64 `json:"failed"`
	// Retried counts requests that needed more than one provider attempt —
	// mostly 429s and fallbacks.
	Retried int64 `json:"retried"`
	// AvgAttempts is the mean attempts of requests that called a provider
	// at least once (cache hits have none).
	AvgAttempts float64 `json:"avg_attempts"`
	// RateLimitedFailures counts failed requests whose error mentions 429,
	// a rate limit or a quota.
	RateLimitedFailures int64 `json:"rate_limited_failures"`
	// RateLimitedCalls is the number of 429 responses providers sent in the
	// hour. The history does not record individual provider calls, so Build
	// leaves it nil; a caller with metrics fills it with SetRateLimitedCalls.
	RateLimitedCalls *int64 `json:"rate_limited_calls,omitempty"`
}

// SetRateLimitedCalls records provider-side 429 counts per hour, e.g. from
// a Prometheus range query of increase(<provider 429 counter>[1h]) with a
// 1h step. Keys are truncated to the UTC hour; hours of the report missing
// from counts get 0 (the source is taken to cover the period), keys outside
// the period are ignored.
func (r *Report) SetRateLimitedCalls(counts map[time.Time]int64) {
	byHour := make(map[int64]int64, len(counts))
	for t, n := range counts {
		byHour[t.UTC().Truncate(time.Hour).Unix()] += n
	}
	var total int64
	for i := range r.Hourly {
		n := byHour[r.Hourly[i].Start.UTC().Unix()]
		r.Hourly[i].RateLimitedCalls = &n
		total += n
	}
	r.RateLimitedCalls = &total
}

// ErrRange is returned by Build for an empty, reversed or too long period.
var ErrRange = errors.New("report: invalid period")

// rateLimitedPattern matches error texts that indicate rate limiting
// (case-insensitive POSIX regex): HTTP 429, "rate limit(ed)",
// "rate_limit_exceeded", "insufficient_quota", spend limits.
const rateLimitedPattern = `429|rate[ _-]?limit|quota|spend[ _-]?limit`

// Build summarises the requests created in [from, to).
func Build(ctx context.Context, db Querier, from, to time.Time) (*Report, error) {
	if !to.After(from) || to.Sub(from) > MaxRange {
		return nil, fmt.Errorf("%w: from %s to %s (at most %s)", ErrRange, from.Format(time.RFC3339), to.Format(time.RFC3339), MaxRange)
	}
	r := &Report{From: from, To: to, GeneratedAt: time.Now().In(from.Location()), ByStatus: map[string]int64{}}
	steps := []struct {
		name string
		fn   func(context.Context, Querier, *Report) error
	}{
		{"totals", buildTotals},
		{"status", buildStatus},
		{"usage", buildUsage},
		{"fallbacks", buildFallbacks},
		{"queue waits", buildQueueWait},
		{"hourly", buildHourly},
	}
	for _, s := range steps {
		if err := s.fn(ctx, db, r); err != nil {
			return nil, fmt.Errorf("report: %s: %w", s.name, err)
		}
	}
	// Derived figures.
	if r.Total > 0 {
		r.Cache.HitRate = float64(r.Cache.Exact+r.Cache.Semantic) / float64(r.Total)
	}
	r.Cache.SavedCalls = r.Cache.Exact + r.Cache.Semantic + r.Cache.Coalesced
	for _, u := range r.Usage {
		r.InputTokens += u.InputTokens
		r.OutputTokens += u.OutputTokens
		r.CostUSD += u.CostUSD
	}
	return r, nil
}

// period is the WHERE clause every query shares ($1 from, $2 to).
const period = `created_at >= $1 AND created_at < $2`

func buildTotals(ctx context.Context, db Querier, r *Report) error {
	var avgCost, p50, p95 *float64
	err := db.QueryRow(ctx, `
SELECT count(*),
       count(*) FILTER (WHERE cached = 'exact'),
       count(*) FILTER (WHERE cached = 'semantic'),
       count(*) FILTER (WHERE cached = 'coalesced'),
       coalesce(sum(tokens_saved), 0),
       avg(cost_usd) FILTER (WHERE status = 'completed' AND cached = 'none' AND served_provider IS NOT NULL),
       count(*) FILTER (WHERE status = 'completed' AND cached = 'none' AND finished_at IS NOT NULL),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at) * 1000)
         FILTER (WHERE status = 'completed' AND cached = 'none' AND finished_at IS NOT NULL),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at) * 1000)
         FILTER (WHERE status = 'completed' AND cached = 'none' AND finished_at IS NOT NULL)
FROM requests WHERE `+period, r.From, r.To).Scan(
		&r.Total, &r.Cache.Exact, &r.Cache.Semantic, &r.Cache.Coalesced, &r.TokensSaved,
		&avgCost, &r.Latency.Count, &p50, &p95)
	if err != nil {
		return err
	}
	saved := r.Cache.Exact + r.Cache.Semantic + r.Cache.Coalesced
	r.Cache.EstimatedSavedUSD = float64(saved) * deref(avgCost)
	r.Latency.P50Ms, r.Latency.P95Ms = deref(p50), deref(p95)
	return nil
}

func buildStatus(ctx context.Context, db Querier, r *Report) error {
	rows, err := db.Query(ctx, `SELECT status, count(*) FROM requests WHERE `+period+` GROUP BY status`, r.From, r.To)
	if err != nil {
		return err
	}
	var status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		r.ByStatus[status] = n
		return nil
	})
	return err
}

func buildUsage(ctx context.Context, db Querier, r *Report) error {
	rows, err := db.Query(ctx, `
SELECT served_provider, coalesce(served_tier, ''), count(*),
       coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0), coalesce(sum(cost_usd), 0)
FROM requests
WHERE `+period+` AND cached = 'none' AND served_provider IS NOT NULL
GROUP BY 1, 2 ORDER BY 1, 2`, r.From, r.To)
	if err != nil {
		return err
	}
	r.Usage, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Usage, error) {
		var u Usage
		err := row.Scan(&u.Provider, &u.Tier, &u.Requests, &u.InputTokens, &u.OutputTokens, &u.CostUSD)
		return u, err
	})
	return err
}

func buildFallbacks(ctx context.Context, db Querier, r *Report) error {
	rows, err := db.Query(ctx, `
SELECT provider, model_tier, served_provider, coalesce(served_tier, ''), count(*)
FROM requests
WHERE `+period+` AND cached = 'none' AND served_provider IS NOT NULL AND served_provider <> provider
GROUP BY 1, 2, 3, 4 ORDER BY 5 DESC, 1, 2, 3, 4`, r.From, r.To)
	if err != nil {
		return err
	}
	r.FallbackRoutes, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (FallbackRoute, error) {
		var f FallbackRoute
		err := row.Scan(&f.Provider, &f.Tier, &f.ServedProvider, &f.ServedTier, &f.Count)
		return f, err
	})
	for _, f := range r.FallbackRoutes {
		r.Fallbacks += f.Count
	}
	return err
}

func buildQueueWait(ctx context.Context, db Querier, r *Report) error {
	rows, err := db.Query(ctx, `
SELECT priority, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY queue_wait_ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY queue_wait_ms),
       max(queue_wait_ms)
FROM requests
WHERE `+period+` AND queue_wait_ms IS NOT NULL
GROUP BY priority ORDER BY priority`, r.From, r.To)
	if err != nil {
		return err
	}
	r.QueueWait, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueWait, error) {
		var q QueueWait
		err := row.Scan(&q.Priority, &q.Count, &q.P50Ms, &q.P95Ms, &q.MaxMs)
		return q, err
	})
	return err
}

func buildHourly(ctx context.Context, db Querier, r *Report) error {
	rows, err := db.Query(ctx, `
SELECT date_trunc('hour', created_at, 'UTC'),
       count(*),
       count(*) FILTER (WHERE status = 'failed'),
       count(*) FILTER (WHERE attempts > 1),
       coalesce(avg(attempts) FILTER (WHERE attempts > 0), 0)::float8,
       count(*) FILTER (WHERE status = 'failed' AND error ~* $3)
FROM requests WHERE `+period+`
GROUP BY 1`, r.From, r.To, rateLimitedPattern)
	if err != nil {
		return err
	}
	byHour := map[int64]Hour{}
	var h Hour
	_, err = pgx.ForEachRow(rows, []any{&h.Start, &h.Requests, &h.Failed, &h.Retried, &h.AvgAttempts, &h.RateLimitedFailures}, func() error {
		byHour[h.Start.Unix()] = h
		return nil
	})
	if err != nil {
		return err
	}
	loc := r.From.Location()
	for t := r.From.UTC().Truncate(time.Hour); t.Before(r.To); t = t.Add(time.Hour) {
		h := byHour[t.Unix()]
		h.Start = t.In(loc)
		r.Hourly = append(r.Hourly, h)
	}
	return nil
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}
