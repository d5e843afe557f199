package service

import (
	"context"
	"net/http"
	"os"

	"github.com/go-redis/redis_rate/v10"
	"github.com/hibiken/asynqmon"

	"bulwark/pkg/httpapi"
	"bulwark/pkg/intake"
	"bulwark/pkg/metrics"
	"bulwark/pkg/progress"
	"bulwark/pkg/redisconn"
)

// API builds the API's handlers and its event hub; run the hub with
// hub.Run(ctx) for as long as the handlers serve. admin is nil unless
// server.admin_listen is set: the admin endpoints are then on it alone.
func (b *Base) API() (api, admin http.Handler, hub *progress.Hub) {
	cfg := b.Cfg
	b.Registry.MustRegister(metrics.NewStateCollector(b.readState, 0))
	var cacheDep intake.Cache
	var admCache httpapi.CacheAdmin
	var notices map[string]func()
	if b.Cache != nil {
		ch := cfg.Redis.Keyspace().CacheInvalidated()
		cacheDep, admCache = b.Cache, cacheAdmin{c: b.Cache, rdb: b.Redis, channel: ch, logger: b.Logger}
		if cfg.Cache.Memo.MemoEnabled() {
			// The hub empties the memo on every invalidation notice.
			b.Cache.EnableMemo()
			notices = map[string]func(){ch: b.Cache.ForgetMemo}
		}
	}
	ic := cfg.IntakeConfig()
	ic.CacheEnabled, ic.AfterStore = b.Cache != nil, b.afterStore()
	in := intake.New(ic, intake.Deps{
		Jobs: b.intakeJobs(), Finisher: b.Finisher, Queue: b.Queue, Breakers: b.Breakers, History: b.History, Cache: cacheDep,
		Coalescer: b.Claims, Promoter: promoter{b}, Metrics: b.Metrics, Logger: b.Logger,
		RateLimiter: tenantLimiter{l: redis_rate.NewLimiter(b.Redis), keys: cfg.Redis.Keyspace()},
	})
	hub = progress.New(b.Redis, b.Queue, progress.Config{Channel: b.Jobs.Channel(), Notices: notices}, b.Logger)
	mon := asynqmon.New(asynqmon.Options{RootPath: "/admin/queues", ReadOnly: !cfg.Server.AdminQueuesWritable,
		RedisConnOpt: redisconn.AsynqOpt(cfg.RedisConnConfig())})
	httpCfg := cfg.HTTPConfig()
	httpCfg.Tenants = cfg.TenantsByToken()
	api, admin = httpapi.New(httpCfg, httpapi.Deps{
		Intake: in, Jobs: b.Jobs, Queue: b.Queue, Hub: hub, History: b.History,
		Keys: keyAdmin{b}, Breakers: b.Breakers, Cache: admCache, Reporter: reporter{b},
		Models: cfg.ModelResolver(), Metrics: b.MetricsHandler(), Queues: mon, Profiles: profiles(),
		Ready: map[string]httpapi.Pinger{
			"redis": func(ctx context.Context) error { return b.Redis.Ping(ctx).Err() },
		},
		Degradable: map[string]httpapi.Pinger{"postgres": b.postgresReady},
		Logger:     b.Logger,
	})
	return api, admin, hub
}

// FailpointEnv names the test-only failpoint: with the value
// "intake-after-store" the API process exits right after storing a
// request, before enqueueing it, as a crash there would (the fault tests
// prove the orphan sweep then runs it).
const FailpointEnv = "BULWARK_FAILPOINT"

// afterStore is the test failpoint: Base.AfterStore, else the environment's.
func (b *Base) afterStore() func(string) error {
	if b.AfterStore != nil {
		return b.AfterStore
	}
	return failpoint()
}

func failpoint() func(string) error {
	if os.Getenv(FailpointEnv) != "intake-after-store" {
		return nil
	}
	return func(string) error {
		os.Exit(3)
		return nil
	}
}
