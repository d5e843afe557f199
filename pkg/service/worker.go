package service

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/config"
	"bulwark/pkg/dispatch"
	"bulwark/pkg/llm"
	"bulwark/pkg/maintenance"
	"bulwark/pkg/priority"
	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/provider/azure"
	"bulwark/pkg/provider/bedrock"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/queue"
	"bulwark/pkg/redisconn"
	"bulwark/pkg/report"
)

// Clients builds an adapter per configured provider, by its kind. A
// local model speaks the OpenAI wire format: the OpenAI adapter serves it.
func (b *Base) Clients() map[llm.Provider]llm.Client {
	out := map[llm.Provider]llm.Client{}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	for name, p := range b.Cfg.Providers {
		switch p.Kind {
		case config.KindAnthropic:
			out[name] = anthropic.New(anthropic.Config{BaseURL: p.BaseURL, Timeout: p.Timeout}, hc)
		case config.KindOpenAI, config.KindLocal:
			out[name] = openai.New(openai.Config{BaseURL: p.BaseURL, Timeout: p.Timeout}, hc)
		case config.KindBedrock:
			out[name] = bedrock.New(bedrock.Config{Provider: name, BaseURL: p.BaseURL, Timeout: p.Timeout}, hc)
		case config.KindAzure:
			out[name] = azure.New(b.azureConfig(name, p), hc)
		}
	}
	return out
}

// azureConfig is an Azure provider's adapter configuration: its PTU keys,
// and with auth entra the environment's Azure credential chain. Should
// that chain not build, the adapter is left without one and every call
// fails as an auth error (its keys are disabled and alerted), as a
// rejected key would.
func (b *Base) azureConfig(name llm.Provider, p config.ProviderCfg) azure.Config {
	c := azure.Config{Name: name, BaseURL: p.BaseURL, APIVersion: p.APIVersion, Auth: p.Auth, Timeout: p.Timeout,
		PTUKeys: map[string]bool{}}
	for _, k := range b.Cfg.Keys {
		if k.Provider == name && k.PTU {
			c.PTUKeys[k.ID] = true
		}
	}
	if p.Auth == config.AuthEntra {
		ts, err := azure.NewDefaultTokenSource(nil)
		if err != nil {
			b.Logger.Error("azure: no Entra ID credential; its calls will fail", "provider", string(name), "err", err)
		} else {
			c.Token = ts
		}
	}
	return c
}

// Worker builds the asynq server and its handlers (provider calls and the
// periodic jobs the scheduler enqueues). Run it with srv.Run(mux) or
// Start/Shutdown.
func (b *Base) Worker(clients map[llm.Provider]llm.Client) (*asynq.Server, *asynq.ServeMux) {
	cfg := b.Cfg
	dc := cfg.DispatchConfig()
	dc.Clients = clients
	if b.Compressor != nil {
		dc.Compress = b.Compressor.Request
	}
	d := dispatch.New(dc, dispatch.Deps{
		Jobs: b.Jobs, Starts: b.Queue, Slots: b.Slots, Pool: b.Pool, Breakers: b.Breakers,
		Finisher: b.Finisher, Alerter: b, Metrics: b.Metrics, Logger: b.Logger,
	})
	srv := asynq.NewServerFromRedisClient(b.Redis, asynq.Config{
		Concurrency:              cfg.Worker.Concurrency,
		Queues:                   queueWeights(cfg.Queue),
		StrictPriority:           cfg.Queue.StrictPriority,
		TaskCheckInterval:        cfg.Worker.TaskCheckInterval,
		DelayedTaskCheckInterval: cfg.Worker.DelayedTaskCheckInterval,
		ShutdownTimeout:          cfg.Worker.ShutdownTimeout,
		IsFailure:                dispatch.IsFailure,
		RetryDelayFunc:           dispatch.RetryDelay,
		Logger:                   asynqLogger{b.Logger},
		LogLevel:                 asynq.WarnLevel,
	})
	mux := asynq.NewServeMux()
	mux.Handle(queue.TaskType, d)
	maint := maintenance.New(b.maintenanceDeps())
	maint.Register(mux)
	return srv, mux
}

// Scheduler registers the periodic jobs; the workers run them.
func (b *Base) Scheduler() (*asynq.Scheduler, error) {
	loc, err := time.LoadLocation(b.Cfg.Report.Timezone)
	if err != nil {
		return nil, err
	}
	// The scheduler gets a connection of its own: asynq closes it on
	// Shutdown, which it refuses to do for a shared client.
	s := asynq.NewScheduler(redisconn.AsynqOpt(b.Cfg.RedisConnConfig()), &asynq.SchedulerOpts{Location: loc, Logger: asynqLogger{b.Logger},
		LogLevel: asynq.WarnLevel})
	if err := maintenance.Schedule(s, b.Cfg.Alerts.Interval, b.Cfg.Report.At); err != nil {
		return nil, err
	}
	return s, nil
}

// asynqLogger routes asynq's logs to slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Fatal(args ...any) {
	a.l.Error(fmt.Sprint(args...), "component", "asynq")
	os.Exit(1)
}

// reporter builds reports for the admin endpoint.
type reporter struct{ b *Base }

func (r reporter) ReportJSON(ctx context.Context, from, to time.Time) (any, error) {
	return report.Build(ctx, r.b.PG, from, to)
}

// queueWeights gives asynq the queues and their weights. Under strict
// priority asynq empties queues in the order of these numbers, so there
// they follow the priorities (critical highest) rather than the configured
// weights, and the periodic jobs, which are short, come first.
func queueWeights(q config.Queue) map[string]int {
	out := map[string]int{maintenance.Queue: 1}
	for i, p := range priority.All {
		out[queue.Name(p)] = q.Weights[p]
		if q.StrictPriority {
			out[queue.Name(p)] = len(priority.All) - i
			out[maintenance.Queue] = len(priority.All) + 1
		}
	}
	return out
}

// maintenanceDeps are the periodic jobs' and the sweeper's collaborators.
func (b *Base) maintenanceDeps() maintenance.Deps {
	var purger maintenance.CachePurger
	if b.Cache != nil {
		purger = b.Cache
	}
	cfg := b.Cfg
	return maintenance.Deps{Cache: purger, History: b.History, Retention: cfg.Postgres.HistoryRetention, Pool: b.Pool, Breakers: b.Breakers, Notifier: b.Notifier,
		PG: b.PG, Redis: b.Redis, Prefix: cfg.Redis.Keyspace().Root(), Report: cfg.Report, Language: cfg.Alerts.Language, Logger: b.Logger,
		Jobs: b.Jobs, Queues: b.Queue, Finisher: b.Finisher,
		Unended: b.History, Records: b.Jobs, RecordTTL: cfg.Server.ResultTTL, ReconcileAfter: reconcileAfter(cfg.Queue.MaxWait),
		OnLost: func(n int64) { b.Metrics.RequestsLost.Add(float64(n)) }}
}

// reconcileAfter is how old a request must be before the reconcile job
// judges it: twice the longest a request may wait to start, and never
// less than the job's default.
func reconcileAfter(maxWait time.Duration) time.Duration {
	return max(maintenance.ReconcileAfterDefault, 2*maxWait)
}

// Sweeper builds the orphan sweep every worker runs (maintenance.Sweeper):
// start it with Start(ctx), stop it with Stop.
func (b *Base) Sweeper() *maintenance.Sweeper {
	return maintenance.NewSweeper(maintenance.SweeperDeps{Jobs: b.Jobs, Queue: b.Queue, Finisher: b.Finisher,
		History: b.History, Redis: b.Redis, Prefix: b.Cfg.Redis.Keyspace().Root(), Logger: b.Logger})
}
