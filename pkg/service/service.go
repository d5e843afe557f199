// Package service wires Bulwark's components: it opens Redis and
// PostgreSQL, builds each component from the Config pkg/config built for it
// (config.SlotsConfig, BreakerConfig, …), connects them through the
// interfaces they declare, and closes them. It holds no logic of its own
// beyond small adapters between those interfaces. The api, worker and
// scheduler mains call Open, take what they need, and Close in the reverse
// order of opening: whoever opens a pool closes it.
package service

import (
	"context"
	"errors"
	"fmt"
	"github.com/IBM/pgxpoolprometheus"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/alert"
	"bulwark/pkg/breaker"
	"bulwark/pkg/cache"
	"bulwark/pkg/coalesce"
	"bulwark/pkg/compress"
	"bulwark/pkg/config"
	"bulwark/pkg/embed"
	"bulwark/pkg/finish"
	"bulwark/pkg/history"
	"bulwark/pkg/httpapi"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/pgdb"
	"bulwark/pkg/queue"
	"bulwark/pkg/redisconn"
	"bulwark/pkg/slots"
)

// Base holds the components every process shares.
type Base struct {
	Cfg    *config.Config
	Logger *slog.Logger
	// Redis is a *redis.Client (standalone, sentinel) or a
	// *redis.ClusterClient (cluster); see pkg/redisconn.
	Redis    redis.UniversalClient
	PG       *pgxpool.Pool
	Jobs     *job.Store
	Queue    *queue.Queue
	Slots    *slots.Limiter
	Pool     *keypool.Pool
	Breakers *breaker.Set
	// Claims coalesce identical requests in flight.
	Claims *coalesce.Claims
	// Finisher ends every request, whoever ends it.
	Finisher *finish.Finisher
	// AfterStore is a test failpoint between storing a request and
	// enqueueing it (intake.Config.AfterStore); nil in production.
	AfterStore func(id string) error
	Registry   *prometheus.Registry
	Metrics    *metrics.Metrics
	History    *history.Store
	Notifier   *alert.Notifier
	// Cache is nil when the cache is disabled.
	Cache *cache.Cache
	// Compressor is nil unless compression.enabled.
	Compressor *compress.Compressor

	// migrated is set once PostgreSQL's schema is known to be current;
	// until then cache and history calls fail and are counted (pg.go).
	migrated atomic.Bool
	// stopMigrate ends the background migration retries (Close).
	stopMigrate context.CancelFunc
	migrating   sync.WaitGroup
}

// NewLogger builds the process logger from the configuration.
func NewLogger(cfg config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(strings.ToUpper(cfg.Level)))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "text" {
		return slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, opts))
}

// Open connects to Redis and PostgreSQL (applying migrations) and builds
// the shared components. On error everything opened so far is closed.
func Open(ctx context.Context, cfg *config.Config, logger *slog.Logger) (b *Base, err error) {
	b = &Base{Cfg: cfg, Logger: logger}
	// The deferred close keeps its own reference: the error returns below
	// set the named result to nil.
	opened := b
	defer func() {
		if err != nil {
			opened.Close()
		}
	}()
	rc := cfg.RedisConnConfig()
	b.Redis = redisconn.New(rc)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.Redis.Ping(pctx).Err(); err != nil {
		return nil, fmt.Errorf("service: redis (%s): %w", rc.Where(), err)
	}
	redisconn.Check(pctx, b.Redis, logger)

	cacheCfg := cfg.CacheConfig()
	b.PG, err = pgdb.Open(ctx, pgdb.Config{DSN: cfg.Postgres.DSN.Reveal(), MaxConns: cfg.Postgres.MaxConns,
		AfterConnect: cache.AfterConnectWith(cacheCfg)})
	if err != nil {
		return nil, fmt.Errorf("service: postgres: %w", err)
	}
	pgUp, err := b.migrate(ctx)
	if err != nil {
		return nil, err
	}

	ks := cfg.Redis.Keyspace()
	b.Registry = prometheus.NewRegistry()
	b.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		// Each process's own pools: exhausted pools show there first.
		metrics.NewRedisPoolCollector(b.Redis), pgxpoolprometheus.NewCollector(b.PG, nil))
	b.Metrics = metrics.New(b.Registry)
	var ids []string
	for _, k := range cfg.Keys {
		ids = append(ids, k.ID)
	}
	b.Metrics.InitKeys(ids...)

	b.Jobs = job.NewStore(b.Redis, ks.Jobs(), cfg.Server.ResultTTL)
	b.Slots, err = slots.New(b.Redis, cfg.SlotsConfig())
	if err != nil {
		return nil, err
	}
	qc := cfg.QueueConfig()
	qc.Waiters = b.Slots
	b.Queue = queue.New(b.Redis, qc)
	b.Pool, err = keypool.New(ctx, b.Redis, cfg.KeypoolConfig(), logger)
	if err != nil {
		return nil, fmt.Errorf("service: key pool: %w", err)
	}
	b.Notifier, err = alert.New(b.Redis, cfg.AlertConfig(), nil, logger)
	if err != nil {
		return nil, fmt.Errorf("service: alerts: %w", err)
	}
	bc := cfg.BreakerConfig()
	bc.OnTransition = b.breakerAlert
	b.Breakers, err = breaker.New(b.Redis, bc, logger)
	if err != nil {
		return nil, fmt.Errorf("service: breakers: %w", err)
	}
	b.History = history.New(b.PG, logger, time.Minute)
	b.History.FlushTimeout = cfg.Postgres.HistoryFlushTimeout
	b.Claims = coalesce.New(b.Redis, ks.Root())
	b.History.OnError = func() { b.Metrics.HistoryErrors.Inc() }
	b.History.OnDrop = func() { b.Metrics.HistoryDropped.Inc() }
	b.History.Outbox(b.Redis, ks.HistoryOutbox(), history.OutboxMaxDefault)
	b.History.Start()
	b.Jobs.WithBudgets(budgets(cfg.StoredBytes(), b.History, logger))

	if cfg.Compression.Enabled {
		if b.Compressor, err = compress.New(cfg.CompressConfig()); err != nil {
			return nil, fmt.Errorf("service: compression: %w", err)
		}
	}
	if *cfg.Cache.Enabled {
		emb, err := embed.New(cfg.EmbedConfig())
		if err != nil {
			return nil, fmt.Errorf("service: embedder: %w", err)
		}
		if pgUp {
			b.Cache, err = cache.New(ctx, b.PG, emb, cacheCfg, logger)
		} else {
			b.Cache, err = cache.Open(b.PG, emb, cacheCfg, logger) // prepared once PostgreSQL is back
		}
		if err != nil {
			return nil, fmt.Errorf("service: cache: %w", err)
		}
	}
	fd := finish.Deps{Jobs: b.Jobs, History: b.History, Claims: b.Claims, Metrics: b.Metrics, Price: cfg.Price, Logger: logger}
	if b.Cache != nil {
		c := b.Cache
		b.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metrics.NameCacheStoresShed,
			Help: "Provider answers not cached because the cache's answer writer was behind (PostgreSQL slower than the answers)."},
			func() float64 { return float64(c.Stats().StoresShed) }))
		b.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: metrics.NameCacheMemoHits,
			Help: "Exact cache hits an API process answered from its memory, without PostgreSQL (also counted as exact hits)."},
			func() float64 { return float64(c.Stats().MemoHits) }))
		fd.Answers = c
	}
	b.Finisher = finish.New(fd)
	if !pgUp {
		b.migrateLater(ctx)
	}
	return b, nil
}

// Close closes what Open opened, in reverse order.
func (b *Base) Close() {
	if b.stopMigrate != nil {
		b.stopMigrate()
		b.migrating.Wait()
	}
	if b.Cache != nil {
		b.Cache.Stop()
	}
	if b.History != nil {
		b.History.Close() // the queued rows, before PostgreSQL closes
	}
	if b.Queue != nil {
		_ = b.Queue.Close()
	}
	if b.PG != nil {
		b.PG.Close()
	}
	if b.Redis != nil {
		_ = b.Redis.Close()
	}
}

// WatchBreakers keeps the breakers' views of healthy breakers while the
// worker runs (breaker.Set.Watch: most calls then cost no breaker round
// trip); stop ends it and waits.
func (b *Base) WatchBreakers() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Breakers.Watch(ctx) }()
	return func() { cancel(); <-done }
}

// MetricsHandler serves the registry.
func (b *Base) MetricsHandler() http.Handler {
	return promHandler(b.Registry)
}

// DebugHandler is the worker's metrics listener (worker.metrics_listen,
// loopback by default): /metrics without a token, for a Prometheus on a
// private network, and the runtime profiles under /debug/pprof/ behind
// the admin token, as on the API. The profiles want the token wherever
// the listener is bound: a CPU profile stalls the process for its
// seconds and the goroutine dump shows request internals, and "is this
// address loopback" cannot be told from a host name or from inside a
// container whose port is published.
func (b *Base) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", b.MetricsHandler())
	mux.Handle(profilesPrefix, httpapi.AdminOnly(b.Cfg.Server.AdminToken, profiles()))
	return mux
}

// breakerAlert turns breaker transitions into instant alerts.
func (b *Base) breakerAlert(name string, from, to breaker.State, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	go func() { // OnTransition must not block the caller
		defer cancel()
		ev := alert.Event{Kind: alert.KindBreakerOpen, Subject: name,
			Summary: fmt.Sprintf("circuit breaker %s opened: %s", name, reason), Details: map[string]string{"from": string(from)}}
		switch {
		case to == breaker.StateOpen && from == breaker.StateClosed:
		case to == breaker.StateClosed:
			ev.Kind, ev.Summary = alert.KindBreakerClosed, fmt.Sprintf("circuit breaker %s closed again", name)
		default:
			return
		}
		if err := b.Notifier.Notify(ctx, ev); err != nil {
			b.Logger.Warn("alert: breaker", "breaker", name, "err", err)
		}
	}()
}

// KeyDisabled alerts that a key was disabled (quota, credentials).
func (b *Base) KeyDisabled(ctx context.Context, keyID string, route llm.Route, reason string) {
	ev := alert.Event{Kind: alert.KindKeyQuotaExhausted, Subject: keyID,
		Summary: fmt.Sprintf("key %s (%s) disabled: %s; re-enable it at POST /admin/keys/%s/enable once fixed", keyID, route, reason, keyID),
		Details: map[string]string{"route": route.String(), "reason": reason}}
	if err := b.Notifier.Notify(context.WithoutCancel(ctx), ev); err != nil && !errors.Is(err, context.Canceled) {
		b.Logger.Warn("alert: key disabled", "key_id", keyID, "err", err)
	}
}

// HTTPServer returns a server for addr with the listener limits of
// config.Server (header and read timeouts, idle timeout, header size), so
// that no listener of a Bulwark process can be held by a slow client.
func (b *Base) HTTPServer(addr string, h http.Handler) *http.Server {
	s := b.Cfg.Server
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: s.ReadHeaderTimeout, ReadTimeout: s.ReadTimeout,
		IdleTimeout: s.IdleTimeout, MaxHeaderBytes: s.MaxHeaderBytes,
		ErrorLog: slog.NewLogLogger(b.Logger.Handler(), slog.LevelWarn)}
}
