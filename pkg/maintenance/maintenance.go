// Package maintenance holds the periodic jobs: the scheduler process
// enqueues them on asynq and any worker runs them, so they survive the
// loss of any one process and never run twice for one tick (asynq Unique).
//
//	bulwark:cache:purge      delete expired semantic-cache rows     every 10 minutes
//	bulwark:alerts:evaluate  breaker and key-pool state → alerts   every alerts.interval
//	bulwark:report:daily     the daily report → webhooks, e-mail    daily at report.at
//	bulwark:queue:expire     fail queued requests past deadline     every 15 seconds
//	bulwark:history:prune    delete history past its retention      every hour
//	bulwark:history:reconcile  end the rows of requests Redis lost  every minute
package maintenance

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/alert"
	"bulwark/pkg/breaker"
	"bulwark/pkg/config"
	"bulwark/pkg/llm"
	"bulwark/pkg/report"
)

// Queue is the asynq queue of periodic jobs.
const Queue = "maintenance"

// Task types.
const (
	TaskPurgeCache = "bulwark:cache:purge"
	TaskAlerts     = "bulwark:alerts:evaluate"
	TaskReport     = "bulwark:report:daily"
	TaskPrune      = "bulwark:history:prune"
)

// HistoryPruner deletes history rows (history.Store).
type HistoryPruner interface {
	Prune(ctx context.Context, before time.Time) (int64, error)
}

// CachePurger deletes expired cache rows.
type CachePurger interface {
	PurgeExpired(ctx context.Context) (int64, error)
}

// KeyPool reports available keys.
type KeyPool interface {
	Available(ctx context.Context) (map[llm.Route]int, error)
	Routes() map[llm.Route]int
}

// Breakers lists breaker states.
type Breakers interface {
	List(ctx context.Context) ([]breaker.Status, error)
}

// Notifier sends alerts.
type Notifier interface {
	Notify(ctx context.Context, e alert.Event) error
}

// Deps are the jobs' collaborators.
type Deps struct {
	Cache   CachePurger // nil when the cache is off
	History HistoryPruner
	// Retention of history rows (postgres.history_retention).
	Retention time.Duration
	Pool      KeyPool
	Breakers  Breakers
	Notifier  Notifier
	PG        *pgxpool.Pool
	Redis     redis.Cmdable
	Prefix    string
	Report    config.Report
	Language  string
	Logger    *slog.Logger
	// Jobs, Queues and Finisher let the expiry job fail overdue queued
	// requests.
	Jobs     JobStore
	Queues   Queues
	Finisher Finisher
	// Unended and Records let the reconcile job end the history rows of
	// requests Redis lost (history.Store, job.Store); either nil turns it
	// off.
	Unended UnendedHistory
	Records Records
	// ReconcileAfter is how old a request must be before the reconcile job
	// looks at its row; default ReconcileAfterDefault.
	ReconcileAfter time.Duration
	// RecordTTL is how long a live record outlives its request's creation
	// at the least (server.result_ttl).
	RecordTTL time.Duration
	// OnLost counts the requests the reconcile job found lost (metrics);
	// may be nil.
	OnLost func(n int64)
}

// Jobs runs the periodic jobs.
type Jobs struct{ d Deps }

// New returns the jobs.
func New(d Deps) *Jobs {
	if d.ReconcileAfter <= 0 {
		d.ReconcileAfter = ReconcileAfterDefault
	}
	if d.Unended != nil && d.Logger != nil && d.RecordTTL-reconcileMargin <= d.ReconcileAfter {
		d.Logger.Warn("maintenance: the history reconcile job has nothing it may judge: a record may expire before its request is old enough; raise server.result_ttl",
			"result_ttl", d.RecordTTL, "judged_after", d.ReconcileAfter, "margin", reconcileMargin)
	}
	return &Jobs{d: d}
}

// Register adds the handlers to mux.
func (j *Jobs) Register(mux *asynq.ServeMux) {
	mux.HandleFunc(TaskPurgeCache, j.purge)
	mux.HandleFunc(TaskAlerts, j.evaluate)
	mux.HandleFunc(TaskReport, j.report)
	mux.HandleFunc(TaskExpire, j.expire)
	mux.HandleFunc(TaskPrune, j.prune)
	mux.HandleFunc(TaskReconcile, j.reconcile)
}

// Schedule registers the periodic jobs on s. at is "HH:MM" in the
// scheduler's time zone.
func Schedule(s *asynq.Scheduler, alertsEvery time.Duration, at string) error {
	hh, mm, ok := strings.Cut(at, ":")
	h, err1 := strconv.Atoi(hh)
	m, err2 := strconv.Atoi(mm)
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("maintenance: report time %q: want HH:MM", at)
	}
	entries := []struct {
		spec, typ string
		unique    time.Duration
	}{
		{"@every 10m", TaskPurgeCache, 5 * time.Minute},
		{"@every 15s", TaskExpire, 10 * time.Second},
		{"@every 1h", TaskPrune, 30 * time.Minute},
		{"@every 1m", TaskReconcile, 50 * time.Second},
		{"@every " + alertsEvery.String(), TaskAlerts, alertsEvery / 2},
		{fmt.Sprintf("%d %d * * *", m, h), TaskReport, 12 * time.Hour},
	}
	for _, e := range entries {
		if _, err := s.Register(e.spec, asynq.NewTask(e.typ, nil), asynq.Queue(Queue), asynq.Unique(e.unique),
			asynq.MaxRetry(2)); err != nil {
			return fmt.Errorf("maintenance: schedule %s: %w", e.typ, err)
		}
	}
	return nil
}

func (j *Jobs) purge(ctx context.Context, _ *asynq.Task) error {
	if j.d.Cache == nil {
		return nil
	}
	n, err := j.d.Cache.PurgeExpired(ctx)
	if err != nil {
		return fmt.Errorf("maintenance: purge cache: %w", err)
	}
	j.d.Logger.Info("maintenance: purged expired cache rows", "rows", n)
	return nil
}

// prune deletes history rows older than the retention.
func (j *Jobs) prune(ctx context.Context, _ *asynq.Task) error {
	if j.d.History == nil || j.d.Retention <= 0 {
		return nil
	}
	n, err := j.d.History.Prune(ctx, time.Now().Add(-j.d.Retention))
	if err != nil {
		return fmt.Errorf("maintenance: %w", err)
	}
	if n > 0 {
		j.d.Logger.Info("maintenance: pruned history rows past their retention", "rows", n, "retention", j.d.Retention)
	}
	return nil
}

// evaluate turns shared state into alerts: a breaker not closed, a tier
// whose keys are all cooling or disabled, and the recovery of each. Which
// subjects are in trouble is remembered in Redis, so recoveries are
// announced once, whichever worker runs the job. The Notifier throttles
// repeats.
func (j *Jobs) evaluate(ctx context.Context, _ *asynq.Task) error {
	brs, err := j.d.Breakers.List(ctx)
	if err != nil {
		return fmt.Errorf("maintenance: breakers: %w", err)
	}
	for _, st := range brs {
		down := st.State != breaker.StateClosed
		j.transition(ctx, "breaker:"+st.Name, down,
			alert.Event{Kind: alert.KindBreakerOpen, Subject: st.Name,
				Summary: fmt.Sprintf("circuit breaker %s is %s since %s: %s", st.Name, st.State, st.DegradedSince.Format(time.RFC3339), st.Reason)},
			alert.Event{Kind: alert.KindBreakerClosed, Subject: st.Name, Summary: fmt.Sprintf("circuit breaker %s closed", st.Name)})
	}
	avail, err := j.d.Pool.Available(ctx)
	if err != nil {
		return fmt.Errorf("maintenance: key pool: %w", err)
	}
	for r, total := range j.d.Pool.Routes() {
		down := total > 0 && avail[r] == 0
		j.transition(ctx, "tier:"+r.String(), down,
			alert.Event{Kind: alert.KindTierExhausted, Subject: r.String(),
				Summary: fmt.Sprintf("every key of %s is cooling or disabled (%d keys)", r, total)},
			alert.Event{Kind: alert.KindTierRecovered, Subject: r.String(), Summary: fmt.Sprintf("keys of %s available again", r)})
	}
	return nil
}

func (j *Jobs) transition(ctx context.Context, subject string, down bool, fail, recover alert.Event) {
	key := downKey(j.d.Prefix)
	if down {
		if err := j.d.Notifier.Notify(ctx, fail); err != nil {
			j.d.Logger.Warn("maintenance: alert", "subject", subject, "err", err)
		}
		j.d.Redis.SAdd(ctx, key, subject)
		return
	}
	removed, err := j.d.Redis.SRem(ctx, key, subject).Result()
	if err != nil || removed == 0 {
		return
	}
	if err := j.d.Notifier.Notify(ctx, recover); err != nil {
		j.d.Logger.Warn("maintenance: alert", "subject", subject, "err", err)
	}
}

func (j *Jobs) report(ctx context.Context, _ *asynq.Task) error {
	loc, err := time.LoadLocation(j.d.Report.Timezone)
	if err != nil {
		loc = time.UTC
	}
	to := time.Now().In(loc).Truncate(time.Hour)
	from := to.Add(-24 * time.Hour)
	r, err := report.Build(ctx, j.d.PG, from, to)
	if err != nil {
		return fmt.Errorf("maintenance: report: %w", err)
	}
	var mail *report.MailConfig
	if m := j.d.Report.Mail; m != nil {
		mail = &report.MailConfig{Addr: m.Addr, From: m.From, To: m.To, Username: m.Username, Password: m.Password, StartTLS: m.StartTLS}
	}
	if err := report.Deliver(ctx, r, j.d.Notifier, mail, j.d.Language); err != nil {
		return fmt.Errorf("maintenance: deliver report: %w", err)
	}
	return nil
}
