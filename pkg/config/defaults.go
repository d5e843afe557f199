package config

import (
	"time"

	"bulwark/pkg/alert"
	"bulwark/pkg/breaker"
	"bulwark/pkg/cache"
	"bulwark/pkg/dispatch"
	"bulwark/pkg/embed"
	"bulwark/pkg/history"
	"bulwark/pkg/httpapi"
	"bulwark/pkg/intake"
	"bulwark/pkg/keypool"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/redisconn"
	"bulwark/pkg/slots"
)

// Defaults of the design document; see each field's comment. Where a
// component has a default of its own, this is it: one number, one place.
const (
	ListenDefault                = "127.0.0.1:8080"
	MaxBodyBytesDefault          = httpapi.MaxBodyBytesDefault
	MaxPromptCharsDefault        = intake.MaxPromptCharsDefault
	DefaultMaxTokensDefault      = intake.DefaultMaxTokensDefault
	ResultTTLDefault             = time.Hour
	ServerShutdownTimeoutDefault = 10 * time.Second
	ReadHeaderTimeoutDefault     = 5 * time.Second
	ReadTimeoutDefault           = 30 * time.Second
	IdleTimeoutDefault           = 120 * time.Second
	MaxHeaderBytesDefault        = 64 << 10
	WriteTimeoutDefault          = httpapi.WriteTimeoutDefault
	StreamMaxLifetimeDefault     = httpapi.StreamMaxLifetimeDefault
	StreamKeepAliveDefault       = httpapi.KeepAliveDefault
	RedisAddrDefault             = "127.0.0.1:16379"
	RedisPrefixDefault           = queue.PrefixDefault
	PGMaxConnsDefault            = 10
	// WorkerConcurrencyMin is the least worker.concurrency defaults to
	// (WorkerConcurrencyFor).
	WorkerConcurrencyMin            = 32
	WorkerMetricsListenDefault      = "127.0.0.1:9091"
	TaskCheckIntervalDefault        = 20 * time.Millisecond
	DelayedTaskCheckIntervalDefault = 100 * time.Millisecond
	WorkerShutdownTimeoutDefault    = 25 * time.Second
	MaxAttemptsDefault              = queue.MaxRetryDefault
	ProviderTimeoutDefault          = 120 * time.Second
	MaxConcurrentLLMCallsDefault    = slots.TotalDefault
	QueueMaxWaitDefault             = queue.MaxWaitDefault
	QueueMaxDepthDefault            = queue.MaxDepthDefault
	SlotLeaseDefault                = slots.LeaseTTLDefault
	BurstWindowDefault              = keypool.WindowDefault
	PaceWaitDefault                 = dispatch.PaceWaitDefault
	HoldWaitDefault                 = dispatch.HoldWaitDefault
	// KeyLeaseDefault is how long a key's in-flight lease lives unsettled
	// (keypool.LeaseTTLDefault); validation checks it outlasts a call.
	KeyLeaseDefault                = keypool.LeaseTTLDefault
	CacheThresholdDefault          = cache.ThresholdDefault
	CacheDefaultLayerDefault       = cache.DefaultLayerDefault
	BreakerFailureThresholdDefault = breaker.FailureThresholdDefault
	BreakerOpenDurationDefault     = breaker.OpenTimeoutDefault
	BreakerHalfOpenMaxCallsDefault = breaker.HalfOpenProbesDefault
	BreakerSuccessThresholdDefault = breaker.SuccessThresholdDefault
	AlertThrottleDefault           = alert.ThrottleDefault
	// ProbeMarginDefault is how much longer than the longest provider
	// timeout breaker.probe_timeout defaults to.
	ProbeMarginDefault             = 30 * time.Second
	AlertIntervalDefault           = 30 * time.Second
	ReportAtDefault                = "08:00"
	TenantRPMDefault               = 1200
	HistoryRetentionDefault        = 30 * 24 * time.Hour
	HistoryFlushTimeoutDefault     = history.FlushTimeoutDefault
	TenantMaxStreamsDefault        = 200
	TenantMaxSyncWaitsDefault      = 100
	TenantMaxStoredBytesDefault    = 256 << 20
	TenantMaxReadsPerSecondDefault = 500
)

// SyncTimeoutDefault is server.sync_timeout's default: queue_max_wait plus
// the longest provider timeout, the latest a request that has not failed
// at its deadline normally ends (it starts by then, and its call takes at
// most that). A shorter wait turned requests Bulwark was still going to
// answer into 429s, and the SDKs' retries into new requests at the back
// of the line. With the defaults 300 s + 120 s = 7 min, inside both
// official SDKs' own 10-minute limits (openai-go's response-header
// timeout, anthropic-sdk-go's per-request timeout). Call it once the
// queue and provider defaults are set.
func (c *Config) SyncTimeoutDefault() time.Duration {
	return c.Queue.MaxWait + c.LongestCall()
}

// ReservedDefault returns the design document's per-priority reserve (4.2).
func ReservedDefault() map[priority.Priority]int {
	return map[priority.Priority]int{priority.Critical: 5, priority.High: 10, priority.Normal: 4, priority.Low: 1}
}

// WeightsDefault returns the asynq queue weights.
func WeightsDefault() map[priority.Priority]int {
	return map[priority.Priority]int{priority.Critical: 6, priority.High: 3, priority.Normal: 2, priority.Low: 1}
}

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
	orDefault(&s.DefaultMaxTokens, DefaultMaxTokensDefault)
	orDefault(&s.ResultTTL, ResultTTLDefault)
	orDefault(&s.ShutdownTimeout, ServerShutdownTimeoutDefault)
	orDefault(&s.ReadHeaderTimeout, ReadHeaderTimeoutDefault)
	orDefault(&s.ReadTimeout, ReadTimeoutDefault)
	orDefault(&s.IdleTimeout, IdleTimeoutDefault)
	orDefault(&s.MaxHeaderBytes, MaxHeaderBytesDefault)
	orDefault(&s.WriteTimeout, WriteTimeoutDefault)
	orDefault(&s.StreamMaxLifetime, StreamMaxLifetimeDefault)
	orDefault(&s.StreamKeepAlive, StreamKeepAliveDefault)

	if c.Redis.Mode == "" || c.Redis.Mode == redisconn.ModeStandalone {
		orDefault(&c.Redis.Addr, RedisAddrDefault) // the other modes name no one server
	}
	orDefault(&c.Redis.Prefix, RedisPrefixDefault)
	orDefault(&c.Postgres.MaxConns, PGMaxConnsDefault)
	orDefault(&c.Postgres.HistoryRetention, HistoryRetentionDefault)
	orDefault(&c.Postgres.HistoryFlushTimeout, HistoryFlushTimeoutDefault)

	w := &c.Worker
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
		orDefault(&p.Kind, defaultKind(string(name)))
		if p.Kind == KindAzure {
			orDefault(&p.Auth, AuthAPIKey)
		}
		orDefault(&p.Timeout, ProviderTimeoutDefault)
		orDefault(&p.BurstWindow, BurstWindowDefault)
		p.tierDefaults()
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
	orDefault(&s.SyncTimeout, c.SyncTimeoutDefault())
	q.Reserved = withDefaults(q.Reserved, ReservedDefault())
	q.Weights = withDefaults(q.Weights, WeightsDefault())
	orDefault(&w.Concurrency, WorkerConcurrencyFor(*q))

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
	orDefault(&ca.Memo.Entries, cache.MemoEntriesDefault)
	orDefault(&ca.Memo.TTL, cache.MemoTTLDefault)
	ca.TTL = withDefaults(ca.TTL, cache.TTLDefault())
	orDefault(&ca.Embedder.Kind, embed.KindDefault)

	b := &c.Breaker
	orDefault(&b.FailureThreshold, BreakerFailureThresholdDefault)
	orDefault(&b.OpenDuration, BreakerOpenDurationDefault)
	orDefault(&b.HalfOpenMaxCalls, BreakerHalfOpenMaxCallsDefault)
	orDefault(&b.SuccessThreshold, BreakerSuccessThresholdDefault)
	orDefault(&b.ProbeTimeout, c.LongestCall()+ProbeMarginDefault)

	for i := range c.Tenants {
		t := &c.Tenants[i]
		orDefault(&t.DefaultPriority, priority.Normal)
		orDefault(&t.MaxPriority, priority.High)
		orDefault(&t.DefaultLayer, ca.DefaultLayer)
		orDefault(&t.RateLimitRPM, TenantRPMDefault)
		orDefault(&t.MaxStreams, TenantMaxStreamsDefault)
		orDefault(&t.MaxSyncWaits, TenantMaxSyncWaitsDefault)
		orDefault(&t.MaxStoredBytes, TenantMaxStoredBytesDefault)
		orDefault(&t.MaxReadsPerSecond, TenantMaxReadsPerSecondDefault)
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

// WorkerConcurrencyFor is worker.concurrency's default: enough tasks for
// one worker to hold the whole queue (queue_max_depth) and still dequeue
// CRITICAL at once (its reserve), at least WorkerConcurrencyMin. A task
// that asynq has handed to a worker waits for its slot and its key in
// lines ordered by acceptance time, across every process; a task still in
// asynq's list, or turned back to it by a full worker (config.MaxActive),
// has no place in those lines and is overtaken by younger ones. Waiting
// tasks cost a goroutine and a poll every 5-400 ms each, nothing else.
func WorkerConcurrencyFor(q Queue) int {
	return max(WorkerConcurrencyMin, q.MaxDepth+q.Reserved[priority.Critical])
}
