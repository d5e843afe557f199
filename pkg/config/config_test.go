package config_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/config"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

var baseEnv = map[string]string{"BULWARK_ADMIN_TOKEN": "adm", "BULWARK_DEV_TOKEN": "dev",
	"CLAUDE_API_KEY_1": "ck1", "CLAUDE_API_KEY_2": "ck2", "OPENAI_API_KEY_PROJECT_A": "oka", "OPENAI_API_KEY_PROJECT_B": "okb"}

func TestRepoConfigLoads(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(b, env(baseEnv))
	if err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	if c.Queue.MaxConcurrentLLMCalls != 20 || c.Queue.Reserved[priority.Critical] != 5 || c.Queue.Reserved[priority.Low] != 1 {
		t.Errorf("queue defaults: %+v", c.Queue)
	}
	if c.Queue.MaxWait != 300*time.Second || c.Queue.MaxDepth != 200 {
		t.Errorf("queue wait/depth: %v %d", c.Queue.MaxWait, c.Queue.MaxDepth)
	}
	if c.Cache.TTL["router"] != 24*time.Hour || c.Cache.Threshold != 0.95 {
		t.Errorf("cache: %+v", c.Cache)
	}
	if fb, ok := c.FallbackOf(llm.Route{Provider: "claude", Tier: "sonnet"}); !ok || fb.String() != "openai/gpt4o" {
		t.Errorf("fallback of claude/sonnet = %v", fb)
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
		{"fallback same provider", strings.Replace(minimal, "tiers: {sonnet: m1}", "tiers: {sonnet: m1, haiku: m3}", 1) + "fallback: {claude/sonnet: claude/haiku}",
			map[string]string{"K1": secretVal}, "must fall back to the other provider"},
		{"unknown key", minimal + "bogus: 1", map[string]string{"K1": secretVal}, "field bogus not found"},
		{"reserves too big", minimal + "queue: {max_concurrent_llm_calls: 5}", map[string]string{"K1": secretVal}, "queue.reserved: reserves sum to 20"},
		{"bad priority", minimal + "queue: {reserved: {urgent: 1}}", map[string]string{"K1": secretVal}, "invalid priority"},
		{"no admin token", strings.Replace(minimal, "admin_token: a", "listen: x", 1), map[string]string{"K1": secretVal}, "server.admin_token: is required"},
		{"bad threshold", minimal + "cache: {threshold: 1.5}", map[string]string{"K1": secretVal}, "cache.threshold"},
		{"bad regexp", minimal + "cache: {protected_patterns: ['(']}", map[string]string{"K1": secretVal}, "cache.protected_patterns[0]"},
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
		// Limits across components name both fields.
		{"probe shorter than a call", minimal + "breaker: {probe_timeout: 60s}", map[string]string{"K1": secretVal},
			"breaker.probe_timeout: (1m0s) must exceed providers.claude.timeout (2m0s)"},
		{"probe default follows the longest call", strings.Replace(minimal, `tiers: {sonnet: m1}}`, `tiers: {sonnet: m1}, timeout: 150s}`, 1),
			map[string]string{"K1": secretVal}, ""},
		{"call longer than the task", strings.Replace(minimal, `tiers: {sonnet: m1}}`, `tiers: {sonnet: m1}, timeout: 8m}`, 1) +
			"breaker: {probe_timeout: 9m}", map[string]string{"K1": secretVal},
			"providers.claude.timeout: (8m0s) twice (route and fallback) plus worker.hold_wait (10s) must stay under the queue's task timeout (15m0s)"},
		{"call longer than the key lease", strings.Replace(minimal, `tiers: {sonnet: m1}}`, `tiers: {sonnet: m1}, timeout: 3m}`, 1),
			map[string]string{"K1": secretVal}, "providers.claude.timeout: plus worker.pace_wait (1s) must stay under the key lease (3m0s)"},
		// A component's own validation backs the file's rules up.
		{"embedder dims out of range", minimal + `cache: {embedder: {kind: openai, base_url: "http://127.0.0.1:2", model: m, dims: 99999}}`,
			map[string]string{"K1": secretVal}, "cache.embedder: embed: OpenAIConfig.Dims 99999"},
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
