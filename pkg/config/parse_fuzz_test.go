package config_test

import (
	"encoding/hex"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"bulwark/pkg/config"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

// fuzzSecret is the value of every ${SECRET_...} variable: no error may
// quote it.
const fuzzSecret = "sk-fuzz-Zq9x"

// fuzzLookup sets the variables named SECRET_... and no other, so that
// ${VAR:-default} takes its default.
func fuzzLookup(name string) (string, bool) {
	if strings.HasPrefix(name, "SECRET_") {
		return fuzzSecret + "-" + name, true
	}
	return "", false
}

// secretKeys are the configuration keys whose values are secret.String.
var secretKeys = map[string]bool{"admin_token": true, "password": true, "dsn": true, "api_key": true, "token": true,
	"url": true, "secret": true}

// FuzzParse fuzzes config.Parse, the decoder of config.yaml. Parse must
// return an error or a configuration that holds its own rules: defaults
// applied, every limit, count and duration positive, thresholds and prices
// real numbers in range, every key and fallback on a configured route,
// tenant tokens kept only as 64-hex-digit hashes, and one that parses
// again, unchanged, from its own YAML. No error may quote a secret that
// came from the environment into a secret field. The inputs it found
// (negative limits, NaN, a token_sha256 that is not hex) stay as seeds in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	repo, err := os.ReadFile("../../config.yaml")
	if err != nil {
		f.Fatal(err)
	}
	// The repository's file, with its required variables made secrets.
	required := regexp.MustCompile(`\$\{([A-Z0-9_]+)\}`)
	f.Add(required.ReplaceAllString(string(repo), "$${SECRET_$1}"))
	const small = `
server: {admin_token: "${SECRET_ADMIN}"}
postgres: {dsn: "${SECRET_DSN}"}
providers:
  claude: {base_url: "http://127.0.0.1:1", tiers: {sonnet: m1}}
  openai: {base_url: "https://api.example.test", tiers: {gpt4o: m2}}
keys:
  - {id: k1, provider: claude, model_tier: sonnet, api_key: "${SECRET_K1}", rpm_limit: 1, tpm_limit: 1}
`
	for _, s := range []string{
		"",
		small,
		small + "fallback: {claude/sonnet: openai/gpt4o}\nmodels: {gpt-4o: openai/gpt4o}\n",
		small + "tenants: [{name: t, token: \"${SECRET_T}\", max_priority: critical, default_priority: low}]\n",
		small + "tenants: [{name: t, token_sha256: " + strings.Repeat("ab", 32) + "}]\n",
		small + "queue: {reserved: {critical: 1, P2: 1}, weights: {1: 2}, queue_max_wait: 5m}\n",
		small + "cache: {threshold: 0.5, ttl: {agent: 1h}, protected_patterns: ['P[0-9]{4}']}\n",
		small + "alerts: {generic: [{url: \"${SECRET_HOOK}\"}]}\n",
		small + "report: {at: \"25:00\", timezone: Mars/Olympus}\n",
		small + "bogus: 1\n",
		strings.Replace(small, `"${SECRET_K1}"`, `"${SECRET_K1"`, 1),
		strings.Replace(small, `"${SECRET_K1}"`, `"${1BAD}"`, 1),
		strings.Replace(small, "rpm_limit: 1", "rpm_limit: ${SECRET_RPM}", 1),
		"a: &x [*x]\n",
		"server: [1, 2]\n",
		"- 1\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := config.Parse([]byte(doc), fuzzLookup)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned a configuration and an error: %v", err)
			}
			if strings.Contains(err.Error(), fuzzSecret) && secretsOnlyInSecretFields(doc) {
				t.Fatalf("the error quotes a secret: %v", err)
			}
			return
		}
		checkConfig(t, c)
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshal the parsed configuration: %v", err)
		}
		// Secrets marshal as "[redacted]", which a webhook URL may not be;
		// a "$" would expand again.
		if len(c.Alerts.WeCom)+len(c.Alerts.DingTalk)+len(c.Alerts.Generic) > 0 || strings.Contains(string(out), "$") {
			return
		}
		c2, err := config.Parse(out, fuzzLookup)
		if err != nil {
			t.Fatalf("the parsed configuration does not parse again: %v\n%s", err, out)
		}
		out2, err := yaml.Marshal(c2)
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != string(out2) {
			t.Fatalf("parsing its own YAML changed the configuration:\n%s\n---\n%s", out, out2)
		}
	})
}

// checkConfig checks the rules every parsed configuration holds.
func checkConfig(t *testing.T, c *config.Config) {
	t.Helper()
	s, q, ca := c.Server, c.Queue, c.Cache
	if s.MaxBodyBytes <= 0 || s.MaxPromptChars <= 0 || s.MaxTokensLimit < 0 || s.DefaultMaxTokens <= 0 ||
		(s.MaxTokensLimit > 0 && s.DefaultMaxTokens > s.MaxTokensLimit) || s.MaxHeaderBytes <= 0 {
		t.Fatalf("server limits not positive: %+v", s)
	}
	for _, r := range c.Routes() {
		if c.OutputLimit(r) <= 0 {
			t.Fatalf("route %s has max_output_tokens %d", r, c.OutputLimit(r))
		}
	}
	for name, d := range map[string]time.Duration{"server.sync_timeout": s.SyncTimeout, "server.result_ttl": s.ResultTTL,
		"server.read_header_timeout": s.ReadHeaderTimeout, "server.read_timeout": s.ReadTimeout,
		"server.write_timeout": s.WriteTimeout, "server.stream_max_lifetime": s.StreamMaxLifetime,
		"worker.task_check_interval": c.Worker.TaskCheckInterval, "worker.delayed_task_check_interval": c.Worker.DelayedTaskCheckInterval,
		"queue.slot_lease": q.SlotLease, "queue.queue_max_wait": q.MaxWait} {
		if d <= 0 {
			t.Fatalf("%s = %s accepted; it must be positive", name, d)
		}
	}
	if q.MaxConcurrentLLMCalls <= 0 || q.MaxDepth <= 0 || c.Worker.Concurrency <= 0 || c.Worker.MaxAttempts <= 0 {
		t.Fatalf("queue or worker limits not positive: %+v %+v", q, c.Worker)
	}
	for r, p := range c.Prices {
		if !(p.Input >= 0 && p.Output >= 0) || math.IsInf(p.Input, 0) || math.IsInf(p.Output, 0) {
			t.Fatalf("prices.%s = %+v accepted", r, p)
		}
	}
	if ca.Enabled == nil || ca.TenantIsolation == nil {
		t.Fatal("cache.enabled or cache.tenant_isolation without its default")
	}
	if !(ca.Threshold > 0 && ca.Threshold <= 1) {
		t.Fatalf("cache.threshold = %v accepted; it must be in (0, 1]", ca.Threshold)
	}
	if _, ok := ca.TTL[ca.DefaultLayer]; !ok {
		t.Fatalf("cache.default_layer %q has no ttl", ca.DefaultLayer)
	}
	routes := map[llm.Route]bool{}
	for _, r := range c.Routes() {
		if !r.Provider.Valid() || r.Tier == "" || c.ModelName(r) == "" {
			t.Fatalf("route %v: provider or model missing", r)
		}
		routes[r] = true
	}
	if len(routes) == 0 || len(c.Keys) == 0 {
		t.Fatal("no route or no key")
	}
	for i, k := range c.Keys {
		if !routes[llm.Route{Provider: k.Provider, Tier: k.ModelTier}] || k.RPMLimit < 0 || k.TPMLimit < 0 {
			t.Fatalf("keys[%d] %q: unusable", i, k.ID)
		}
	}
	for r := range routes {
		order := c.RouteOrder(r, "")
		seen := map[llm.Route]bool{}
		for _, to := range order {
			if !routes[to] || seen[to] {
				t.Fatalf("%v tries %v", r, order)
			}
			seen[to] = true
		}
	}
	for name, to := range c.Models {
		if r, err := config.ParseRoute(to); err != nil || !routes[r] {
			t.Fatalf("models.%s maps to %q", name, to)
		}
	}
	for _, p := range priority.All {
		if q.Reserved[p] < 0 || q.Weights[p] <= 0 {
			t.Fatalf("queue: priority %v reserved %d, weight %d", p, q.Reserved[p], q.Weights[p])
		}
	}
	names := map[string]bool{}
	for i, tn := range c.Tenants {
		if _, err := hex.DecodeString(tn.TokenSHA256); !tn.Token.IsZero() || len(tn.TokenSHA256) != 64 || err != nil {
			t.Fatalf("tenants[%d]: token kept in clear, or hash %q", i, tn.TokenSHA256)
		}
		if !tn.DefaultPriority.Valid() || !tn.MaxPriority.Valid() || tn.DefaultPriority < tn.MaxPriority {
			t.Fatalf("tenants[%d]: priorities default %v, max %v", i, tn.DefaultPriority, tn.MaxPriority)
		}
		if tn.Name == "" || strings.Contains(tn.Name, ":") || names[tn.Name] {
			t.Fatalf("tenants[%d]: name %q", i, tn.Name)
		}
		names[tn.Name] = true
	}
}

// secretsOnlyInSecretFields reports whether every ${...} of doc is the whole
// value of a secret field, and doc holds no secret in clear. Otherwise a
// secret may legitimately show in an error (it went into a public field).
func secretsOnlyInSecretFields(doc string) bool {
	if strings.Contains(doc, fuzzSecret) {
		return false
	}
	var root yaml.Node
	if yaml.Unmarshal([]byte(doc), &root) != nil {
		return !strings.Contains(doc, "${")
	}
	ok := true
	var walk func(n *yaml.Node, secretParent bool)
	walk = func(n *yaml.Node, secretParent bool) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if strings.Contains(k.Value, "${") {
					ok = false
				}
				walk(v, k.Kind == yaml.ScalarNode && secretKeys[k.Value])
			}
		case yaml.ScalarNode:
			if strings.Contains(n.Value, "${") && !secretParent {
				ok = false
			}
		default:
			for _, c := range n.Content {
				walk(c, false)
			}
		}
	}
	walk(&root, false)
	return ok
}
