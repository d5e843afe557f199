package cache

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNormalise(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", ""},
		{"  \t\n ", ""},
		{"a  b\t\tc\r\nd", "a b c d"},
		{" Keep CASE: P0A80 ", "Keep CASE: P0A80"},
		{"全角\u3000空格", "全角 空格"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, Normalise(tt.in), "%q", tt.in)
		require.Equal(t, tt.want, Normalise(Normalise(tt.in)), "idempotent")
	}
}

func TestPromptHash(t *testing.T) {
	t.Parallel()
	require.Equal(t, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", PromptHash(""))
	require.Len(t, PromptHash("x"), 64)
	require.NotEqual(t, PromptHash("a"), PromptHash("A"))
}

func TestScope(t *testing.T) {
	t.Parallel()
	base := Key{Tenant: "t1", Tier: "claude/sonnet", Layer: "agent", ToolResultsHash: "h", CaseID: "c", Prompt: "p"}
	s := scope(base, base.Layer, true)
	require.Len(t, s, 32)

	same := base
	same.CaseID, same.Prompt = "other case", "other prompt"
	require.Equal(t, s, scope(same, same.Layer, true), "case id and prompt are not part of the scope")
	ws, nows := base, base
	ws.Context, nows.Context = " sys  prompt\n", "sys prompt"
	require.Equal(t, scope(ws, "agent", true), scope(nows, "agent", true), "context is normalised")

	for name, mut := range map[string]func(*Key){
		"tenant":  func(k *Key) { k.Tenant = "t2" },
		"tier":    func(k *Key) { k.Tier = "claude/haiku" },
		"layer":   func(k *Key) { k.Layer = "router" },
		"tools":   func(k *Key) { k.ToolResultsHash = "h2" },
		"context": func(k *Key) { k.Context = "You are a router." },
		"shifted": func(k *Key) { k.Tier, k.Layer = "claude/sonnetagent", "" },
	} {
		k := base
		mut(&k)
		require.NotEqual(t, s, scope(k, k.Layer, true), name)
	}
	other := base
	other.Tenant = "t2"
	require.Equal(t, scope(base, "agent", false), scope(other, "agent", false), "isolation off: tenant not in scope")
}

func TestIndexName(t *testing.T) {
	t.Parallel()
	require.Equal(t, "semantic_cache_hnsw_local_ngram_384", IndexName("local_ngram_384"))
	a, b := IndexName("local-ngram-384"), IndexName("local_ngram_384")
	require.NotEqual(t, a, b, "sanitising must not merge two names")
	require.True(t, strings.HasPrefix(a, "semantic_cache_hnsw_local_ngram_384_"))
	long := IndexName("openai-" + strings.Repeat("very-long-model-name-", 5) + "1536")
	require.LessOrEqual(t, len(long), 63)
	require.Regexp(t, `^[a-z0-9_]+$`, long)
	require.Regexp(t, `^[a-z0-9_]+$`, IndexName(`we'ird"; DROP TABLE x; --`))
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	c := Config{}.WithDefaults()
	require.NoError(t, c.Validate())
	require.Equal(t, 0.95, c.Threshold)
	require.Equal(t, TTLDefault(), c.TTL)
	require.True(t, *c.TenantIsolation)
	require.Equal(t, 40, c.EfSearch)
	require.Equal(t, 5000, c.MaxScanTuples)
	require.Equal(t, 500, c.SmallScopeRows)

	userTTL := map[string]time.Duration{"router": time.Hour}
	c = Config{TTL: userTTL}.WithDefaults()
	require.Equal(t, time.Hour, c.TTL["router"])
	require.Equal(t, 4*time.Hour, c.TTL["agent"], "layers not given keep their default")
	c.TTL["router"] = 0
	require.Equal(t, time.Hour, userTTL["router"], "the caller's map is not shared")

	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{Threshold: 1.5}, "Config.Threshold"},
		{Config{Threshold: -0.1}, "Config.Threshold"},
		{Config{TTL: map[string]time.Duration{"agent": -time.Second}}, `Config.TTL["agent"]`},
		{Config{DefaultLayer: "nope"}, "Config.DefaultLayer"},
		{Config{ProtectedPatterns: []string{"("}}, "Config.ProtectedPatterns[0]"},
		{Config{IgnoredPatterns: []string{"[", "x"}}, "Config.IgnoredPatterns[0]"},
		{Config{EfSearch: 1001}, "Config.EfSearch"},
		{Config{MaxScanTuples: -1}, "Config.MaxScanTuples"},
		{Config{Candidates: 101}, "Config.Candidates"},
		{Config{QueryTimeout: -time.Second}, "Config.QueryTimeout"},
		{Config{HitFlushInterval: -time.Second}, "Config.HitFlushInterval"},
		{Config{FailLogInterval: -time.Second}, "Config.FailLogInterval"},
	}
	for _, tt := range tests {
		require.ErrorContains(t, tt.cfg.WithDefaults().Validate(), tt.want)
	}
}
