package config_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/config"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

var baseEnv = map[string]string{"BULWARK_ADMIN_TOKEN": "adm", "BULWARK_DEV_TOKEN": "dev",
	"CLAUDE_API_KEY_1": "ck1", "CLAUDE_API_KEY_2": "ck2", "OPENAI_API_KEY_PROJECT_A": "oka", "OPENAI_API_KEY_PROJECT_B": "okb"}

// parseRepoConfig parses the repository's config.yaml with baseEnv.
func parseRepoConfig(t *testing.T) *config.Config {
	t.Helper()
	b, err := os.ReadFile("../../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(b, env(baseEnv))
	if err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	return c
}

func TestRepoConfigLoads(t *testing.T) {
	t.Parallel()
	c := parseRepoConfig(t)
	if c.Queue.MaxConcurrentLLMCalls != 20 || c.Queue.Reserved[priority.Critical] != 5 || c.Queue.Reserved[priority.Low] != 1 {
		t.Errorf("queue defaults: %+v", c.Queue)
	}
	if c.Queue.MaxWait != 300*time.Second || c.Queue.MaxDepth != 200 {
		t.Errorf("queue wait/depth: %v %d", c.Queue.MaxWait, c.Queue.MaxDepth)
	}
	// A compat call waits as long as a request may wait to start plus its
	// call: one Bulwark will still answer is not turned into a 429 first.
	if c.Server.SyncTimeout != 7*time.Minute || c.HTTPConfig().MaxWait != c.Queue.MaxWait {
		t.Errorf("sync_timeout %v, max wait %v", c.Server.SyncTimeout, c.HTTPConfig().MaxWait)
	}
	if c.Cache.TTL["router"] != 24*time.Hour || c.Cache.Threshold != 0.95 {
		t.Errorf("cache: %+v", c.Cache)
	}
	if order := c.RouteOrder(llm.Route{Provider: "claude", Tier: "sonnet"}, "agent"); len(order) != 2 || order[1].String() != "openai/gpt4o" {
		t.Errorf("routes of claude/sonnet = %v", order)
	}
	if got := c.Keys[0].APIKey.Reveal(); got != "ck1" {
		t.Errorf("key from the environment = %q", got)
	}
	if got := c.Providers[llm.ProviderClaude].BaseURL; got != "https://api.anthropic.com" {
		t.Errorf("default claude base_url = %q, want the real API (make run sets the mock)", got)
	}
	if c.Tenants[0].TokenSHA256 == "" || !c.Tenants[0].Token.IsZero() {
		t.Error("tenant token must be kept only as a hash")
	}
	// Each tier has its model's documented output limit, and no global
	// cap lowers Sonnet's 64,000 (issue 29: the SDKs ask for it).
	for route, want := range map[string]int{"claude/sonnet": 64_000, "claude/haiku": 64_000, "openai/gpt4o": 16_384, "openai/gpt4o-mini": 16_384} {
		r, _ := config.ParseRoute(route)
		if got := c.IntakeConfig().WithDefaults().OutputLimit(r); got != want {
			t.Errorf("%s: max_tokens limit %d, want %d", route, got, want)
		}
	}
}

// A tier's max_output_tokens defaults to its model's documented maximum,
// matched within dated and Bedrock names, else to the fallback; one the
// file gives wins.
func TestTierOutputLimits(t *testing.T) {
	t.Parallel()
	doc := strings.Replace(minimal, "tiers: {sonnet: m1}",
		`tiers: {sonnet: claude-sonnet-4-5-20250929, haiku: "us.anthropic.claude-haiku-4-5-20251001-v1:0", opus: claude-opus-4-1, `+
			`mini: gpt-4o-mini, local: qwen2.5, big: {model: claude-sonnet-4-5, max_output_tokens: 128000}}`, 1)
	c, err := config.Parse([]byte(doc), env(map[string]string{"K1": "k"}))
	if err != nil {
		t.Fatal(err)
	}
	for tier, want := range map[string]int{"sonnet": 64_000, "haiku": 64_000, "opus": 32_000, "mini": 16_384,
		"local": config.MaxOutputTokensFallback, "big": 128_000} {
		if got := c.OutputLimit(llm.Route{Provider: "claude", Tier: tier}); got != want {
			t.Errorf("%s: max_output_tokens %d, want %d", tier, got, want)
		}
	}
	if got := c.ModelName(llm.Route{Provider: "claude", Tier: "big"}); got != "claude-sonnet-4-5" {
		t.Errorf("model of a tier given as a mapping = %q", got)
	}
}

const minimal = `
server: {admin_token: a}
postgres: {dsn: "postgres://x@127.0.0.1/db"}
providers:
  claude: {base_url: "http://127.0.0.1:1", tiers: {sonnet: m1}}
  openai: {base_url: "http://127.0.0.1:1", tiers: {gpt4o: m2}}
keys:
  - {id: k1, provider: claude, model_tier: sonnet, api_key: "${K1}", rpm_limit: 1, tpm_limit: 1}
`

// withProvider adds a provider (one YAML line under providers) and keys to
// minimal.
func withProvider(provider, keys string) string {
	return strings.Replace(minimal, "providers:\n", "providers:\n"+provider+"\n", 1) + keys + "\n"
}

func bedrock() string {
	return withProvider(`  bedrock: {tiers: {sonnet: anthropic.claude-sonnet-v1}}`,
		`  - {id: b1, provider: bedrock, model_tier: sonnet, region: us-east-1, rpm_limit: 5, tpm_limit: 5000}`)
}

func local() string {
	return withProvider(`  local: {base_url: "http://127.0.0.1:11434", tiers: {qwen: "qwen2.5:7b"}}`,
		`  - {id: l1, provider: local, model_tier: qwen, max_in_flight: 4}`)
}

func azure(auth string) string {
	return withProvider(`  azure: {base_url: "https://res.openai.azure.com", auth: `+auth+`, tiers: {gpt4o: gpt4o-deploy}}`,
		`  - {id: z1, provider: azure, model_tier: gpt4o, api_key: k, deployment: gpt4o-ptu, ptu: true, rpm_limit: 1, tpm_limit: 1}`)
}

func TestValidation(t *testing.T) {
	t.Parallel()
	const secretVal = "sk-ant-SECRET-123"
	tests := []struct {
		name    string
		doc     string
		env     map[string]string
		wantErr string // "" = valid
	}{
		{"minimal", minimal, map[string]string{"K1": secretVal}, ""},
		{"missing env", minimal, nil, "keys[0].api_key: environment variable K1 is not set"},
		{"unknown provider", minimal + `  - {id: k2, provider: gemini, model_tier: x, api_key: k, rpm_limit: 1, tpm_limit: 1}`,
			map[string]string{"K1": secretVal}, `keys[1].provider: unknown provider "gemini"`},
		{"zero rpm", strings.Replace(minimal, "rpm_limit: 1", "rpm_limit: 0", 1), map[string]string{"K1": secretVal}, "keys[0].rpm_limit: must be > 0"},
		{"negative tpm", strings.Replace(minimal, "tpm_limit: 1", "tpm_limit: -5", 1), map[string]string{"K1": secretVal}, "keys[0].tpm_limit: must be > 0"},
		{"duplicate id", minimal + `  - {id: k1, provider: claude, model_tier: sonnet, api_key: k, rpm_limit: 1, tpm_limit: 1}`,
			map[string]string{"K1": secretVal}, `keys[1].id: duplicate key id "k1"`},
		{"unknown tier", minimal + `  - {id: k2, provider: claude, model_tier: opus, api_key: k, rpm_limit: 1, tpm_limit: 1}`,
			map[string]string{"K1": secretVal}, `keys[1].model_tier: tier "opus" is not configured`},
		{"fallback to unknown tier", minimal + "fallback: {claude/sonnet: openai/gpt5}", map[string]string{"K1": secretVal},
			`fallback.claude/sonnet: falls back to unknown route "openai/gpt5"`},
		{"fallback to itself", minimal + "fallback: {claude/sonnet: [openai/gpt4o, claude/sonnet]}",
			map[string]string{"K1": secretVal}, `fallback.claude/sonnet: names "claude/sonnet" twice (or falls back to itself)`},
		{"fallback chain", bedrock() + "fallback: {claude/sonnet: [bedrock/sonnet, openai/gpt4o]}", map[string]string{"K1": secretVal}, ""},
		{"routing rule", local() + "routing: [{layer: router, route: local/qwen}]", map[string]string{"K1": secretVal}, ""},
		{"routing rule without a match", local() + "routing: [{route: local/qwen}]", map[string]string{"K1": secretVal}, "routing[0]: set one of layer and from"},
		{"routing to an unknown route", minimal + "routing: [{from: claude/sonnet, route: local/qwen}]", map[string]string{"K1": secretVal}, `routing[0].route: unknown route "local/qwen"`},
		{"bedrock key without region", strings.Replace(bedrock(), "region: us-east-1, ", "", 1), map[string]string{"K1": secretVal}, "keys[1].region: is required for a bedrock key"},
		{"bedrock key with an api key", strings.Replace(bedrock(), "region: us-east-1,", "region: us-east-1, api_key: x,", 1), map[string]string{"K1": secretVal}, "keys[1].api_key: must be empty for a bedrock key"},
		{"local key without concurrency", strings.Replace(local(), "max_in_flight: 4", "max_in_flight: 0", 1), map[string]string{"K1": secretVal}, "keys[1].max_in_flight: is required for a local key"},
		{"region on an anthropic key", minimal + "  - {id: k9, provider: claude, model_tier: sonnet, api_key: k, rpm_limit: 1, tpm_limit: 1, region: eu-west-1}",
			map[string]string{"K1": secretVal}, "keys[1]: region and profile are for bedrock keys"},
		{"anthropic itpm and otpm", strings.Replace(minimal, "tpm_limit: 1}", "tpm_limit: 96000, itpm_limit: 80000, otpm_limit: 16000}", 1),
			map[string]string{"K1": secretVal}, ""},
		{"negative itpm", strings.Replace(minimal, "tpm_limit: 1}", "tpm_limit: 1, itpm_limit: -1}", 1),
			map[string]string{"K1": secretVal}, "keys[0].itpm_limit: must be >= 0 (0: none), got -1"},
		{"negative otpm", strings.Replace(minimal, "tpm_limit: 1}", "tpm_limit: 1, otpm_limit: -8000}", 1),
			map[string]string{"K1": secretVal}, "keys[0].otpm_limit: must be >= 0 (0: none), got -8000"},
		{"bedrock burndown", strings.Replace(bedrock(), "tpm_limit: 5000}", "tpm_limit: 5000, output_burndown: 5}", 1),
			map[string]string{"K1": secretVal}, ""},
		{"negative burndown", strings.Replace(bedrock(), "tpm_limit: 5000}", "tpm_limit: 5000, output_burndown: -1}", 1),
			map[string]string{"K1": secretVal}, "keys[1].output_burndown: must be >= 0 (0: 1), got -1"},
		{"burndown on an anthropic key", strings.Replace(minimal, "tpm_limit: 1}", "tpm_limit: 1, output_burndown: 5}", 1),
			map[string]string{"K1": secretVal}, "keys[0]: output_burndown is for bedrock keys (their provider is anthropic)"},
		{"otpm on a bedrock key", strings.Replace(bedrock(), "tpm_limit: 5000}", "tpm_limit: 5000, otpm_limit: 1000}", 1),
			map[string]string{"K1": secretVal}, "keys[1]: itpm_limit and otpm_limit are for anthropic keys (their provider is bedrock)"},
		{"itpm on an openai key", minimal + "  - {id: o1, provider: openai, model_tier: gpt4o, api_key: k, rpm_limit: 1, tpm_limit: 1, itpm_limit: 5}",
			map[string]string{"K1": secretVal}, "keys[1]: itpm_limit and otpm_limit are for anthropic keys (their provider is openai)"},
		{"azure ptu key", azure("api-key"), map[string]string{"K1": secretVal}, ""},
		{"azure entra without a key", strings.Replace(azure("entra"), "api_key: k, ", "", 1), map[string]string{"K1": secretVal}, ""},
		{"azure api-key auth without a key", strings.Replace(azure("api-key"), "api_key: k, ", "", 1), map[string]string{"K1": secretVal}, "keys[1].api_key: is required"},
		{"azure bad auth", azure("password"), map[string]string{"K1": secretVal}, `providers.azure.auth: must be api-key or entra, not "password"`},
		{"ptu on an openai key", minimal + "  - {id: o1, provider: openai, model_tier: gpt4o, api_key: k, rpm_limit: 1, tpm_limit: 1, ptu: true}",
			map[string]string{"K1": secretVal}, "keys[1]: endpoint, deployment and ptu are for azure keys"},
		{"unknown kind", strings.Replace(minimal, `claude: {base_url`, `claude: {kind: gemini, base_url`, 1), map[string]string{"K1": secretVal}, `providers.claude.kind: must be anthropic, openai, bedrock, azure or local, not "gemini"`},
		{"unknown key", minimal + "bogus: 1", map[string]string{"K1": secretVal}, "field bogus not found"},
		{"key cooldown", minimal + "key_cooldown: {base: 100ms, max: 2s}", map[string]string{"K1": secretVal}, ""},
		{"key cooldown max below base", minimal + "key_cooldown: {base: 5s, max: 2s}", map[string]string{"K1": secretVal}, "key_cooldown: keypool: Config.CooldownMax (2s) must be >= CooldownBase (5s)"},
		{"reserves too big", minimal + "queue: {max_concurrent_llm_calls: 5}", map[string]string{"K1": secretVal}, "queue.reserved: reserves sum to 20"},
		{"bad priority", minimal + "queue: {reserved: {urgent: 1}}", map[string]string{"K1": secretVal}, "invalid priority"},
		{"no admin token", strings.Replace(minimal, "admin_token: a", "listen: x", 1), map[string]string{"K1": secretVal}, "server.admin_token: is required"},
		{"bad threshold", minimal + "cache: {threshold: 1.5}", map[string]string{"K1": secretVal}, "cache.threshold"},
		{"bad regexp", minimal + "cache: {protected_patterns: ['(']}", map[string]string{"K1": secretVal}, "cache.protected_patterns[0]"},
		{"bad ignored regexp", minimal + "cache: {ignored_patterns: ['x', '[']}", map[string]string{"K1": secretVal}, "cache.ignored_patterns[1]"},
		{"tenant without token", minimal + "tenants: [{name: t}]", map[string]string{"K1": secretVal}, "tenants[0].token"},
		{"default", minimal + "tenants: [{name: t, token: x}]", map[string]string{"K1": secretVal}, ""},
		{"tenant name with a colon", minimal + "tenants: [{name: 'fleet:eu', token: x}]", map[string]string{"K1": secretVal}, "tenants[0].name: must be"},
		{"tenant token is the admin token", minimal + "tenants: [{name: t, token: a}]", map[string]string{"K1": secretVal}, "must differ from server.admin_token"},
		{"tenant with both tokens", minimal + "tenants: [{name: t, token: b, token_sha256: " + strings.Repeat("ab", 32) + "}]", map[string]string{"K1": secretVal}, "set token or token_sha256, not both"},
		{"negative tenant share", minimal + "tenants: [{name: t, token: b, max_queued: -2}]", map[string]string{"K1": secretVal}, "tenants[0].max_queued: must be > 0, or -1 for unlimited"},
		{"admin listener on the api's", strings.Replace(minimal, "admin_token: a", `admin_token: a, listen: "127.0.0.1:9", admin_listen: "127.0.0.1:9"`, 1),
			map[string]string{"K1": secretVal}, "server.admin_listen: must differ"},
		{"cleartext base url", strings.Replace(minimal, "http://127.0.0.1:1", "http://api.example.test", 1), map[string]string{"K1": secretVal},
			"providers.claude.base_url: must use https unless the host is loopback"},
		{"secret in base url", strings.Replace(minimal, "http://127.0.0.1:1", "https://api.example.test/v1?key=sk-ant-LEAK", 1), map[string]string{"K1": secretVal},
			"providers.claude.base_url: must not carry a query"},
		{"user info in base url", strings.Replace(minimal, "http://127.0.0.1:1", "https://u:sk-ant-LEAK@api.example.test", 1), map[string]string{"K1": secretVal},
			"providers.claude.base_url: must not carry user info"},
		{"https base url", strings.Replace(minimal, "http://127.0.0.1:1", "https://api.example.test", 1), map[string]string{"K1": secretVal}, ""},
		// Redis: one server, Sentinel or Cluster (pkg/redisconn).
		{"redis sentinel", minimal + `redis: {mode: sentinel, sentinel: {master_name: m, addrs: ["127.0.0.1:26379", "127.0.0.1:26380"]}, min_replicas_acked: 1}`,
			map[string]string{"K1": secretVal}, ""},
		{"redis cluster", minimal + `redis: {mode: cluster, cluster: {addrs: ["127.0.0.1:7000"]}}`, map[string]string{"K1": secretVal}, ""},
		{"redis unknown mode", minimal + "redis: {mode: replica}", map[string]string{"K1": secretVal},
			`redis.mode: must be standalone, sentinel or cluster, got "replica"`},
		{"redis sentinel without a master", minimal + `redis: {mode: sentinel, sentinel: {addrs: ["127.0.0.1:26379"]}}`,
			map[string]string{"K1": secretVal}, "redis.sentinel.master_name: is required with mode sentinel"},
		{"redis sentinel without sentinels", minimal + `redis: {mode: sentinel, sentinel: {master_name: m}}`,
			map[string]string{"K1": secretVal}, "redis.sentinel.addrs: at least one sentinel address is required"},
		{"redis sentinel address", minimal + `redis: {mode: sentinel, sentinel: {master_name: m, addrs: ["localhost"]}}`,
			map[string]string{"K1": secretVal}, `redis.sentinel.addrs[0]: must be host:port, got "localhost"`},
		{"redis sentinel with an addr", minimal + `redis: {mode: sentinel, addr: "127.0.0.1:1", sentinel: {master_name: m, addrs: ["127.0.0.1:26379"]}}`,
			map[string]string{"K1": secretVal}, "redis.addr: is not used with mode sentinel"},
		{"redis cluster db", minimal + `redis: {mode: cluster, db: 2, cluster: {addrs: ["127.0.0.1:7000"]}}`,
			map[string]string{"K1": secretVal}, "redis.db: must be 0 with mode cluster"},
		{"redis cluster without nodes", minimal + "redis: {mode: cluster}", map[string]string{"K1": secretVal},
			"redis.cluster.addrs: at least one node address is required"},
		{"redis sentinel section in standalone", minimal + `redis: {sentinel: {master_name: m}}`, map[string]string{"K1": secretVal},
			"redis.sentinel: is not used with mode standalone"},
		{"redis negative replicas", minimal + "redis: {min_replicas_acked: -1}", map[string]string{"K1": secretVal},
			"redis.min_replicas_acked: must not be negative"},
		{"redis negative pool", minimal + "redis: {pool_size: -1}", map[string]string{"K1": secretVal},
			"redis.pool_size: must not be negative"},
		// Limits across components name both fields.
		{"probe shorter than a call", minimal + "breaker: {probe_timeout: 60s}", map[string]string{"K1": secretVal},
			"breaker.probe_timeout: (1m0s) must exceed providers.claude.timeout (2m0s)"},
		{"probe default follows the longest call", strings.Replace(minimal, `tiers: {sonnet: m1}}`, `tiers: {sonnet: m1}, timeout: 150s}`, 1),
			map[string]string{"K1": secretVal}, ""},
		{"call longer than the task", strings.Replace(minimal, `tiers: {sonnet: m1}}`, `tiers: {sonnet: m1}, timeout: 8m}`, 1) +
			"breaker: {probe_timeout: 9m}", map[string]string{"K1": secretVal},
			"providers.claude.timeout: (8m0s) twice (route and fallback) plus worker.hold_wait (10s) must stay under the queue's task timeout (15m0s)"},
		{"call longer than the key lease", strings.Replace(minimal, `tiers: {sonnet: m1}}`, `tiers: {sonnet: m1}, timeout: 3m}`, 1),
			map[string]string{"K1": secretVal}, "providers.claude.timeout: plus worker.pace_wait (2s) must stay under the key lease (3m0s)"},
		// A component's own validation backs the file's rules up.
		{"negative pace wait", minimal + "worker: {pace_wait: -1s}", map[string]string{"K1": secretVal},
			"worker: dispatch: pace_wait must be > 0, got -1s"},
		{"default max tokens over the cap", strings.Replace(minimal, "server: {admin_token: a}", "server: {admin_token: a, max_tokens_limit: 100, default_max_tokens: 200}", 1), map[string]string{"K1": secretVal},
			"server: intake: DefaultMaxTokens must be in [1, MaxTokensLimit (100)], got 200"},
		{"hold wait under pace wait", minimal + "worker: {pace_wait: 5s, hold_wait: 3s}", map[string]string{"K1": secretVal},
			"worker: dispatch: hold_wait (3s) must be >= pace_wait (5s)"},
		{"embedder dims out of range", minimal + `cache: {embedder: {kind: openai, base_url: "http://127.0.0.1:2", model: m, dims: 99999}}`,
			map[string]string{"K1": secretVal}, "cache.embedder: embed: OpenAIConfig.Dims 99999"},
		{"negative history flush timeout", strings.Replace(minimal, "postgres: {", "postgres: {history_flush_timeout: -1s, ", 1), map[string]string{"K1": secretVal},
			"postgres.history_flush_timeout: must be > 0"},
		{"embedder over plain http to another host", minimal + `cache: {embedder: {kind: openai, base_url: "http://embed.example.com", model: m, dims: 8}}`,
			map[string]string{"K1": secretVal}, "cache.embedder.base_url: must use https unless the host is loopback"},
		{"embedder with a key in its URL", minimal + `cache: {embedder: {kind: openai, base_url: "https://embed.example.com/?key=x", model: m, dims: 8}}`,
			map[string]string{"K1": secretVal}, "cache.embedder.base_url: must not carry a query"},
		{"HNSW build below pgvector's limits", minimal + `cache: {index: {m: 16, ef_construction: 20}}`,
			map[string]string{"K1": secretVal}, "cache: cache: Config.IndexEfConstruction 20: want 2*IndexM (32)..1000"},
		{"HNSW build parameters", minimal + `cache: {index: {m: 12, ef_construction: 40}}`, map[string]string{"K1": secretVal}, ""},
		{"tier with its output limit", strings.Replace(minimal, "tiers: {sonnet: m1}", "tiers: {sonnet: {model: m1, max_output_tokens: 8000}}", 1),
			map[string]string{"K1": secretVal}, ""},
		{"tier with an unknown key", strings.Replace(minimal, "tiers: {sonnet: m1}", "tiers: {sonnet: {model: m1, max_tokens: 8000}}", 1),
			map[string]string{"K1": secretVal}, "field max_tokens not found in a tier (model, max_output_tokens)"},
		{"tier without its model", strings.Replace(minimal, "tiers: {sonnet: m1}", "tiers: {sonnet: {max_output_tokens: 8000}}", 1),
			map[string]string{"K1": secretVal}, "providers.claude.tiers.sonnet: model name is required"},
		{"negative output limit", strings.Replace(minimal, "tiers: {sonnet: m1}", "tiers: {sonnet: {model: m1, max_output_tokens: -1}}", 1),
			map[string]string{"K1": secretVal}, "providers.claude.tiers.sonnet.max_output_tokens: must be > 0, got -1"},
		{"negative ceiling", strings.Replace(minimal, "server: {admin_token: a}", "server: {admin_token: a, max_tokens_limit: -1}", 1),
			map[string]string{"K1": secretVal}, "server.max_tokens_limit: must be > 0, or 0 for none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse([]byte(tt.doc), env(tt.env))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), secretVal) {
				t.Fatalf("error leaks the secret: %v", err)
			}
		})
	}
}

func TestExpandDefault(t *testing.T) {
	t.Parallel()
	doc := strings.Replace(minimal, `"${K1}"`, `"${K1:-fallback-key}"`, 1)
	c, err := config.Parse([]byte(doc), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Keys[0].APIKey.Reveal() != "fallback-key" {
		t.Fatalf("got %q", c.Keys[0].APIKey.Reveal())
	}
}

// The routes a request tries: a matching routing rule's first (by layer or
// by asked route), then the asked route, then its fallback chain, each once.
func TestRouteOrder(t *testing.T) {
	t.Parallel()
	doc := strings.Replace(local(), "providers:\n", "providers:\n  bedrock: {tiers: {sonnet: anthropic.claude-sonnet-v1}}\n", 1) +
		"  - {id: b1, provider: bedrock, model_tier: sonnet, region: us-east-1, rpm_limit: 5, tpm_limit: 5000}\n" +
		"fallback: {claude/sonnet: [bedrock/sonnet, openai/gpt4o], local/qwen: claude/sonnet}\n" +
		"routing: [{layer: router, route: local/qwen}, {from: openai/gpt4o, route: local/qwen}]\n"
	c, err := config.Parse([]byte(doc), env(map[string]string{"K1": "k"}))
	if err != nil {
		t.Fatal(err)
	}
	sonnet := llm.Route{Provider: "claude", Tier: "sonnet"}
	for _, tt := range []struct {
		asked llm.Route
		layer string
		want  string
	}{
		{sonnet, "agent", "[claude/sonnet bedrock/sonnet openai/gpt4o]"},
		{sonnet, "router", "[local/qwen claude/sonnet bedrock/sonnet openai/gpt4o]"},
		{llm.Route{Provider: "openai", Tier: "gpt4o"}, "agent", "[local/qwen openai/gpt4o]"},
		{llm.Route{Provider: "local", Tier: "qwen"}, "router", "[local/qwen claude/sonnet]"},
	} {
		if got := fmt.Sprint(c.RouteOrder(tt.asked, tt.layer)); got != tt.want {
			t.Errorf("RouteOrder(%s, %s) = %s, want %s", tt.asked, tt.layer, got, tt.want)
		}
	}
}

// TestKeypoolMetering: each key settles its tokens the way its provider's
// kind documents (keypool.Metering): OpenAI and Azure keep the admission
// charge; Anthropic, Bedrock and local servers settle to usage.
func TestKeypoolMetering(t *testing.T) {
	t.Parallel()
	c := parseRepoConfig(t)
	kc := c.KeypoolConfig()
	if len(kc.Keys) == 0 {
		t.Fatal("config.yaml has no keys")
	}
	// config.yaml's claude provider is of kind anthropic, openai of kind
	// openai.
	want := map[llm.Provider]keypool.Metering{llm.ProviderClaude: keypool.MeterUsage, llm.ProviderOpenAI: keypool.MeterAdmission}
	for _, k := range kc.Keys {
		if w, ok := want[k.Provider]; ok && k.Metering != w {
			t.Errorf("key %s (provider %s): metering %s, want %s", k.ID, k.Provider, k.Metering, w)
		}
	}
}

// TestKeypoolInputOutputLimits: itpm_limit and otpm_limit reach the key
// pool as the key's ITPM and OTPM; a key without them has none.
func TestKeypoolInputOutputLimits(t *testing.T) {
	t.Parallel()
	doc := strings.Replace(minimal, "tpm_limit: 1}", "tpm_limit: 96000, itpm_limit: 80000, otpm_limit: 16000}", 1) +
		"  - {id: k2, provider: claude, model_tier: sonnet, api_key: k, rpm_limit: 1, tpm_limit: 1}\n"
	c, err := config.Parse([]byte(doc), env(map[string]string{"K1": "k"}))
	if err != nil {
		t.Fatal(err)
	}
	kc := c.KeypoolConfig()
	if k := kc.Keys[0]; k.ITPM != 80000 || k.OTPM != 16000 || k.TPM != 96000 {
		t.Errorf("key %s: TPM %d, ITPM %d, OTPM %d; want 96000, 80000, 16000", k.ID, k.TPM, k.ITPM, k.OTPM)
	}
	if k := kc.Keys[1]; k.ITPM != 0 || k.OTPM != 0 {
		t.Errorf("key %s: ITPM %d, OTPM %d; want none", k.ID, k.ITPM, k.OTPM)
	}
}

// sync_timeout follows queue_max_wait and the providers' timeouts unless
// it is set.
func TestSyncTimeoutDefault(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		extra string
		want  time.Duration
	}{
		{"", 300*time.Second + 120*time.Second},
		{"queue: {queue_max_wait: 60s}", 60*time.Second + 120*time.Second},
		{"server: {admin_token: a, sync_timeout: 30s}", 30 * time.Second},
	} {
		doc := minimal
		if strings.HasPrefix(tt.extra, "server:") {
			doc = strings.Replace(doc, "server: {admin_token: a}", tt.extra, 1)
		} else {
			doc += tt.extra + "\n"
		}
		c, err := config.Parse([]byte(doc), env(map[string]string{"K1": "k"}))
		if err != nil {
			t.Fatalf("%q: %v", tt.extra, err)
		}
		if c.Server.SyncTimeout != tt.want || c.HTTPConfig().SyncTimeout != tt.want {
			t.Errorf("%q: sync_timeout %s, want %s", tt.extra, c.Server.SyncTimeout, tt.want)
		}
	}
}
