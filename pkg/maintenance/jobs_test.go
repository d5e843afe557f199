package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"

	"bulwark/pkg/alert"
	"bulwark/pkg/breaker"
	"bulwark/pkg/config"
	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/testenv"
)

type fakePruner struct {
	before []time.Time
	err    error
}

func (p *fakePruner) Prune(_ context.Context, before time.Time) (int64, error) {
	p.before = append(p.before, before)
	return 3, p.err
}

type fakePurger struct {
	calls int
	err   error
}

func (p *fakePurger) PurgeExpired(context.Context) (int64, error) { p.calls++; return 2, p.err }

// Prune deletes history older than the retention, and nothing without
// one; purge runs only with a cache; their failures reach asynq.
func TestPruneAndPurge(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	p := &fakePruner{}
	j := New(Deps{History: p, Retention: 30 * 24 * time.Hour, Logger: log})
	start := time.Now()
	if err := j.prune(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if len(p.before) != 1 || p.before[0].Before(start.Add(-30*24*time.Hour)) || p.before[0].After(time.Now().Add(-30*24*time.Hour)) {
		t.Fatalf("pruned before %v, want now - 30 days", p.before)
	}
	if err := New(Deps{History: p, Logger: log}).prune(t.Context(), nil); err != nil || len(p.before) != 1 {
		t.Fatalf("pruned without a retention (%v)", err)
	}
	p.err = errors.New("postgres down")
	if err := j.prune(t.Context(), nil); !errors.Is(err, p.err) {
		t.Fatalf("prune error %v, want it returned", err)
	}

	c := &fakePurger{}
	if err := New(Deps{Cache: c, Logger: log}).purge(t.Context(), nil); err != nil || c.calls != 1 {
		t.Fatalf("purge: %v, %d calls", err, c.calls)
	}
	c.err = errors.New("postgres down")
	if err := New(Deps{Cache: c, Logger: log}).purge(t.Context(), nil); !errors.Is(err, c.err) {
		t.Fatalf("purge error %v", err)
	}
	if err := New(Deps{Logger: log}).purge(t.Context(), nil); err != nil {
		t.Fatalf("purge without a cache: %v", err)
	}
}

type fakeBreakerList struct {
	mu  sync.Mutex
	sts []breaker.Status
	err error
}

func (b *fakeBreakerList) List(context.Context) ([]breaker.Status, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.sts), b.err
}

type fakeKeyPool struct {
	mu     sync.Mutex
	avail  map[llm.Route]int
	routes map[llm.Route]int
}

func (p *fakeKeyPool) Available(context.Context) (map[llm.Route]int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.avail, nil
}

func (p *fakeKeyPool) Routes() map[llm.Route]int { return p.routes }

type fakeNotifier struct {
	mu     sync.Mutex
	events []alert.Event
	err    error
}

func (n *fakeNotifier) Notify(_ context.Context, e alert.Event) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.events = append(n.events, e)
	return n.err
}

// take returns "kind subject" of the events since the last take.
func (n *fakeNotifier) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, e := range n.events {
		out = append(out, string(e.Kind)+" "+e.Subject)
	}
	n.events = nil
	slices.Sort(out)
	return out
}

// Alerts follow state: a breaker not closed and a tier with keys but none
// available alert on every evaluation (the notifier throttles); each
// recovery is announced once, by whichever worker sees it first.
func TestEvaluateAlertsAndRecoveries(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	sonnet := llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	gpt4o := llm.Route{Provider: llm.ProviderOpenAI, Tier: "gpt4o"}
	haiku := llm.Route{Provider: llm.ProviderClaude, Tier: "haiku"}
	brs := &fakeBreakerList{sts: []breaker.Status{
		{Name: "claude/sonnet", State: breaker.StateOpen, Reason: "overloaded from k1", DegradedSince: time.Now()},
		{Name: "all", State: breaker.StateClosed}}}
	pool := &fakeKeyPool{routes: map[llm.Route]int{sonnet: 2, gpt4o: 1, haiku: 0},
		avail: map[llm.Route]int{sonnet: 0, gpt4o: 1}}
	n := &fakeNotifier{}
	deps := Deps{Breakers: brs, Pool: pool, Notifier: n, Redis: rdb, Prefix: "t:", Logger: slog.New(slog.DiscardHandler)}
	a, b := New(deps), New(deps) // two workers

	want := []string{"breaker_open claude/sonnet", "tier_exhausted claude/sonnet"}
	for _, j := range []*Jobs{a, b} {
		if err := j.evaluate(t.Context(), nil); err != nil {
			t.Fatal(err)
		}
		if got := n.take(); !slices.Equal(got, want) {
			t.Fatalf("alerts %v, want %v", got, want)
		}
	}
	brs.mu.Lock()
	brs.sts[0].State = breaker.StateClosed
	brs.mu.Unlock()
	pool.mu.Lock()
	pool.avail = map[llm.Route]int{sonnet: 1, gpt4o: 1}
	pool.mu.Unlock()
	if err := b.evaluate(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if got, want := n.take(), []string{"breaker_closed claude/sonnet", "tier_recovered claude/sonnet"}; !slices.Equal(got, want) {
		t.Fatalf("recoveries %v, want %v", got, want)
	}
	if err := a.evaluate(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if got := n.take(); len(got) != 0 {
		t.Fatalf("recoveries announced again by the other worker: %v", got)
	}

	brs.mu.Lock()
	brs.err = errors.New("redis down")
	brs.mu.Unlock()
	if err := a.evaluate(t.Context(), nil); err == nil {
		t.Fatal("a failed read of the breakers was not reported")
	}
}

// The daily report covers the 24 hours up to the last whole hour in the
// configured time zone (UTC when it is unknown) and goes to the notifier.
func TestDailyReport(t *testing.T) {
	t.Parallel()
	pg, err := pgxpool.New(t.Context(), testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	for _, tz := range []string{"Asia/Shanghai", "Mars/Olympus_Mons"} {
		n := &fakeNotifier{}
		j := New(Deps{PG: pg, Notifier: n, Report: config.Report{Timezone: tz}, Language: "en", Logger: slog.New(slog.DiscardHandler)})
		loc, err := time.LoadLocation(tz)
		if err != nil {
			loc = time.UTC
		}
		day := func() string {
			return time.Now().In(loc).Truncate(time.Hour).Add(-24 * time.Hour).Format(time.DateOnly)
		}
		before := day()
		if err := j.report(t.Context(), nil); err != nil {
			t.Fatalf("%s: %v", tz, err)
		}
		after := day()
		if len(n.events) != 1 || n.events[0].Kind != alert.KindDailyReport ||
			(n.events[0].Subject != before && n.events[0].Subject != after) || n.events[0].Summary == "" {
			t.Fatalf("%s: report events %+v, want one daily report of %s", tz, n.events, before)
		}
	}
	n := &fakeNotifier{err: errors.New("webhook down")}
	if err := New(Deps{PG: pg, Notifier: n, Logger: slog.New(slog.DiscardHandler)}).report(t.Context(), nil); err == nil {
		t.Fatal("a failed delivery was not reported")
	}
}

// Every periodic job has a handler.
func TestRegisterCoversEveryTask(t *testing.T) {
	t.Parallel()
	mux := asynq.NewServeMux()
	New(Deps{}).Register(mux)
	for _, typ := range []string{TaskPurgeCache, TaskAlerts, TaskReport, TaskExpire, TaskPrune, TaskReconcile} {
		if _, pattern := mux.Handler(asynq.NewTask(typ, nil)); pattern != typ {
			t.Errorf("%s is handled by %q", typ, pattern)
		}
	}
}

// The schedule: each job at its interval, the report daily at the
// configured time, all on the maintenance queue, unique per tick.
func TestSchedule(t *testing.T) {
	t.Parallel()
	opt := testenv.RedisOptions(t)
	s := asynq.NewScheduler(asynq.RedisClientOpt{Addr: opt.Addr, DB: opt.DB},
		&asynq.SchedulerOpts{HeartbeatInterval: 20 * time.Millisecond, LogLevel: asynq.FatalLevel})
	// A bad report time is refused before anything is registered (the
	// entries below would show it).
	for _, bad := range []string{"7", "seven:30", "07:xx", ""} {
		if err := Schedule(s, time.Minute, bad); err == nil {
			t.Errorf("report time %q accepted", bad)
		}
	}
	if err := Schedule(s, 2*time.Minute, "07:30"); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: opt.Addr, DB: opt.DB})
	defer insp.Close()
	want := []string{
		"@every 10m bulwark:cache:purge Queue(\"maintenance\") Unique(5m0s) MaxRetry(2)",
		"@every 15s bulwark:queue:expire Queue(\"maintenance\") Unique(10s) MaxRetry(2)",
		"@every 1h bulwark:history:prune Queue(\"maintenance\") Unique(30m0s) MaxRetry(2)",
		"@every 1m bulwark:history:reconcile Queue(\"maintenance\") Unique(50s) MaxRetry(2)",
		"@every 2m0s bulwark:alerts:evaluate Queue(\"maintenance\") Unique(1m0s) MaxRetry(2)",
		"30 7 * * * bulwark:report:daily Queue(\"maintenance\") Unique(12h0m0s) MaxRetry(2)",
	}
	slices.Sort(want)
	// The scheduler publishes its entries with its heartbeat: wait for it.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(10 * time.Second)
	var got []string
	for {
		entries, err := insp.SchedulerEntries()
		got = got[:0]
		for _, e := range entries {
			var opts []string
			for _, o := range e.Opts {
				opts = append(opts, o.String())
			}
			got = append(got, fmt.Sprintf("%s %s %s", e.Spec, e.Task.Type(), strings.Join(opts, " ")))
		}
		slices.Sort(got)
		if err == nil && len(got) == len(want) {
			break
		}
		select {
		case <-tick.C:
		case <-timeout:
			t.Fatalf("scheduler entries %v, %v", got, err)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("schedule\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
