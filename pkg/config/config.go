// Package config loads Bulwark's one configuration file, config.yaml, into
// typed structs shared by the api, worker and scheduler processes.
//
// Environment variables expand in every value: ${VAR} (an error naming the
// field when VAR is unset) or ${VAR:-default}. Unknown keys are rejected.
// Zero values mean the documented defaults; Load applies them and then
// validates, and every validation error names the field. No error message
// ever contains a secret's value.
//
// Each component's Config is built here from the file (components.go) and
// checked by the component's own Validate at load time, as are the limits
// that span components (validateAcross). The Redis keyspace of every
// component is laid out in keys.go. Defaults are the components' own
// constants wherever a component has one.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"gopkg.in/yaml.v3"

	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/redisconn"
	"bulwark/pkg/secret"
)

// EnvFile names the environment variable that points every process at
// another configuration file.
const EnvFile = "BULWARK_CONFIG"

// DefaultFile is the configuration file used when BULWARK_CONFIG is unset.
const DefaultFile = "config.yaml"

// Config is the whole configuration.
type Config struct {
	Server    Server                       `yaml:"server"`
	Redis     Redis                        `yaml:"redis"`
	Postgres  Postgres                     `yaml:"postgres"`
	Worker    Worker                       `yaml:"worker"`
	Log       Log                          `yaml:"log"`
	Profiling Profiling                    `yaml:"profiling"`
	Providers map[llm.Provider]ProviderCfg `yaml:"providers"`
	Keys      []Key                        `yaml:"keys"`
	// Fallback maps a route ("claude/sonnet") to the routes tried after it,
	// in order: one ("openai/gpt4o") or a chain
	// ([bedrock/sonnet, openai/gpt4o]). Each has its own keys and breaker;
	// requests are translated for each as for any route.
	Fallback map[string]Routes `yaml:"fallback"`
	// Routing sends some requests to another route first, with their own
	// route (and its fallbacks) after it: e.g. the router layer's calls to
	// a local model, the cloud tier behind it. The first rule that matches
	// applies.
	Routing []RoutingRule `yaml:"routing"`
	// Models maps model names a client may send on the compat endpoints
	// ("gpt-4o", "claude-sonnet-4-5") to routes. "provider/tier" names are
	// always accepted, and each tier's concrete model name maps to its route.
	Models  map[string]string `yaml:"models"`
	Queue   Queue             `yaml:"queue"`
	Cache   Cache             `yaml:"cache"`
	Breaker Breaker           `yaml:"breaker"`
	// Compression shortens prompts before they are sent (pkg/compress).
	Compression Compression `yaml:"compression"`
	// KeyCooldown shapes the cooldown of a key after a 429:
	// min(base·2^n, max), n its consecutive 429s, never shorter than the
	// provider's Retry-After. Defaults 1s and 120s (the design document).
	KeyCooldown KeyCooldown `yaml:"key_cooldown"`
	Tenants     []Tenant    `yaml:"tenants"`
	Alerts      Alerts      `yaml:"alerts"`
	Report      Report      `yaml:"report"`
	// Prices in USD per million tokens, by route ("claude/sonnet").
	Prices map[string]Price `yaml:"prices"`
}

// Server configures the API process.
type Server struct {
	// Listen is the API address. Default 127.0.0.1:8080.
	Listen string `yaml:"listen"`
	// AdminListen, when set, serves /admin/... (and asynqmon) and /metrics
	// on this address only, off the tenants' listener: e.g. an internal
	// interface. They still want the admin token there.
	AdminListen string `yaml:"admin_listen"`
	// AdminToken guards every operator surface: /admin/..., /metrics and
	// the details of /readyz on the API, and the worker's /debug/pprof/.
	// Prometheus sends it as a bearer token. Required.
	AdminToken secret.String `yaml:"admin_token"`
	// MaxBodyBytes caps a request body. Default 1 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxPromptChars caps system prompt plus message text. Default 200,000.
	MaxPromptChars int `yaml:"max_prompt_chars"`
	// MaxTokensLimit, when set, caps max_tokens on every tier below the
	// tier's own max_output_tokens (providers.*.tiers): an operator's
	// ceiling. Default 0: none, each tier's own limit applies.
	MaxTokensLimit int `yaml:"max_tokens_limit"`
	// DefaultMaxTokens is the max_tokens of an async request (POST
	// /v1/requests) that gives none, lowered to its tier's limit. An
	// OpenAI-compatible call without one gets its tier's limit (as OpenAI
	// does: the model's maximum); an Anthropic-compatible call must give
	// one (as Anthropic requires). Default 1,024.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// SyncTimeout is how long the compat endpoints wait for an answer
	// before replying 429 still_queued with the request id. Default
	// queue_max_wait plus the longest provider timeout (7 min with the
	// defaults; SyncTimeoutDefault): set it shorter only for clients that
	// cannot wait that long — a resend while the request runs joins it.
	SyncTimeout time.Duration `yaml:"sync_timeout"`
	// ResultTTL is how long a finished request's live record (and its
	// idempotency key) is kept in Redis; GET reads the history row in
	// PostgreSQL after it. A compat call without an Idempotency-Key has
	// its answer in its response: its record goes with its event stream,
	// job.EndedEventsTTL (5 min) after the end. Redis holds about 1.5 KB
	// per ended request for this long, so it sizes Redis's memory
	// (docs/performance.md, scale model). Default 1h.
	ResultTTL time.Duration `yaml:"result_ttl"`
	// ShutdownTimeout bounds the graceful HTTP shutdown. Default 10s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// ReadHeaderTimeout bounds reading a request's headers (a slowloris
	// client is cut after it). Default 5s.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds reading a whole request, body included.
	// Default 30s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// IdleTimeout closes an idle keep-alive connection. Default 120s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes caps a request's headers. Default 64 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// WriteTimeout bounds each write of an answer or an SSE event: a
	// client that stops reading is cut after it (streams and synchronous
	// waits are long, so there is no whole-response deadline). Default 30s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// StreamMaxLifetime ends an SSE stream after this long; the client
	// reconnects with Last-Event-ID and misses nothing. Default 15m.
	StreamMaxLifetime time.Duration `yaml:"stream_max_lifetime"`
	// StreamKeepAlive is how often an SSE stream with nothing to say sends
	// a comment line (which clients skip), so that proxies with an idle
	// timeout do not cut it: event streams, and a streaming compat call
	// while it waits for its answer. Default 15s.
	StreamKeepAlive time.Duration `yaml:"stream_keepalive"`
	// AdminQueuesWritable lets the asynqmon dashboard at /admin/queues
	// delete, archive and run tasks and pause queues. Default false: view
	// only.
	AdminQueuesWritable bool `yaml:"admin_queues_writable"`
}

// Redis locates Redis: one server, a Sentinel-watched master, or a
// cluster (pkg/redisconn builds the clients; keys.go says which key lives
// in which hash slot).
type Redis struct {
	// Mode is standalone (one server at Addr), sentinel (the master the
	// sentinels name, followed across failovers) or cluster. Default
	// standalone.
	Mode redisconn.Mode `yaml:"mode"`
	// Addr is host:port of the one server; standalone only. Default
	// 127.0.0.1:16379 in standalone mode.
	Addr string `yaml:"addr"`
	// DB is the logical database; must be 0 in cluster mode.
	DB int `yaml:"db"`
	// Password of the Redis servers (not of the sentinels).
	Password secret.String `yaml:"password"`
	// Prefix namespaces Bulwark's own keys (not asynq's). Default "bulwark:".
	Prefix string `yaml:"prefix"`
	// Sentinel is used with mode sentinel.
	Sentinel RedisSentinel `yaml:"sentinel"`
	// Cluster is used with mode cluster.
	Cluster RedisCluster `yaml:"cluster"`
	// MinReplicasAcked, when above 0, makes the API answer 202 only once
	// that many replicas hold the stored request (Redis WAIT), 503
	// otherwise: a failover, even of a killed master, then loses no
	// accepted request. Set it only when the master has replicas. Default
	// 0 (acknowledged by the master alone).
	MinReplicasAcked int `yaml:"min_replicas_acked"`
	// ReplicaAckTimeout bounds that wait. Default 1s.
	ReplicaAckTimeout time.Duration `yaml:"replica_ack_timeout"`
	// PoolSize is each process's connections per Redis server. Default 64
	// (redisconn.PoolSizeDefault); raise it with worker.concurrency, when
	// bulwark_redis_pool_timeouts_total grows.
	PoolSize int `yaml:"pool_size"`
}

// RedisSentinel names the master and the sentinels that watch it.
type RedisSentinel struct {
	// MasterName is the name in the sentinels' "sentinel monitor" line.
	MasterName string `yaml:"master_name"`
	// Addrs are host:port of the sentinels (three or more for a quorum).
	Addrs []string `yaml:"addrs"`
	// Password is the sentinels' own requirepass, if any.
	Password secret.String `yaml:"password"`
}

// RedisCluster lists cluster nodes to start from.
type RedisCluster struct {
	// Addrs are host:port of some of the cluster's nodes; the client
	// learns the rest from them.
	Addrs []string `yaml:"addrs"`
}

// Postgres locates PostgreSQL.
type Postgres struct {
	// DSN is a libpq URL. It may carry a password: it is never logged.
	DSN secret.String `yaml:"dsn"`
	// MaxConns of the pool. Default 10.
	MaxConns int32 `yaml:"max_conns"`
	// HistoryRetention is how long request history rows are kept (the
	// hourly retention job deletes older ones). Default 30 days.
	HistoryRetention time.Duration `yaml:"history_retention"`
	// HistoryFlushTimeout bounds, as a whole, the history rows a process
	// writes as it shuts down; what PostgreSQL has not taken by then goes
	// to the Redis outbox for a replay. A supervisor's kill grace must
	// outlast the process's shutdown timeout plus this. Default 3s.
	HistoryFlushTimeout time.Duration `yaml:"history_flush_timeout"`
}

// Worker configures the worker process.
type Worker struct {
	// Concurrency is the number of tasks one worker process handles at once
	// (asynq goroutines), waiting for a slot or a key or calling. Default
	// queue_max_depth + CRITICAL's reserve, at least 32
	// (WorkerConcurrencyFor): a task asynq has not handed to a worker has
	// no place in the lines that keep arrival order.
	Concurrency int `yaml:"concurrency"`
	// MetricsListen serves /metrics of the worker, without a token, and its
	// profiles at /debug/pprof/, with the admin token: bind it to loopback
	// or a private address only Prometheus reaches. Default
	// 127.0.0.1:9091; "off" disables it.
	MetricsListen string `yaml:"metrics_listen"`
	// TaskCheckInterval is asynq's poll interval for new tasks. Default 20ms
	// (asynq's 1s default adds up to a second of latency; see DESIGN.md).
	TaskCheckInterval time.Duration `yaml:"task_check_interval"`
	// DelayedTaskCheckInterval moves delayed/retried tasks to pending.
	// Default 100ms, so a 1–2 s Retry-After is waited out accurately.
	DelayedTaskCheckInterval time.Duration `yaml:"delayed_task_check_interval"`
	// ShutdownTimeout lets running calls finish on SIGTERM. Default 25s,
	// below a typical 30s kill grace period.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MaxAttempts bounds provider attempts of one request (429 waits do not
	// count). Default 8.
	MaxAttempts int `yaml:"max_attempts"`
	// PaceWait is the longest a request holds its global slot waiting for
	// its turn in a route's key line. Default 2s.
	PaceWait time.Duration `yaml:"pace_wait"`
	// HoldWait is the longest a request waits for capacity inside the
	// worker before going back to the queue with a delay. Default 10s.
	HoldWait time.Duration `yaml:"hold_wait"`
}

// Log configures logging.
type Log struct {
	// Format is "json" (default) or "text".
	Format string `yaml:"format"`
	// Level is debug, info (default), warn or error.
	Level string `yaml:"level"`
}

// KeyCooldown is the key pool's 429 cooldown rule (pkg/keypool).
type KeyCooldown struct {
	Base time.Duration `yaml:"base"`
	Max  time.Duration `yaml:"max"`
}

// Profiling turns on Go's block and mutex profiles in every process
// (runtime.SetBlockProfileRate, SetMutexProfileFraction), served with the
// CPU and heap profiles at /debug/pprof/ on the worker's metrics listener
// and at /admin/debug/pprof/ on the API, both behind the admin token
// (server.admin_token), always served. 0, the default, leaves them off:
// they cost a little on every wait. 10000 (ns) and 100 are typical while
// profiling.
type Profiling struct {
	BlockRate     int `yaml:"block_rate"`
	MutexFraction int `yaml:"mutex_fraction"`
}

// ProviderCfg configures one provider's endpoint and tiers.
type ProviderCfg struct {
	// Kind is the provider's API: anthropic, openai, bedrock (Claude on AWS
	// Bedrock), azure (Azure OpenAI) or local (an OpenAI-compatible server:
	// vLLM, Ollama, llama.cpp). Default: the provider's name when it is one
	// of those, and anthropic for "claude".
	Kind string `yaml:"kind"`
	// BaseURL of the API (proxies and gateways welcome). Required, except
	// for bedrock (default https://bedrock-runtime.<key's region>.amazonaws.com).
	// For azure, the resource endpoint (https://<resource>.openai.azure.com).
	BaseURL string `yaml:"base_url"`
	// APIVersion is Azure OpenAI's api-version. Default the adapter's.
	APIVersion string `yaml:"api_version"`
	// Auth is how Azure keys authenticate: api-key (default: keys[].api_key
	// in the api-key header) or entra (a Microsoft Entra ID bearer token
	// from the environment's Azure credential chain; keys need no api_key).
	Auth string `yaml:"auth"`
	// Timeout of one call. Default 120s.
	Timeout time.Duration `yaml:"timeout"`
	// Tiers maps a tier name ("sonnet") to the provider's model name: the
	// Bedrock model (or inference profile) id, the Azure deployment name;
	// or to a mapping of the model and its max_output_tokens (Tier).
	Tiers map[string]Tier `yaml:"tiers"`
	// BurstWindow is the share of a key's per-minute limits the provider
	// lets through at once: providers meter in short windows ("60 RPM may
	// be enforced as 1 request per second"), so the pool paces each key to
	// a bucket of RPM·window/1m requests. Default 1s, at most 1m.
	BurstWindow time.Duration `yaml:"burst_window"`
}

// Key is one provider key of the pool (design document 5.3).
type Key struct {
	ID        string       `yaml:"id"`
	Provider  llm.Provider `yaml:"provider"`
	ModelTier string       `yaml:"model_tier"`
	// APIKey is the provider's key. Required for anthropic, openai and
	// azure with api-key auth; optional for local; none for bedrock.
	APIKey secret.String `yaml:"api_key"`
	// RPMLimit and TPMLimit are the key's per-minute limits (> 0). A local
	// key may leave them 0 (unmetered): MaxInFlight bounds it instead.
	RPMLimit int `yaml:"rpm_limit"`
	TPMLimit int `yaml:"tpm_limit"`
	// ITPMLimit and OTPMLimit are an anthropic key's separate input and
	// output tokens-per-minute limits (>= 0; 0, the default: none, the key
	// is paced by tpm_limit alone). When set, the pool meters the prompt
	// against itpm_limit and max_tokens against otpm_limit, as Anthropic
	// does, besides tpm_limit (set that to their sum, which is what
	// Anthropic's anthropic-ratelimit-tokens-limit reports).
	ITPMLimit int `yaml:"itpm_limit"`
	OTPMLimit int `yaml:"otpm_limit"`
	// OutputBurndown is a bedrock key's token burndown rate for output
	// tokens (>= 0; 0, the default, means 1): Bedrock counts each output
	// token of Claude 4-series models 5 times against tpm_limit, so set 5
	// for those models' keys.
	OutputBurndown int `yaml:"output_burndown"`
	// MaxInFlight limits concurrent calls on this key; 0 = no limit.
	// Required for local keys: a local server's limit is concurrency.
	MaxInFlight int `yaml:"max_in_flight"`
	// Region is a bedrock key's AWS region (its own quota). Required for
	// bedrock.
	Region string `yaml:"region"`
	// Profile is a bedrock key's shared-config profile (another account);
	// empty: the default credential chain (environment, shared config,
	// instance or task role).
	Profile string `yaml:"profile"`
	// Endpoint is an azure key's own resource endpoint, when it is not the
	// provider's base_url.
	Endpoint string `yaml:"endpoint"`
	// Deployment is an azure key's own deployment of the tier (e.g. a PTU
	// deployment), when it is not the tier's.
	Deployment string `yaml:"deployment"`
	// PTU marks an azure key whose deployment is provisioned throughput:
	// the pool prefers it while it has room, and its 429 means the
	// provisioned capacity is full (a short wait, not a key fault).
	PTU bool `yaml:"ptu"`
	// BurstWindow overrides the provider's burst_window for this key.
	BurstWindow time.Duration `yaml:"burst_window"`
}

// Queue configures layer 2 (design document 4.2).
type Queue struct {
	// MaxConcurrentLLMCalls is the global limit of provider calls in flight
	// across all workers. Default 20.
	MaxConcurrentLLMCalls int `yaml:"max_concurrent_llm_calls"`
	// Reserved slots per priority. Default critical 5, high 10, normal 4, low 1.
	Reserved map[priority.Priority]int `yaml:"reserved"`
	// Weights of the asynq queues. Default critical 6, high 3, normal 2, low 1.
	Weights map[priority.Priority]int `yaml:"weights"`
	// StrictPriority always takes the most urgent waiting request first,
	// ignoring Weights (which otherwise let lower priorities through now
	// and then, so that they never starve).
	StrictPriority bool `yaml:"strict_priority"`
	// MaxWait is how long a request may wait before it fails. Default 300s.
	MaxWait time.Duration `yaml:"queue_max_wait"`
	// MaxDepth is the admission limit of queued requests. Default 200.
	MaxDepth int `yaml:"queue_max_depth"`
	// SlotLease is how long a global slot survives a dead worker. A worker
	// renews the slots it holds every third of it, so a call may last
	// longer. Default 30s.
	SlotLease time.Duration `yaml:"slot_lease"`
}

// Cache configures layer 1.
type Cache struct {
	// Enabled turns the semantic cache on. Default true.
	Enabled *bool `yaml:"enabled"`
	// Threshold is the cosine similarity of a semantic hit. Default 0.95.
	Threshold float64 `yaml:"threshold"`
	// TTL per cache layer. Default router 24h, agent 4h, synthesizer 2h.
	TTL map[string]time.Duration `yaml:"ttl"`
	// DefaultLayer when a request names none. Default "agent".
	DefaultLayer string `yaml:"default_layer"`
	// TenantIsolation keeps tenants' entries apart. Default true.
	TenantIsolation *bool `yaml:"tenant_isolation"`
	// ProtectedPatterns are regular expressions whose matches must be equal
	// in both prompts for a semantic hit. Default: DTCs, ECU ids, versions.
	ProtectedPatterns []string `yaml:"protected_patterns"`
	// IgnoredPatterns are regular expressions of what tells one car or
	// moment from another: masked before the match, and substituted in a
	// semantic hit's answer. Default: times, VINs, phone numbers, Chinese
	// plates (cache.IgnoredPatternsDefault); [] ignores nothing.
	IgnoredPatterns []string `yaml:"ignored_patterns"`
	// Embedder: "local" (default, no network) or "openai" (any compatible
	// /v1/embeddings endpoint).
	Embedder Embedder `yaml:"embedder"`
	// Index holds the HNSW index's build parameters (pgvector's m and
	// ef_construction). Default 16 and 64: lower ones make each stored
	// answer cheaper to index and lose semantic hits (docs/performance.md).
	Index CacheIndex `yaml:"index"`
	// Memo keeps each API process's recent exact hits in memory in front
	// of PostgreSQL. Default on, 10,000 answers, 10s.
	Memo CacheMemo `yaml:"memo"`
}

// CacheMemo configures the exact-hit memo of API processes
// (cache.Config.MemoEntries, MemoTTL; docs/how-it-works.md, layer 1).
type CacheMemo struct {
	// Enabled: default true.
	Enabled *bool `yaml:"enabled"`
	// Entries is how many answers it holds. Default 10000.
	Entries int `yaml:"entries"`
	// TTL is how long an answer stays: the longest an answer invalidated
	// by another process is still served should its notice be lost.
	// Default 10s.
	TTL time.Duration `yaml:"ttl"`
}

// MemoEnabled reports whether API processes keep the memo.
func (c CacheMemo) MemoEnabled() bool { return c.Enabled == nil || *c.Enabled }

// CacheIndex holds the HNSW index's build parameters (cache.Config.IndexM,
// IndexEfConstruction).
type CacheIndex struct {
	M              int `yaml:"m"`
	EfConstruction int `yaml:"ef_construction"`
}

// Embedder configures the embedding model.
type Embedder struct {
	Kind    string        `yaml:"kind"`
	BaseURL string        `yaml:"base_url"`
	Model   string        `yaml:"model"`
	Dims    int           `yaml:"dims"`
	APIKey  secret.String `yaml:"api_key"`
}

// Breaker configures layer 5 (design document 7.2).
type Breaker struct {
	// FailureThreshold consecutive 429s open a breaker. Default 3.
	FailureThreshold int `yaml:"failure_threshold"`
	// OpenDuration a breaker stays open. Default 60s.
	OpenDuration time.Duration `yaml:"open_duration"`
	// HalfOpenMaxCalls probes at a time in half-open. Default 1.
	HalfOpenMaxCalls int `yaml:"half_open_max_calls"`
	// SuccessThreshold probe successes close it. Default 2.
	SuccessThreshold int `yaml:"success_threshold"`
	// ProbeTimeout bounds a half-open probe call: one not reported within
	// it counts as failed. Default the longest providers.*.timeout plus
	// 30s; it must exceed every provider's timeout.
	ProbeTimeout time.Duration `yaml:"probe_timeout"`
}

// Tenant is a client of Bulwark.
type Tenant struct {
	Name string `yaml:"name"`
	// Token is the client token in clear (usually from the environment);
	// TokenSHA256 its hex SHA-256. Exactly one is required. Only the hash is
	// kept in memory after loading.
	Token       secret.String `yaml:"token,omitempty"` // zero once loaded: omitted when written back
	TokenSHA256 string        `yaml:"token_sha256"`
	// DefaultPriority when a request names none. Default normal.
	DefaultPriority priority.Priority `yaml:"default_priority"`
	// MaxPriority is the most urgent priority it may ask for; more urgent
	// requests are lowered to it. Default high.
	MaxPriority priority.Priority `yaml:"max_priority"`
	// RateLimitRPM bounds its submissions per minute (a burst of one
	// minute's worth allowed). Default 1200; -1 = unlimited.
	RateLimitRPM int `yaml:"rate_limit_rpm"`
	// MaxQueued bounds its requests accepted and not ended yet (queued,
	// waiting or running): its share of the queue. Default queue.max_depth
	// with one tenant, half of it with several; -1 = no share of its own.
	MaxQueued int `yaml:"max_queued"`
	// MaxStreams bounds its open event streams per API process. Default
	// 200; -1 = unlimited.
	MaxStreams int `yaml:"max_streams"`
	// MaxSyncWaits bounds its compat requests waiting for their answer per
	// API process. Default 100; -1 = unlimited.
	MaxSyncWaits int `yaml:"max_sync_waits"`
	// MaxReadsPerSecond bounds its reads per API process: GET of a
	// request or a model, event streams opened, token counts (a burst of
	// two seconds' worth). Default 500 (a fleet polling its results
	// every few seconds fits; a loop without a pause does not); -1 =
	// unlimited.
	MaxReadsPerSecond int `yaml:"max_reads_per_second"`
	// MaxStoredBytes is its Redis budget: what its requests may hold in
	// Redis at once — records queued, running and ended (kept
	// server.result_ttl), their event streams and its outcomes waiting in
	// the history outbox — as counted by pkg/job (within about a third
	// above Redis's own MEMORY USAGE). A submission that would pass it is
	// answered 429 tenant_storage_full. Default 256 MiB (268435456): an
	// hour of 1,200 typical requests a minute fits in about half of it;
	// -1 = unlimited. At least 2 × server.max_body_bytes.
	MaxStoredBytes int64 `yaml:"max_stored_bytes"`

	bothTokens bool // token and token_sha256 were both set: one would be ignored
	// DefaultLayer of the cache for its requests. Default: cache.default_layer.
	DefaultLayer string `yaml:"default_cache_layer"`
}

// Alerts configures instant alerts.
type Alerts struct {
	WeCom    []Webhook `yaml:"wecom"`
	DingTalk []Webhook `yaml:"dingtalk"`
	Generic  []Webhook `yaml:"generic"`
	// Throttle sends the same alert at most once per period. Default 5m.
	Throttle time.Duration `yaml:"throttle"`
	// Language of alert texts: "zh" (default) or "en".
	Language string `yaml:"language"`
	// Interval of the scheduler's alert evaluation. Default 30s.
	Interval time.Duration `yaml:"interval"`
}

// Webhook is one robot or endpoint. The URL carries a token: it is a secret.
type Webhook struct {
	URL    secret.String `yaml:"url"`
	Secret secret.String `yaml:"secret"`
}

// Report configures the daily report.
type Report struct {
	// At is the local time of day, "HH:MM". Default "08:00".
	At string `yaml:"at"`
	// Timezone, e.g. "Asia/Shanghai". Default UTC.
	Timezone string `yaml:"timezone"`
	Mail     *Mail  `yaml:"mail"`
}

// Mail is an SMTP relay for the daily report.
type Mail struct {
	Addr     string        `yaml:"addr"`
	From     string        `yaml:"from"`
	To       []string      `yaml:"to"`
	Username string        `yaml:"username"`
	Password secret.String `yaml:"password"`
	StartTLS bool          `yaml:"starttls"`
}

// Price is USD per million tokens.
type Price struct {
	Input  float64 `yaml:"input"`
	Output float64 `yaml:"output"`
}

// File returns the configuration file to load: $BULWARK_CONFIG or
// config.yaml.
func File() string {
	if f := os.Getenv(EnvFile); f != "" {
		return f
	}
	return DefaultFile
}

// Load reads, expands, decodes, defaults and validates a file.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(b, osLookup)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes a configuration document, looking variables up with lookup.
func Parse(doc []byte, lookup func(string) (string, bool)) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(doc, &root); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if err := expandNode(&root, "", lookup); err != nil {
		return nil, err
	}
	// Re-encode the expanded tree so the strict decoder can reject unknown
	// keys (yaml.Node.Decode has no KnownFields).
	expanded, err := yaml.Marshal(&root)
	if err != nil {
		return nil, fmt.Errorf("re-encode: %w", err)
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(expanded))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) /* an empty document means all defaults */ {
		return nil, fmt.Errorf("decode: %w", err)
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Compression configures prompt compression: repeated log lines and
// whitespace in user content and tool results collapse before the call;
// protected entities (DTCs, ECU ids, versions) never change. A request
// opts out with "compress": false (X-Bulwark-Compress: off).
type Compression struct {
	// Enabled turns it on. Default false: it changes the prompt the model
	// sees.
	Enabled bool `yaml:"enabled"`
	// MinRepeat equal consecutive lines collapse into one and a marker.
	// Default 3.
	MinRepeat int `yaml:"min_repeat"`
	// KeepTimestamps keeps lines that differ only in a leading timestamp.
	KeepTimestamps bool `yaml:"keep_timestamps"`
}

// RoutingRule sends the requests it matches to Route first.
type RoutingRule struct {
	// Layer matches requests of this cache layer ("router").
	Layer string `yaml:"layer"`
	// From matches requests asking this route ("claude/haiku").
	From string `yaml:"from"`
	// Route is tried first ("local/qwen"); the request's own route and
	// its fallbacks follow.
	Route string `yaml:"route"`
}

// Routes is one route or a list of them in the file.
type Routes []string

// UnmarshalYAML accepts "claude/sonnet" or [claude/sonnet, openai/gpt4o].
func (r *Routes) UnmarshalYAML(value *yaml.Node) error {
	if value.Kind == yaml.ScalarNode {
		*r = Routes{value.Value}
		return nil
	}
	var list []string
	if err := value.Decode(&list); err != nil {
		return err
	}
	*r = list
	return nil
}
