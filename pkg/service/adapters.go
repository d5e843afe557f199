package service

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/alert"
	"bulwark/pkg/cache"
	"bulwark/pkg/config"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
)

// tenantLimiter bounds a tenant's submissions with GCRA (go-redis/redis_rate).
type tenantLimiter struct {
	l    *redis_rate.Limiter
	keys config.Keyspace
}

func (t tenantLimiter) Allow(ctx context.Context, tenant string, perMinute int) (bool, time.Duration, error) {
	res, err := t.l.Allow(ctx, t.keys.Tenant(tenant), redis_rate.PerMinute(perMinute))
	if err != nil {
		return false, 0, fmt.Errorf("tenant limit: %w", err)
	}
	return res.Allowed > 0, res.RetryAfter, nil
}

// readState gathers the shared state gauges for a scrape.
func (b *Base) readState(ctx context.Context) (metrics.State, error) {
	var s metrics.State
	depth, err := b.Queue.Depth(ctx)
	if err != nil {
		return s, err
	}
	used, err := b.Slots.InUse(ctx)
	if err != nil {
		return s, err
	}
	avail, err := b.Pool.Available(ctx)
	if err != nil {
		return s, err
	}
	brs, err := b.Breakers.List(ctx)
	if err != nil {
		return s, err
	}
	oldest, err := b.Queue.OldestPending(ctx)
	if err != nil {
		return s, err
	}
	backlog, err := b.History.Backlog(ctx)
	if err != nil {
		return s, err
	}
	s.HistoryBacklog = int(backlog)
	s.QueueDepth, s.SlotsInUse, s.OldestWaitSeconds = map[string]int{}, map[string]int{}, map[string]float64{}
	for _, p := range priority.All {
		s.QueueDepth[p.String()] = depth[p]
		s.SlotsInUse[p.String()] = used[p]
		s.OldestWaitSeconds[p.String()] = 0
		if id, ok := oldest[p]; ok {
			if rec, err := b.Jobs.Get(ctx, id); err == nil {
				s.OldestWaitSeconds[p.String()] = time.Since(rec.Job.CreatedAt).Seconds()
			}
		}
	}
	s.KeysAvailable, s.KeysTotal = map[string]int{}, map[string]int{}
	for r, n := range b.Pool.Routes() {
		s.KeysTotal[r.String()] = n
		s.KeysAvailable[r.String()] = avail[r]
	}
	s.BreakerState = map[string]int{}
	for _, st := range brs {
		v, _ := metrics.BreakerStateValue(string(st.State))
		s.BreakerState[st.Name] = v
	}
	return s, nil
}

// keyAdmin is the key pool as the admin endpoints see it: re-enabling a
// key is announced like its disabling was.
type keyAdmin struct{ b *Base }

func (k keyAdmin) Snapshot(ctx context.Context) ([]keypool.KeyState, error) {
	return k.b.Pool.Snapshot(ctx)
}

func (k keyAdmin) Disable(ctx context.Context, keyID, reason string) error {
	return k.b.Pool.Disable(ctx, keyID, reason)
}

func (k keyAdmin) Enable(ctx context.Context, keyID string) error {
	if err := k.b.Pool.Enable(ctx, keyID); err != nil {
		return err
	}
	ev := alert.Event{Kind: alert.KindKeyEnabled, Subject: keyID, Summary: fmt.Sprintf("key %s re-enabled by an operator", keyID)}
	if err := k.b.Notifier.Notify(context.WithoutCancel(ctx), ev); err != nil {
		k.b.Logger.Warn("alert: key enabled", "key_id", keyID, "err", err)
	}
	return nil
}

// promoter moves a shared call to a more urgent priority: its slot wait,
// and its task while that is still pending in a less urgent queue (it may
// have been promoted once already, so each is tried).
type promoter struct{ b *Base }

func (pr promoter) Promote(ctx context.Context, rec *job.Record, p priority.Priority) error {
	if err := pr.b.Slots.Promote(ctx, rec.Job.ID, p, pr.b.Cfg.Queue.MaxWait); err != nil {
		return err
	}
	for from := rec.Job.Priority; from > p; from-- {
		moved, err := pr.b.Queue.Promote(ctx, rec.Job.ID, from, p)
		if err != nil || moved {
			return err
		}
	}
	return nil
}

// cacheAdmin invalidates cached answers and tells every API process
// (progress.Config.Notices) to empty its memo of exact hits, which may
// still hold them (cache/memo.go).
type cacheAdmin struct {
	c       *cache.Cache
	rdb     redis.UniversalClient
	channel string // config.Keyspace.CacheInvalidated
	logger  *slog.Logger
}

func (a cacheAdmin) InvalidateCase(ctx context.Context, tenant, caseID string) (int64, error) {
	n, err := a.c.InvalidateCase(ctx, tenant, caseID)
	a.tell(ctx)
	return n, err
}

func (a cacheAdmin) InvalidateNamespace(ctx context.Context, tenant, layer string) (int64, error) {
	n, err := a.c.InvalidateNamespace(ctx, tenant, layer)
	a.tell(ctx)
	return n, err
}

// tell announces an invalidation, even after a failed one (its delete may
// have happened), and even when the admin's request was cancelled.
// Unannounced, the other processes' memos drop the answers within
// cache.memo.ttl.
func (a cacheAdmin) tell(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := a.rdb.Publish(ctx, a.channel, "invalidated").Err(); err != nil {
		a.logger.Warn("cache: could not tell the other API processes of an invalidation; their memos keep the answers up to cache.memo.ttl",
			"err", err)
	}
}
