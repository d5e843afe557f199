package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/secret"
)

var secretZero secret.String

// tenantName is the shape of a tenant name.
var tenantName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// validate checks every rule and joins the failures; each names its field.
// The file's own rules come first, section by section; the components'
// own validation (validateComponents) backs them up.
func (c *Config) validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{field}, args...)...))
	}
	c.validateBasics(add)
	if err := c.RedisConnConfig().WithDefaults().Validate(); err != nil {
		errs = append(errs, err) // its errors name their redis.* fields
	}
	routes := c.validateProviders(add)
	c.validateKeys(routes, add)
	c.validateRouting(routes, add)
	c.validateAcross(add)
	c.validateQueue(add)
	c.validateCache(add)
	c.validateTenants(add)
	c.validateOperations(add)
	if len(errs) == 0 {
		// The backstop: the file's own rules above name its fields more
		// precisely, and a component would repeat them.
		c.validateComponents(add)
	}
	return errors.Join(errs...)
}

// validateBasics checks the server's tokens and listeners, PostgreSQL,
// logging and the plain limits.
func (c *Config) validateBasics(add func(field, format string, args ...any)) {
	if c.Server.AdminToken.IsZero() {
		add("server.admin_token", "is required")
	}
	if c.Server.AdminListen != "" && c.Server.AdminListen == c.Server.Listen {
		add("server.admin_listen", "must differ from server.listen (leave it empty to serve admin there)")
	}
	if c.Postgres.DSN.IsZero() {
		add("postgres.dsn", "is required")
	}
	c.validateLimits(add)
	if c.Postgres.HistoryRetention < time.Hour {
		add("postgres.history_retention", "must be at least 1h, got %s", c.Postgres.HistoryRetention)
	}
	if c.Postgres.HistoryFlushTimeout < 0 {
		add("postgres.history_flush_timeout", "must be > 0, got %s", c.Postgres.HistoryFlushTimeout)
	}
	if f := c.Log.Format; f != "json" && f != "text" {
		add("log.format", "must be json or text, not %q", f)
	}
}

// validateProviders checks each provider and returns the configured
// routes ("provider/tier").
func (c *Config) validateProviders(add func(field, format string, args ...any)) map[string]bool {
	routes := map[string]bool{}
	if len(c.Providers) == 0 {
		add("providers", "at least one provider is required")
	}
	for name, p := range c.Providers {
		field := "providers." + string(name)
		if !name.Valid() {
			add(field, "%q is not a provider name (1-32 of a-z, 0-9, '-', starting with a letter)", name)
			continue
		}
		if !knownKind(p.Kind) {
			add(field+".kind", "must be anthropic, openai, bedrock, azure or local, not %q", p.Kind)
		}
		if p.BaseURL != "" || p.Kind != KindBedrock {
			if msg := checkBaseURL(p.BaseURL); msg != "" {
				// The message never quotes the URL: it may carry a secret.
				add(field+".base_url", "%s", msg)
			}
		}
		if p.Kind == KindAzure && p.Auth != AuthAPIKey && p.Auth != AuthEntra {
			add(field+".auth", "must be api-key or entra, not %q", p.Auth)
		}
		if p.Kind != KindAzure && (p.APIVersion != "" || p.Auth != "") {
			add(field, "api_version and auth are for kind azure")
		}
		if len(p.Tiers) == 0 {
			add(field+".tiers", "at least one tier is required")
		}
		for tier, t := range p.Tiers {
			if t.Model == "" {
				add(field+".tiers."+tier, "model name is required")
			}
			if t.MaxOutputTokens < 0 {
				add(field+".tiers."+tier+".max_output_tokens", "must be > 0, got %d", t.MaxOutputTokens)
			}
			routes[llm.Route{Provider: name, Tier: tier}.String()] = true
		}
	}
	return routes
}

// validateKeys checks each key against its provider and routes.
func (c *Config) validateKeys(routes map[string]bool, add func(field, format string, args ...any)) {
	ids := map[string]bool{}
	for i, k := range c.Keys {
		field := fmt.Sprintf("keys[%d]", i)
		if k.ID == "" {
			add(field+".id", "is required")
		} else if ids[k.ID] {
			add(field+".id", "duplicate key id %q", k.ID)
		}
		ids[k.ID] = true
		if _, ok := c.Providers[k.Provider]; !ok {
			add(field+".provider", "unknown provider %q (configure it under providers)", k.Provider)
		} else if !routes[llm.Route{Provider: k.Provider, Tier: k.ModelTier}.String()] {
			add(field+".model_tier", "tier %q is not configured under providers.%s.tiers", k.ModelTier, k.Provider)
		}
		c.validateKeyOfKind(field, k, c.Providers[k.Provider], add)
		if k.MaxInFlight < 0 {
			add(field+".max_in_flight", "must be >= 0, got %d", k.MaxInFlight)
		}
		if k.BurstWindow < time.Millisecond || k.BurstWindow > time.Minute {
			add(field+".burst_window", "must be between 1ms and 1m, got %s", k.BurstWindow)
		}
	}
	if len(c.Keys) == 0 {
		add("keys", "at least one key is required")
	}
}

// validateRouting checks the fallback chains, routing rules and model
// names against the configured routes.
func (c *Config) validateRouting(routes map[string]bool, add func(field, format string, args ...any)) {
	for from, chain := range c.Fallback {
		field := "fallback." + from
		if !routes[from] {
			add(field, "unknown route %q", from)
		}
		if len(chain) == 0 {
			add(field, "names no route")
		}
		seen := map[string]bool{from: true}
		for _, to := range chain {
			switch {
			case !routes[to]:
				add(field, "falls back to unknown route %q", to)
			case seen[to]:
				add(field, "names %q twice (or falls back to itself)", to)
			}
			seen[to] = true
		}
	}
	for i, r := range c.Routing {
		field := fmt.Sprintf("routing[%d]", i)
		if (r.Layer == "") == (r.From == "") {
			add(field, "set one of layer and from")
		}
		if r.From != "" && !routes[r.From] {
			add(field+".from", "unknown route %q", r.From)
		}
		if r.Layer != "" && c.Cache.TTL[r.Layer] == 0 {
			add(field+".layer", "unknown cache layer %q", r.Layer)
		}
		if !routes[r.Route] {
			add(field+".route", "unknown route %q", r.Route)
		}
	}
	for name, to := range c.Models {
		if !routes[to] {
			add("models."+name, "maps to unknown route %q", to)
		}
	}
}

// validateQueue checks the queue's slots, reserves, weights and limits.
func (c *Config) validateQueue(add func(field, format string, args ...any)) {
	q := c.Queue
	if q.MaxConcurrentLLMCalls <= 0 {
		add("queue.max_concurrent_llm_calls", "must be > 0")
	}
	sum := 0
	for _, p := range priority.All {
		if q.Reserved[p] < 0 {
			add("queue.reserved."+p.String(), "must be >= 0")
		}
		sum += q.Reserved[p]
		if q.Weights[p] <= 0 {
			add("queue.weights."+p.String(), "must be > 0")
		}
	}
	for p := range q.Reserved {
		if !p.Valid() {
			add("queue.reserved", "unknown priority %v", p)
		}
	}
	if sum > q.MaxConcurrentLLMCalls {
		add("queue.reserved", "reserves sum to %d, more than max_concurrent_llm_calls (%d)", sum, q.MaxConcurrentLLMCalls)
	}
	if q.MaxDepth <= 0 {
		add("queue.queue_max_depth", "must be > 0")
	}
	if q.MaxWait <= 0 {
		add("queue.queue_max_wait", "must be > 0")
	}
}

// validateCache checks the cache's threshold, layers, patterns, memo and
// embedder.
func (c *Config) validateCache(add func(field, format string, args ...any)) {
	ca := c.Cache
	if !(ca.Threshold > 0 && ca.Threshold <= 1) { // NaN too
		add("cache.threshold", "must be in (0, 1], got %g", ca.Threshold)
	}
	for layer, ttl := range ca.TTL {
		if ttl <= 0 {
			add("cache.ttl."+layer, "must be > 0")
		}
	}
	if _, ok := ca.TTL[ca.DefaultLayer]; !ok {
		add("cache.default_layer", "unknown layer %q (no ttl configured)", ca.DefaultLayer)
	}
	for i, p := range ca.ProtectedPatterns {
		if _, err := regexp.Compile(p); err != nil {
			add(fmt.Sprintf("cache.protected_patterns[%d]", i), "invalid regular expression: %v", err)
		}
	}
	for i, p := range ca.IgnoredPatterns {
		if _, err := regexp.Compile(p); err != nil {
			add(fmt.Sprintf("cache.ignored_patterns[%d]", i), "invalid regular expression: %v", err)
		}
	}
	if ca.Memo.Entries <= 0 || ca.Memo.TTL <= 0 {
		add("cache.memo", "entries and ttl must be > 0 (enabled: false turns it off)")
	}
	switch ca.Embedder.Kind {
	case "local":
	case "openai":
		if ca.Embedder.BaseURL == "" || ca.Embedder.Model == "" {
			add("cache.embedder", "kind openai needs base_url and model")
		} else if msg := checkBaseURL(ca.Embedder.BaseURL); msg != "" {
			// The embedder's key travels like a provider's.
			add("cache.embedder.base_url", "%s", msg)
		}
	default:
		add("cache.embedder.kind", "must be local or openai, not %q", ca.Embedder.Kind)
	}
}

// validateTenants checks each tenant's name, token and limits.
func (c *Config) validateTenants(add func(field, format string, args ...any)) {
	names := map[string]bool{}
	hashes := map[string]bool{}
	for i, t := range c.Tenants {
		field := fmt.Sprintf("tenants[%d]", i)
		if !tenantName.MatchString(t.Name) {
			// The name is part of Redis keys (idempotency, limits): a colon
			// would let tenant "fleet" with key "eu:K" read tenant "fleet:eu"'s.
			add(field+".name", "must be 1-64 of a-z, 0-9, _ and - (starting with a letter or digit), got %q", t.Name)
		} else if names[t.Name] {
			add(field+".name", "duplicate tenant %q", t.Name)
		}
		names[t.Name] = true
		if t.bothTokens {
			add(field+".token", "set token or token_sha256, not both")
		}
		if _, err := hex.DecodeString(t.TokenSHA256); len(t.TokenSHA256) != 64 || err != nil {
			add(field+".token", "token or token_sha256 (64 hex digits) is required")
		} else if hashes[t.TokenSHA256] {
			add(field+".token", "the same token is used by another tenant")
		}
		hashes[t.TokenSHA256] = true
		if !c.Server.AdminToken.IsZero() && strings.EqualFold(c.Server.AdminToken.SHA256(), t.TokenSHA256) {
			add(field+".token", "must differ from server.admin_token")
		}
		if t.DefaultPriority < t.MaxPriority {
			add(field+".default_priority", "is more urgent than max_priority")
		}
		for _, l := range []struct {
			name string
			v    int
		}{{"rate_limit_rpm", t.RateLimitRPM}, {"max_queued", t.MaxQueued}, {"max_streams", t.MaxStreams}, {"max_sync_waits", t.MaxSyncWaits}, {"max_reads_per_second", t.MaxReadsPerSecond}} {
			if l.v < -1 {
				add(field+"."+l.name, "must be > 0, or -1 for unlimited")
			}
		}
		if b := t.MaxStoredBytes; b != -1 && b < 2*c.Server.MaxBodyBytes {
			add(field+".max_stored_bytes", "must be at least 2 × server.max_body_bytes (%d), or -1 for unlimited; got %d",
				2*c.Server.MaxBodyBytes, b)
		}
	}
}

// validateOperations checks the breaker, alert webhooks and daily report.
func (c *Config) validateOperations(add func(field, format string, args ...any)) {
	b := c.Breaker
	if b.FailureThreshold <= 0 || b.HalfOpenMaxCalls <= 0 || b.SuccessThreshold <= 0 || b.OpenDuration <= 0 {
		add("breaker", "failure_threshold, open_duration, half_open_max_calls and success_threshold must be > 0")
	}
	for i, w := range append(append(append([]Webhook{}, c.Alerts.WeCom...), c.Alerts.DingTalk...), c.Alerts.Generic...) {
		if !strings.HasPrefix(w.URL.Reveal(), "http://") && !strings.HasPrefix(w.URL.Reveal(), "https://") {
			add(fmt.Sprintf("alerts (webhook %d)", i), "url must be http(s)")
		}
	}
	if _, err := time.Parse("15:04", c.Report.At); err != nil {
		add("report.at", "must be HH:MM, got %q", c.Report.At)
	}
	if _, err := time.LoadLocation(c.Report.Timezone); err != nil {
		add("report.timezone", "unknown time zone %q", c.Report.Timezone)
	}
}

// ParseRoute parses "provider/tier".
func ParseRoute(s string) (llm.Route, error) {
	p, t, ok := strings.Cut(s, "/")
	if !ok || t == "" || !llm.Provider(p).Valid() {
		return llm.Route{}, fmt.Errorf("invalid route %q: want provider/tier, e.g. claude/sonnet", s)
	}
	return llm.Route{Provider: llm.Provider(p), Tier: t}, nil
}

// Routes returns every configured route.
func (c *Config) Routes() []llm.Route {
	var out []llm.Route
	for name, p := range c.Providers {
		for tier := range p.Tiers {
			out = append(out, llm.Route{Provider: name, Tier: tier})
		}
	}
	return out
}

// RouteOrder returns the routes a request asking route asked, of cache
// layer layer, tries in order: a matching routing rule's route first, then
// the asked route, then its fallback chain; each route once.
func (c *Config) RouteOrder(asked llm.Route, layer string) []llm.Route {
	var names []string
	for _, r := range c.Routing {
		if (r.Layer != "" && r.Layer == layer) || (r.From != "" && r.From == asked.String()) {
			names = append(names, r.Route)
			break
		}
	}
	names = append(names, asked.String())
	names = append(names, c.Fallback[asked.String()]...)
	out := make([]llm.Route, 0, len(names))
	seen := map[string]bool{}
	for _, n := range names {
		r, err := ParseRoute(n)
		if err != nil || seen[n] {
			continue
		}
		seen[n] = true
		out = append(out, r)
	}
	return out
}

// ModelName returns the provider's model name for a route.
func (c *Config) ModelName(r llm.Route) string {
	return c.Providers[r.Provider].Tiers[r.Tier].Model
}

// checkBaseURL says what is wrong with a provider's base URL, or "": an
// absolute URL, https unless the host is loopback (keys would otherwise
// cross the network in clear text), and no credentials in it (user info
// or a query string end up in logs and error messages; keys belong in
// keys[].api_key).
func checkBaseURL(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
		return "must be an absolute http(s) URL"
	case u.User != nil:
		return "must not carry user info (put credentials in keys[].api_key)"
	case u.RawQuery != "" || u.Fragment != "":
		return "must not carry a query or fragment (put credentials in keys[].api_key)"
	case u.Scheme == "http" && !loopback(u.Hostname()):
		return "must use https unless the host is loopback (keys would travel in clear text)"
	}
	return ""
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validateLimits refuses a negative or NaN value where only a positive one
// makes sense (defaults replace zeros before validation): found by
// FuzzParse, each would have been accepted and misbehaved at run time.
func (c *Config) validateLimits(add func(field, format string, args ...any)) {
	s, w, q := c.Server, c.Worker, c.Queue
	for _, l := range []struct {
		field string
		v     int64
	}{
		{"server.max_body_bytes", s.MaxBodyBytes}, {"server.max_prompt_chars", int64(s.MaxPromptChars)},
		{"server.default_max_tokens", int64(s.DefaultMaxTokens)},
		{"server.max_header_bytes", int64(s.MaxHeaderBytes)}, {"worker.concurrency", int64(w.Concurrency)},
		{"worker.max_attempts", int64(w.MaxAttempts)},
		{"server.sync_timeout", int64(s.SyncTimeout)}, {"server.result_ttl", int64(s.ResultTTL)},
		{"server.read_header_timeout", int64(s.ReadHeaderTimeout)}, {"server.read_timeout", int64(s.ReadTimeout)},
		{"server.write_timeout", int64(s.WriteTimeout)}, {"server.stream_max_lifetime", int64(s.StreamMaxLifetime)},
		{"server.stream_keepalive", int64(s.StreamKeepAlive)},
		{"worker.task_check_interval", int64(w.TaskCheckInterval)},
		{"worker.delayed_task_check_interval", int64(w.DelayedTaskCheckInterval)},
		{"queue.slot_lease", int64(q.SlotLease)},
	} {
		if l.v <= 0 {
			add(l.field, "must be > 0")
		}
	}
	if s.MaxTokensLimit < 0 {
		add("server.max_tokens_limit", "must be > 0, or 0 for none (each tier's max_output_tokens), got %d", s.MaxTokensLimit)
	}
	for route, p := range c.Prices {
		if !(p.Input >= 0 && p.Output >= 0) || math.IsInf(p.Input, 0) || math.IsInf(p.Output, 0) {
			add("prices."+route, "input and output must be finite and >= 0")
		}
	}
}
