package config

import (
	"slices"
	"strings"
	"time"

	"bulwark/pkg/alert"
	"bulwark/pkg/breaker"
	"bulwark/pkg/cache"
	"bulwark/pkg/compress"
	"bulwark/pkg/dispatch"
	"bulwark/pkg/embed"
	"bulwark/pkg/httpapi"
	"bulwark/pkg/intake"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/redisconn"
	"bulwark/pkg/slots"
)

// The components' configurations are built from the file here and only
// here: the service wires what these return, and Load validates each with
// the component's own Validate (after its own WithDefaults), so a file
// that loads is one every component accepts. Runtime collaborators
// (callbacks, clients) are the service's to add.

// RedisConnConfig locates Redis (pkg/redisconn): the clients of every
// process, asynqmon's and the scheduler's included, come from it.
func (c *Config) RedisConnConfig() redisconn.Config {
	r := c.Redis
	return redisconn.Config{Mode: r.Mode, Addr: r.Addr, DB: r.DB, Password: r.Password,
		MasterName: r.Sentinel.MasterName, SentinelAddrs: r.Sentinel.Addrs, SentinelPassword: r.Sentinel.Password,
		ClusterAddrs: r.Cluster.Addrs, MinReplicasAcked: r.MinReplicasAcked, ReplicaAckTimeout: r.ReplicaAckTimeout,
		PoolSize: r.PoolSize}
}

// SlotsConfig configures the global concurrency limit (pkg/slots).
func (c *Config) SlotsConfig() slots.Config {
	return slots.Config{Total: c.Queue.MaxConcurrentLLMCalls, Reserved: c.Queue.Reserved,
		LeaseTTL: c.Queue.SlotLease, Prefix: c.Redis.Keyspace().Slots()}
}

// QueueConfig configures the queue view (pkg/queue); the service adds
// Waiters.
func (c *Config) QueueConfig() queue.Config {
	return queue.Config{MaxDepth: c.Queue.MaxDepth, MaxRetry: c.Worker.MaxAttempts,
		Prefix: c.Redis.Keyspace().Root(), Capacity: c.KeyCapacity(), MaxWait: c.Queue.MaxWait}
}

// KeypoolConfig configures the key pool (pkg/keypool).
func (c *Config) KeypoolConfig() keypool.Config {
	keys := make([]keypool.Key, 0, len(c.Keys))
	for _, k := range c.Keys {
		rpm, tpm := keyLimits(k)
		keys = append(keys, keypool.Key{ID: k.ID, Provider: k.Provider, Tier: k.ModelTier,
			Cred: llm.Credential{KeyID: k.ID, APIKey: k.APIKey, Region: k.Region, Profile: k.Profile,
				Endpoint: k.Endpoint, Deployment: k.Deployment},
			RPM: rpm, TPM: tpm, ITPM: k.ITPMLimit, OTPM: k.OTPMLimit, OutputBurndown: k.OutputBurndown, MaxInFlight: k.MaxInFlight, Window: k.BurstWindow, Preferred: k.PTU,
			Metering: meteringOf(c.Providers[k.Provider].Kind)})
	}
	return keypool.Config{Keys: keys, Prefix: c.Redis.Keyspace().Keypool(), LeaseTTL: KeyLeaseDefault,
		CooldownBase: c.KeyCooldown.Base, CooldownMax: c.KeyCooldown.Max}
}

// BreakerConfig configures the breakers (pkg/breaker); the service adds
// OnTransition.
func (c *Config) BreakerConfig() breaker.Config {
	b := c.Breaker
	return breaker.Config{FailureThreshold: b.FailureThreshold, OpenTimeout: b.OpenDuration,
		HalfOpenProbes: b.HalfOpenMaxCalls, SuccessThreshold: b.SuccessThreshold,
		ProbeTimeout: b.ProbeTimeout, Prefix: c.Redis.Keyspace().Breaker()}
}

// AlertConfig configures the instant alerts (pkg/alert).
func (c *Config) AlertConfig() alert.Config {
	conv := func(ws []Webhook) []alert.Webhook {
		var out []alert.Webhook
		for _, w := range ws {
			out = append(out, alert.Webhook{URL: w.URL, Secret: w.Secret})
		}
		return out
	}
	a := c.Alerts
	return alert.Config{WeCom: conv(a.WeCom), DingTalk: conv(a.DingTalk), Generic: conv(a.Generic),
		Throttle: a.Throttle, Prefix: c.Redis.Keyspace().Root(), Language: a.Language}
}

// CompressConfig configures prompt compression (pkg/compress); it protects
// the cache's protected patterns.
func (c *Config) CompressConfig() compress.Config {
	return compress.Config{MinRepeat: c.Compression.MinRepeat, KeepTimestamps: c.Compression.KeepTimestamps,
		ProtectedPatterns: c.Cache.ProtectedPatterns}
}

// CacheConfig configures the semantic cache (pkg/cache).
func (c *Config) CacheConfig() cache.Config {
	ca := c.Cache
	return cache.Config{Threshold: ca.Threshold, TTL: ca.TTL, DefaultLayer: ca.DefaultLayer,
		TenantIsolation: ca.TenantIsolation, ProtectedPatterns: ca.ProtectedPatterns, IgnoredPatterns: ca.IgnoredPatterns,
		IndexM: ca.Index.M, IndexEfConstruction: ca.Index.EfConstruction,
		MemoEntries: ca.Memo.Entries, MemoTTL: ca.Memo.TTL}
}

// EmbedConfig configures the cache's embedder (pkg/embed).
func (c *Config) EmbedConfig() embed.Config {
	e := c.Cache.Embedder
	if e.Kind == embed.KindOpenAI {
		return embed.Config{Kind: e.Kind,
			OpenAI: embed.OpenAIConfig{BaseURL: e.BaseURL, Model: e.Model, Dims: e.Dims, APIKey: e.APIKey}}
	}
	return embed.Config{Kind: e.Kind, Dims: e.Dims}
}

// HTTPConfig configures the API's handlers (pkg/httpapi) but for the
// tenants, which the service adds.
func (c *Config) HTTPConfig() httpapi.Config {
	s := c.Server
	return httpapi.Config{AdminApart: s.AdminListen != "", AdminToken: s.AdminToken, MaxBodyBytes: s.MaxBodyBytes,
		MaxWait: c.Queue.MaxWait, SyncTimeout: s.SyncTimeout, WriteTimeout: s.WriteTimeout, StreamMaxLifetime: s.StreamMaxLifetime,
		KeepAlive: s.StreamKeepAlive}
}

// KeyCapacity is the requests per second all metered keys together carry
// at the pool's pace: the drain rate a backlog cannot beat. (An unmetered
// local key's rate is its concurrency over its latency, unknown here.)
func (c *Config) KeyCapacity() float64 {
	rpm := 0
	for _, k := range c.Keys {
		rpm += k.RPMLimit
	}
	return float64(rpm) / 60 * keypool.PaceDefault
}

// LongestCall is the longest provider timeout.
func (c *Config) LongestCall() time.Duration {
	var m time.Duration
	for _, p := range c.Providers {
		m = max(m, p.Timeout)
	}
	return m
}

// DispatchConfig is the worker's dispatcher configuration, without the
// provider clients and the compressor the service builds.
func (c *Config) DispatchConfig() dispatch.Config {
	return dispatch.Config{RouteOrder: c.RouteOrder, ModelName: c.ModelName, OutputLimit: c.OutputLimit, Price: c.Price,
		MaxActive: c.MaxActive(), PaceWait: c.Worker.PaceWait, HoldWait: c.Worker.HoldWait,
		SlotRenew: c.Queue.SlotLease / 3}
}

// validateComponents runs each component's own validation on the
// configuration built for it, under the section of the file it comes from.
func (c *Config) validateComponents(add func(field, format string, args ...any)) {
	for _, v := range []struct {
		section string
		err     error
	}{
		{"queue", c.SlotsConfig().WithDefaults().Validate()},
		{"queue", c.QueueConfig().WithDefaults().Validate()},
		{"keys, key_cooldown", c.KeypoolConfig().WithDefaults().Validate()},
		{"breaker", c.BreakerConfig().WithDefaults().Validate()},
		{"alerts", c.AlertConfig().WithDefaults().Validate()},
		{"cache", c.CacheConfig().WithDefaults().Validate()},
		{"cache.embedder", c.EmbedConfig().Validate()},
		{"compression", c.CompressConfig().WithDefaults().Validate()},
		{"server", c.HTTPConfig().WithDefaults().Validate()},
		{"worker", c.DispatchConfig().WithDefaults().Validate()},
		{"server", c.IntakeConfig().WithDefaults().Validate()},
	} {
		if v.err != nil {
			add(v.section, "%v", v.err)
		}
	}
}

// validateAcross checks the limits that span components, each error
// naming both fields: set apart, each value is valid.
func (c *Config) validateAcross(add func(field, format string, args ...any)) {
	for name, p := range c.Providers {
		field := "providers." + string(name) + ".timeout"
		// A key's in-flight lease must outlive the call it guards plus the
		// reservation wait before it, or a slow call's key would be counted
		// free while the provider still works on it.
		if need := p.Timeout + c.Worker.PaceWait; need >= KeyLeaseDefault {
			add(field, "plus worker.pace_wait (%s) must stay under the key lease (%s), got %s",
				c.Worker.PaceWait, KeyLeaseDefault, p.Timeout)
		}
		// A half-open probe not reported within breaker.probe_timeout
		// counts as failed: a probe call still running would be judged lost.
		if c.Breaker.ProbeTimeout <= p.Timeout {
			add("breaker.probe_timeout", "(%s) must exceed %s (%s): a probe still running would count as failed",
				c.Breaker.ProbeTimeout, field, p.Timeout)
		}
		// One attempt holds a slot, waits for a key (worker.hold_wait),
		// calls the route and may call its fallback: asynq cancels the
		// handler after the queue's task timeout.
		if need := c.Worker.HoldWait + 2*p.Timeout; need >= queue.TaskTimeoutDefault {
			add(field, "(%s) twice (route and fallback) plus worker.hold_wait (%s) must stay under the queue's task timeout (%s)",
				p.Timeout, c.Worker.HoldWait, queue.TaskTimeoutDefault)
		}
	}
	// Workers renew their slots every third of the lease; a request that
	// waits longer than a lease for a slot keeps its place in line by the
	// same renewal, so the lease only has to outlive a renewal period.
	if c.Queue.SlotLease < 3*time.Second {
		add("queue.slot_lease", "must be >= 3s (workers renew it every third), got %s", c.Queue.SlotLease)
	}
}

// IntakeConfig configures intake (pkg/intake); the service adds what
// depends on the running process (CacheEnabled, AfterStore).
func (c *Config) IntakeConfig() intake.Config {
	routes := map[llm.Route]bool{}
	limits := map[llm.Route]int{}
	for _, r := range c.Routes() {
		routes[r] = true
		limits[r] = c.OutputLimit(r)
	}
	layers := map[string]bool{}
	for l := range c.Cache.TTL {
		layers[l] = true
	}
	s := c.Server
	return intake.Config{Routes: routes, RouteOrder: c.RouteOrder, MaxWait: c.Queue.MaxWait,
		MaxPromptChars: s.MaxPromptChars, OutputLimits: limits, MaxTokensLimit: s.MaxTokensLimit, DefaultMaxTokens: s.DefaultMaxTokens,
		Layers: layers, DefaultLayer: c.Cache.DefaultLayer}
}

// TenantsByToken returns the tenants as the API authenticates them: by the
// hex SHA-256 of their token.
func (c *Config) TenantsByToken() map[string]intake.Tenant {
	out := map[string]intake.Tenant{}
	for _, t := range c.Tenants {
		out[strings.ToLower(t.TokenSHA256)] = intake.Tenant{Name: t.Name, DefaultPriority: t.DefaultPriority,
			MaxPriority: t.MaxPriority, RateLimitRPM: t.RateLimitRPM, MaxQueued: t.MaxQueued,
			MaxStreams: t.MaxStreams, MaxSyncWaits: t.MaxSyncWaits, MaxReadsPerSecond: t.MaxReadsPerSecond,
			DefaultLayer: t.DefaultLayer}
	}
	return out
}

// StoredBytes returns each tenant's Redis budget (max_stored_bytes; <= 0
// none), by name.
func (c *Config) StoredBytes() map[string]int64 {
	out := make(map[string]int64, len(c.Tenants))
	for _, t := range c.Tenants {
		out[t.Name] = t.MaxStoredBytes
	}
	return out
}

// Price is the configured price of a route's tokens (prices).
func (c *Config) Price(r llm.Route) metrics.Price {
	p := c.Prices[r.String()]
	return metrics.Price{InputPerMTok: p.Input, OutputPerMTok: p.Output}
}

// MaxActive caps the tasks of each non-critical priority that one worker
// process works on at once so that, whatever floods, as many goroutines as
// CRITICAL has reserved slots stay free to dequeue CRITICAL tasks at once.
// CRITICAL itself is not capped.
func (c *Config) MaxActive() map[priority.Priority]int {
	out := map[priority.Priority]int{}
	free := min(c.Queue.Reserved[priority.Critical], c.Worker.Concurrency/2)
	for _, p := range priority.All {
		if p != priority.Critical {
			out[p] = max(1, c.Worker.Concurrency-free)
		}
	}
	return out
}

// Models resolves the model names of the compat endpoints to routes: the
// configured aliases (models), every tier's concrete model name, and
// "provider/tier".
type Models struct {
	m map[string]llm.Route
	// list is every name of m, sorted, with its route's output limit.
	list []llm.Model
}

// ModelResolver builds the resolver.
func (c *Config) ModelResolver() Models {
	m := map[string]llm.Route{}
	for _, r := range c.Routes() {
		m[r.String()] = r
		m[c.ModelName(r)] = r
	}
	for name, to := range c.Models {
		if r, err := ParseRoute(to); err == nil {
			m[name] = r
		}
	}
	list := make([]llm.Model, 0, len(m))
	for name, r := range m {
		list = append(list, llm.Model{ID: name, Route: r, MaxOutputTokens: c.OutputLimit(r)})
	}
	slices.SortFunc(list, func(a, b llm.Model) int { return strings.Compare(a.ID, b.ID) })
	return Models{m: m, list: list}
}

// Resolve returns the route a model name stands for.
func (m Models) Resolve(model string) (llm.Route, bool) {
	r, ok := m.m[model]
	return r, ok
}

// List returns every name Resolve accepts, sorted by name; the caller
// must not change it.
func (m Models) List() []llm.Model { return m.list }
