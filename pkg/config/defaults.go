package config

import (
	"time"

	"bulwark/pkg/priority"
)

// Defaults of the design document; see each field's comment.
const (
	ListenDefault                   = "127.0.0.1:8080"
	MaxBodyBytesDefault             = 1 << 20
	MaxPromptCharsDefault           = 200_000
	MaxTokensLimitDefault           = 32_000
	DefaultMaxTokensDefault         = 1024
	SyncTimeoutDefault              = 60 * time.Second
	ResultTTLDefault                = 24 * time.Hour
	ServerShutdownTimeoutDefault    = 10 * time.Second
	ReadHeaderTimeoutDefault        = 5 * time.Second
	ReadTimeoutDefault              = 30 * time.Second
	IdleTimeoutDefault              = 120 * time.Second
	MaxHeaderBytesDefault           = 64 << 10
	WriteTimeoutDefault             = 30 * time.Second
	StreamMaxLifetimeDefault        = 15 * time.Minute
	RedisAddrDefault                = "127.0.0.1:16379"
	RedisPrefixDefault              = "bulwark:"
	PGMaxConnsDefault               = 10
	WorkerConcurrencyDefault        = 32
	WorkerMetricsListenDefault      = "127.0.0.1:9091"
	TaskCheckIntervalDefault        = 20 * time.Millisecond
	DelayedTaskCheckIntervalDefault = 100 * time.Millisecond
	WorkerShutdownTimeoutDefault    = 25 * time.Second
	MaxAttemptsDefault              = 8
	ProviderTimeoutDefault          = 120 * time.Second
	MaxConcurrentLLMCallsDefault    = 20
	QueueMaxWaitDefault             = 300 * time.Second
	QueueMaxDepthDefault            = 200
	SlotLeaseDefault                = 30 * time.Second
	BurstWindowDefault              = time.Second
	PaceWaitDefault                 = time.Second
	HoldWaitDefault                 = 10 * time.Second
	// KeyLeaseDefault is how long a key's in-flight lease lives unsettled
	// (keypool.LeaseTTLDefault); validation checks it outlasts a call.
	KeyLeaseDefault                = 3 * time.Minute
	CacheThresholdDefault          = 0.95
	CacheDefaultLayerDefault       = "agent"
	BreakerFailureThresholdDefault = 3
	BreakerOpenDurationDefault     = 60 * time.Second
	BreakerHalfOpenMaxCallsDefault = 1
	BreakerSuccessThresholdDefault = 2
	AlertThrottleDefault           = 5 * time.Minute
	AlertIntervalDefault           = 30 * time.Second
	ReportAtDefault                = "08:00"
	TenantRPMDefault               = 1200
	HistoryRetentionDefault        = 30 * 24 * time.Hour
	TenantMaxStreamsDefault        = 200
	TenantMaxSyncWaitsDefault      = 100
)

// ReservedDefault is the design document's per-priority reserve (4.2).
var ReservedDefault = map[priority.Priority]int{priority.Critical: 5, priority.High: 10, priority.Normal: 4, priority.Low: 1}

// WeightsDefault are the asynq queue weights.
var WeightsDefault = map[priority.Priority]int{priority.Critical: 6, priority.High: 3, priority.Normal: 2, priority.Low: 1}

// CacheTTLDefault is the design document's TTL per cache layer.
var CacheTTLDefault = map[string]time.Duration{"router": 24 * time.Hour, "agent": 4 * time.Hour, "synthesizer": 2 * time.Hour}

func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func (c *Config) setDefaults() {
	s := &c.Server
	orDefault(&s.Listen, ListenDefault)
	orDefault(&s.MaxBodyBytes, MaxBodyBytesDefault)
	orDefault(&s.MaxPromptChars, MaxPromptCharsDefault)
	orDefault(&s.MaxTokensLimit, MaxTokensLimitDefault)
	orDefault(&s.DefaultMaxTokens, DefaultMaxTokensDefault)
	orDefault(&s.SyncTimeout, SyncTimeoutDefault)
	orDefault(&s.ResultTTL, ResultTTLDefault)
	orDefault(&s.ShutdownTimeout, ServerShutdownTimeoutDefault)
	orDefault(&s.ReadHeaderTimeout, ReadHeaderTimeoutDefault)
	orDefault(&s.ReadTimeout, ReadTimeoutDefault)
	orDefault(&s.IdleTimeout, IdleTimeoutDefault)
	orDefault(&s.MaxHeaderBytes, MaxHeaderBytesDefault)
	orDefault(&s.WriteTimeout, WriteTimeoutDefault)
	orDefault(&s.StreamMaxLifetime, StreamMaxLifetimeDefault)

	orDefault(&c.Redis.Addr, RedisAddrDefault)
	orDefault(&c.Redis.Prefix, RedisPrefixDefault)
	orDefault(&c.Postgres.MaxConns, PGMaxConnsDefault)
	orDefault(&c.Postgres.HistoryRetention, HistoryRetentionDefault)

	w := &c.Worker
	orDefault(&w.Concurrency, WorkerConcurrencyDefault)
	orDefault(&w.MetricsListen, WorkerMetricsListenDefault)
	orDefault(&w.TaskCheckInterval, TaskCheckIntervalDefault)
	orDefault(&w.DelayedTaskCheckInterval, DelayedTaskCheckIntervalDefault)
	orDefault(&w.ShutdownTimeout, WorkerShutdownTimeoutDefault)
	orDefault(&w.MaxAttempts, MaxAttemptsDefault)
	orDefault(&w.PaceWait, PaceWaitDefault)
	orDefault(&w.HoldWait, HoldWaitDefault)

	orDefault(&c.Log.Format, "json")
	orDefault(&c.Log.Level, "info")

	for name, p := range c.Providers {
		orDefault(&p.Timeout, ProviderTimeoutDefault)
		orDefault(&p.BurstWindow, BurstWindowDefault)
		c.Providers[name] = p
	}
	for i := range c.Keys {
		k := &c.Keys[i]
		if p, ok := c.Providers[k.Provider]; ok {
			orDefault(&k.BurstWindow, p.BurstWindow)
		}
	}

	q := &c.Queue
	orDefault(&q.MaxConcurrentLLMCalls, MaxConcurrentLLMCallsDefault)
	orDefault(&q.MaxWait, QueueMaxWaitDefault)
	orDefault(&q.MaxDepth, QueueMaxDepthDefault)
	orDefault(&q.SlotLease, SlotLeaseDefault)
	q.Reserved = withDefaults(q.Reserved, ReservedDefault)
	q.Weights = withDefaults(q.Weights, WeightsDefault)

	ca := &c.Cache
	if ca.Enabled == nil {
		t := true
		ca.Enabled = &t
	}
	if ca.TenantIsolation == nil {
		t := true
		ca.TenantIsolation = &t
	}
	orDefault(&ca.Threshold, CacheThresholdDefault)
	orDefault(&ca.DefaultLayer, CacheDefaultLayerDefault)
	ca.TTL = withDefaults(ca.TTL, CacheTTLDefault)
	orDefault(&ca.Embedder.Kind, "local")

	b := &c.Breaker
	orDefault(&b.FailureThreshold, BreakerFailureThresholdDefault)
	orDefault(&b.OpenDuration, BreakerOpenDurationDefault)
	orDefault(&b.HalfOpenMaxCalls, BreakerHalfOpenMaxCallsDefault)
	orDefault(&b.SuccessThreshold, BreakerSuccessThresholdDefault)

	for i := range c.Tenants {
		t := &c.Tenants[i]
		orDefault(&t.DefaultPriority, priority.Normal)
		orDefault(&t.MaxPriority, priority.High)
		orDefault(&t.DefaultLayer, ca.DefaultLayer)
		orDefault(&t.RateLimitRPM, TenantRPMDefault)
		orDefault(&t.MaxStreams, TenantMaxStreamsDefault)
		orDefault(&t.MaxSyncWaits, TenantMaxSyncWaitsDefault)
		// One tenant may fill the queue; among several none may take more
		// than half of it.
		share := c.Queue.MaxDepth
		if len(c.Tenants) > 1 {
			share = max(1, c.Queue.MaxDepth/2)
		}
		orDefault(&t.MaxQueued, share)
		t.bothTokens = !t.Token.IsZero() && t.TokenSHA256 != ""
		if !t.Token.IsZero() && t.TokenSHA256 == "" {
			t.TokenSHA256 = t.Token.SHA256()
		}
		t.Token = secretZero // keep only the hash in memory
	}

	orDefault(&c.Alerts.Throttle, AlertThrottleDefault)
	orDefault(&c.Alerts.Interval, AlertIntervalDefault)
	orDefault(&c.Alerts.Language, "zh")
	orDefault(&c.Report.At, ReportAtDefault)
	orDefault(&c.Report.Timezone, "UTC")
}

// withDefaults returns m with every missing key of def filled in.
func withDefaults[K comparable, V any](m, def map[K]V) map[K]V {
	out := make(map[K]V, len(def))
	for k, v := range def {
		out[k] = v
	}
	for k, v := range m {
		out[k] = v
	}
	return out
}
