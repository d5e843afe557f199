package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgvector/pgvector-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"bulwark/pkg/embed"
	"bulwark/pkg/job"
	"bulwark/pkg/testkit/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// bundle is what a stateful test works with.
type bundle struct {
	cache *Cache
	pool  *pgxpool.Pool
	emb   embed.Embedder
	logs  *testenv.LogBuffer
}

// newPool returns a pool on dsn built the way the application must build
// it: with AfterConnectWith.
func newPool(t testing.TB, dsn string, cfg Config) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	pc.AfterConnect = AfterConnectWith(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func setup(t testing.TB, cfg Config) *bundle {
	t.Helper()
	pool := newPool(t, testenv.Postgres(t), cfg)
	emb, err := embed.NewLocal(0)
	require.NoError(t, err)
	logs := &testenv.LogBuffer{}
	c, err := New(context.Background(), pool, emb, cfg, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	return &bundle{cache: c, pool: pool, emb: emb, logs: logs}
}

func cosine(a, b []float32) float64 {
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	return dot / math.Sqrt(na*nb)
}

func randomUnit(r *rand.Rand, dims int) []float32 {
	v := make([]float64, dims)
	var n float64
	for i := range v {
		v[i] = r.NormFloat64()
		n += v[i] * v[i]
	}
	out := make([]float32, dims)
	for i := range v {
		out[i] = float32(v[i] / math.Sqrt(n))
	}
	return out
}

// withCosine returns a unit vector whose cosine similarity to the unit
// vector u is s: s·u + sqrt(1-s²)·w, w a random unit vector orthogonal to u.
func withCosine(r *rand.Rand, u []float32, s float64) []float32 {
	w := randomUnit(r, len(u))
	var d float64
	for i := range u {
		d += float64(u[i]) * float64(w[i])
	}
	var n float64
	ww := make([]float64, len(u))
	for i := range u {
		ww[i] = float64(w[i]) - d*float64(u[i])
		n += ww[i] * ww[i]
	}
	n = math.Sqrt(n)
	out := make([]float32, len(u))
	for i := range u {
		out[i] = float32(s*float64(u[i]) + math.Sqrt(1-s*s)*ww[i]/n)
	}
	return out
}

const diagPrompt = `System: You are a vehicle diagnosis assistant for OTA campaigns. Answer with root cause, evidence and next step.
User: The OTA batch 2024-W45 failed on several cars. Vehicle VIN LSVAU2180N2183294, log captured 2024-11-03T08:15:22.123Z.
The BMS firmware update stopped at 63 percent; the ECU BMS reported DTC P0A80 (replace hybrid battery pack) and the gateway
logged a CAN timeout right after the flash session opened. The previous firmware was 4.2.1 and the campaign target is 4.3.0.
What is the likely root cause and which diagnostic step do you recommend for the service engineer?`

func vinTimeVariant(p string) string {
	return strings.NewReplacer(
		"LSVAU2180N2183294", "WDBRF61J43F123456",
		"2024-11-03T08:15:22.123Z", "2024-11-05T17:02:09.871Z",
	).Replace(p)
}

func key(prompt string) Key {
	return Key{Tenant: "t1", Tier: "claude/sonnet", Layer: LayerAgent, ToolResultsHash: "tools-1", CaseID: "case-1", Prompt: prompt}
}

var answer = json.RawMessage(`{"content":"Check the HV interlock loop before reflashing."}`)

func TestExactHit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))

	// Same prompt with different white space: the normalised prompt is
	// the same, so it is an exact hit, found without embedding anything.
	k := key("  " + strings.ReplaceAll(diagPrompt, " ", "   \n") + "\t")
	hit, err := b.cache.Lookup(ctx, k, nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, hit.Kind)
	require.Equal(t, 1.0, hit.Similarity)
	require.JSONEq(t, string(answer), string(hit.Response))
	require.NotZero(t, hit.ID)
	require.GreaterOrEqual(t, hit.Age, time.Duration(0))
	require.Less(t, hit.Age, time.Minute)

	// Layer "" is the default layer (agent): the same scope.
	k.Layer = ""
	hit, err = b.cache.Lookup(ctx, k, nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, hit.Kind)

	s := b.cache.Stats()
	require.Equal(t, int64(2), s.ExactHits)
	require.Equal(t, int64(1), s.Stores)

	// The row keeps the case id, tenant and layer.
	var caseID, tenant, layer string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT case_id, tenant, layer FROM semantic_cache WHERE id = $1", hit.ID).Scan(&caseID, &tenant, &layer))
	require.Equal(t, []string{"case-1", "t1", "agent"}, []string{caseID, tenant, layer})
}

// LookupExact finds the identical request's entry and nothing else: a
// near-duplicate that Lookup would answer semantically is a miss.
func TestLookupExactOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))
	hit, err := b.cache.LookupExact(ctx, key(diagPrompt))
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, hit.Kind)
	require.JSONEq(t, string(answer), string(hit.Response))

	variant := vinTimeVariant(diagPrompt)
	hit, err = b.cache.LookupExact(ctx, key(variant))
	require.NoError(t, err)
	require.Equal(t, job.CachedNone, hit.Kind)
	hit, err = b.cache.Lookup(ctx, key(variant), nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedSemantic, hit.Kind, "the variant is a semantic hit, so the exact miss above is the point")
}

func TestSemanticHitVINAndTimestamp(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))

	// Only the VIN and the timestamp (with fractional seconds) differ.
	variant := vinTimeVariant(diagPrompt)
	e1, err := b.cache.Embed(ctx, diagPrompt)
	require.NoError(t, err)
	e2, err := b.cache.Embed(ctx, variant)
	require.NoError(t, err)
	sim := cosine(e1, e2)
	require.GreaterOrEqual(t, sim, ThresholdDefault)

	hit, err := b.cache.Lookup(ctx, key(variant), e2)
	require.NoError(t, err)
	require.Equal(t, job.CachedSemantic, hit.Kind)
	require.InDelta(t, sim, hit.Similarity, 1e-4)
	require.JSONEq(t, string(answer), string(hit.Response))

	// nil embedding: Lookup embeds itself, same outcome.
	hit2, err := b.cache.Lookup(ctx, key(variant), nil)
	require.NoError(t, err)
	require.Equal(t, hit.ID, hit2.ID)
	require.Equal(t, job.CachedSemantic, hit2.Kind)
}

func TestThreshold(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	base := randomUnit(r, 384)
	require.NoError(t, b.cache.Store(ctx, key("stored prompt"), base, answer))

	tests := []struct {
		sim  float64
		want job.Cached
	}{
		{0.999, job.CachedSemantic},
		{0.96, job.CachedSemantic},
		{0.94, job.CachedNone},
		{0.5, job.CachedNone},
		{-0.9, job.CachedNone},
	}
	for _, tt := range tests {
		q := withCosine(r, base, tt.sim)
		hit, err := b.cache.Lookup(ctx, key("another prompt"), q)
		require.NoError(t, err)
		require.Equal(t, tt.want, hit.Kind, "similarity %v", tt.sim)
		if tt.want == job.CachedSemantic {
			require.InDelta(t, tt.sim, hit.Similarity, 1e-4)
		} else {
			require.Zero(t, hit.ID)
			require.Nil(t, hit.Response)
		}
	}
}

func TestScopesAreSeparate(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))
	near := vinTimeVariant(diagPrompt)

	others := map[string]Key{
		"tier":         {Tenant: "t1", Tier: "openai/gpt4o", Layer: LayerAgent, ToolResultsHash: "tools-1"},
		"layer":        {Tenant: "t1", Tier: "claude/sonnet", Layer: LayerRouter, ToolResultsHash: "tools-1"},
		"tool results": {Tenant: "t1", Tier: "claude/sonnet", Layer: LayerAgent, ToolResultsHash: "tools-2"},
		"tenant":       {Tenant: "t2", Tier: "claude/sonnet", Layer: LayerAgent, ToolResultsHash: "tools-1"},
	}
	for name, k := range others {
		require.NotEqual(t, b.cache.Scope(key("")), b.cache.Scope(k), name)
		for _, p := range []string{diagPrompt, near} {
			k.Prompt = p
			hit, err := b.cache.Lookup(ctx, k, nil)
			require.NoError(t, err)
			require.Equal(t, job.CachedNone, hit.Kind, "another %s must never hit", name)
		}
	}
	// The same near-duplicate in its own scope does hit.
	hit, err := b.cache.Lookup(ctx, key(near), nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedSemantic, hit.Kind)
}

func TestTenantIsolationOff(t *testing.T) {
	t.Parallel()
	off := false
	b := setup(t, Config{TenantIsolation: &off})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))
	k := key(diagPrompt)
	k.Tenant = "t2"
	hit, err := b.cache.Lookup(ctx, k, nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, hit.Kind, "isolation off: tenants share answers")
}

func TestExpiredNeverHits(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))
	_, err := b.pool.Exec(ctx, "UPDATE semantic_cache SET expires_at = now() - interval '1 millisecond'")
	require.NoError(t, err)
	for _, p := range []string{diagPrompt, vinTimeVariant(diagPrompt)} {
		hit, err := b.cache.Lookup(ctx, key(p), nil)
		require.NoError(t, err)
		require.Equal(t, job.CachedNone, hit.Kind)
	}
	// Storing again replaces the expired row (same scope and prompt hash).
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))
	hit, err := b.cache.Lookup(ctx, key(diagPrompt), nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, hit.Kind)
}

func TestTTLByLayer(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{TTL: map[string]time.Duration{LayerSynthesizer: 90 * time.Minute}})
	ctx := context.Background()
	for _, layer := range []string{LayerRouter, LayerAgent, LayerSynthesizer} {
		k := key(diagPrompt)
		k.Layer = layer
		require.NoError(t, b.cache.Store(ctx, k, nil, answer))
	}
	rows, err := b.pool.Query(ctx, "SELECT layer, extract(epoch FROM expires_at - created_at) FROM semantic_cache")
	require.NoError(t, err)
	got := map[string]time.Duration{}
	for rows.Next() {
		var layer string
		var s float64
		require.NoError(t, rows.Scan(&layer, &s))
		got[layer] = time.Duration(math.Round(s/60)) * time.Minute
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]time.Duration{LayerRouter: 24 * time.Hour, LayerAgent: 4 * time.Hour, LayerSynthesizer: 90 * time.Minute}, got)

	k := key(diagPrompt)
	k.Layer = "nope"
	require.ErrorContains(t, b.cache.Store(ctx, k, nil, answer), "Key.Layer")
	_, err = b.cache.Lookup(ctx, k, nil)
	require.ErrorContains(t, err, "Key.Layer")
	require.False(t, errors.Is(err, ErrUnavailable))
}

func TestDTCGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))

	other := strings.Replace(diagPrompt, "P0A80", "P0A81", 1)
	e1, err := b.cache.Embed(ctx, diagPrompt)
	require.NoError(t, err)
	e2, err := b.cache.Embed(ctx, other)
	require.NoError(t, err)
	require.Greater(t, cosine(e1, e2), 0.99, "the embedder alone cannot tell the codes apart")

	for _, emb := range [][]float32{e2, nil} {
		hit, err := b.cache.Lookup(ctx, key(other), emb)
		require.NoError(t, err)
		require.Equal(t, job.CachedNone, hit.Kind, "a different DTC must never hit")
	}
	// The lookup filters on the entities in SQL, so the other DTC's row is
	// never even a candidate for the guard's re-check.
	require.Equal(t, int64(0), b.cache.Stats().GuardRejected)

	// Also with constructed vectors of similarity 0.999.
	r := rand.New(rand.NewPCG(3, 4))
	u := randomUnit(r, 384)
	k1, k2 := key("engine light on, code U0100, what next?"), key("engine light on, code U0101, what next?")
	require.NoError(t, b.cache.Store(ctx, k1, u, answer))
	hit, err := b.cache.Lookup(ctx, k2, withCosine(r, u, 0.999))
	require.NoError(t, err)
	require.Equal(t, job.CachedNone, hit.Kind)
}

func TestGuardTakesBestPassingCandidate(t *testing.T) {
	t.Parallel()
	// Both paths: the exact scan returns every candidate at once; the
	// index path (here priced as the planner likes on a tiny table, but
	// with the index branch's LIMIT 1) needs the second round.
	for name, small := range map[string]int{"scan": 0, "index branch": -1} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testGuardTakesBestPassingCandidate(t, Config{SmallScopeRows: small})
		})
	}
}

func testGuardTakesBestPassingCandidate(t *testing.T, cfg Config) {
	b := setup(t, cfg)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(5, 6))
	q := randomUnit(r, 384)
	wrong, right := key("battery fault P0A81 after OTA"), key("battery fault P0A80 after the OTA")
	require.NoError(t, b.cache.Store(ctx, wrong, withCosine(r, q, 0.995), json.RawMessage(`"wrong"`)))
	require.NoError(t, b.cache.Store(ctx, right, withCosine(r, q, 0.97), json.RawMessage(`"right"`)))

	hit, err := b.cache.Lookup(ctx, key("battery fault P0A80 after OTA"), q)
	require.NoError(t, err)
	require.Equal(t, job.CachedSemantic, hit.Kind)
	require.JSONEq(t, `"right"`, string(hit.Response))
	require.InDelta(t, 0.97, hit.Similarity, 1e-4)
	// The closer row with the other code is filtered out in SQL.
	require.Equal(t, int64(0), b.cache.Stats().GuardRejected)
}

func TestInvalidateCase(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	k1, k2, k3 := key(diagPrompt), key("Why does the telematics unit reboot after the update?"), key("Summarise the campaign status.")
	k3.CaseID = "case-2"
	for _, k := range []Key{k1, k2, k3} {
		require.NoError(t, b.cache.Store(ctx, k, nil, answer))
	}
	// Another tenant's rows of the same case id are not touched.
	k4 := k1
	k4.Tenant = "t2"
	require.NoError(t, b.cache.Store(ctx, k4, nil, answer))

	n, err := b.cache.InvalidateCase(ctx, "t1", "case-1")
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	for _, p := range []string{k1.Prompt, vinTimeVariant(k1.Prompt), k2.Prompt} {
		hit, err := b.cache.Lookup(ctx, key(p), nil)
		require.NoError(t, err)
		require.Equal(t, job.CachedNone, hit.Kind, "no stale hit after case invalidation")
	}
	for _, k := range []Key{k3, k4} {
		hit, err := b.cache.Lookup(ctx, k, nil)
		require.NoError(t, err)
		require.Equal(t, job.CachedExact, hit.Kind)
	}
	// Tenant "" is any tenant.
	n, err = b.cache.InvalidateCase(ctx, "", "case-1")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	_, err = b.cache.InvalidateCase(ctx, "t1", "")
	require.Error(t, err)
}

func TestInvalidateNamespace(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	var keys []Key
	for _, tenant := range []string{"t1", "t2"} {
		for _, layer := range []string{LayerRouter, LayerAgent} {
			k := key(diagPrompt)
			k.Tenant, k.Layer = tenant, layer
			require.NoError(t, b.cache.Store(ctx, k, nil, answer))
			keys = append(keys, k)
		}
	}
	live := func() (n int) {
		for _, k := range keys {
			k.Prompt = vinTimeVariant(diagPrompt) // semantic path too
			hit, err := b.cache.Lookup(ctx, k, nil)
			require.NoError(t, err)
			if hit.Kind != job.CachedNone {
				n++
			}
		}
		return n
	}
	require.Equal(t, 4, live())

	n, err := b.cache.InvalidateNamespace(ctx, "t1", LayerAgent)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, 3, live())

	n, err = b.cache.InvalidateNamespace(ctx, "", LayerRouter)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	require.Equal(t, 1, live())

	n, err = b.cache.InvalidateNamespace(ctx, "", "")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, 0, live())
}

func TestPurgeExpired(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	for _, p := range []string{"a prompt", "b prompt", "c prompt"} {
		require.NoError(t, b.cache.Store(ctx, key(p), nil, answer))
	}
	_, err := b.pool.Exec(ctx, "UPDATE semantic_cache SET expires_at = now() - interval '1 second' WHERE prompt <> 'c prompt'")
	require.NoError(t, err)
	n, err := b.cache.PurgeExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	var left []string
	rows, err := b.pool.Query(ctx, "SELECT prompt FROM semantic_cache")
	require.NoError(t, err)
	for rows.Next() {
		var p string
		require.NoError(t, rows.Scan(&p))
		left = append(left, p)
	}
	require.Equal(t, []string{"c prompt"}, left)
	for _, p := range []string{"a prompt", "b prompt"} {
		hit, err := b.cache.Lookup(ctx, key(p), nil)
		require.NoError(t, err)
		require.Equal(t, job.CachedNone, hit.Kind)
	}
	n, err = b.cache.PurgeExpired(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestHitCounts(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))
	before := time.Now()
	var id int64
	for _, p := range []string{diagPrompt, diagPrompt, vinTimeVariant(diagPrompt)} {
		hit, err := b.cache.Lookup(ctx, key(p), nil)
		require.NoError(t, err)
		require.NotEqual(t, job.CachedNone, hit.Kind)
		id = hit.ID
	}
	after := time.Now()

	count := func() (n int64, last *time.Time) {
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT hit_count, last_hit_at FROM semantic_cache WHERE id = $1", id).Scan(&n, &last))
		return n, last
	}
	n, last := count()
	require.Zero(t, n, "written in the background, not per hit")
	require.Nil(t, last)

	require.NoError(t, b.cache.FlushHits(ctx))
	n, last = count()
	require.Equal(t, int64(3), n)
	require.NotNil(t, last)
	require.WithinRange(t, *last, before.Add(-time.Millisecond), after.Add(time.Millisecond))

	// The background writer: Start, hit, Stop writes what is pending.
	require.NoError(t, b.cache.Start(ctx))
	require.NoError(t, b.cache.Start(ctx), "second Start is a no-op")
	_, err := b.cache.Lookup(ctx, key(diagPrompt), nil)
	require.NoError(t, err)
	b.cache.Stop()
	b.cache.Stop()
	n, _ = count()
	require.Equal(t, int64(4), n)
	require.Equal(t, int64(2), b.cache.Stats().HitCountWrites)
}

func TestHitFlusherRuns(t *testing.T) {
	t.Parallel()
	// A flush that fails drops its batch (the counts are statistics): a
	// loaded CI machine's slow UPDATE must not pass the query timeout.
	b := setup(t, Config{HitFlushInterval: 10 * time.Millisecond, QueryTimeout: 5 * time.Second})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))
	require.NoError(t, b.cache.Start(ctx))
	hit, err := b.cache.Lookup(ctx, key(diagPrompt), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int64
		return b.pool.QueryRow(ctx, "SELECT hit_count FROM semantic_cache WHERE id = $1", hit.ID).Scan(&n) == nil && n == 1
	}, 15*time.Second, 5*time.Millisecond)
}

// proxy forwards TCP to PostgreSQL until Close, which cuts every connection
// and leaves the port closed: an outage as the pool sees it.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(s, c); s.Close() }()
		go func() { defer p.wg.Done(); io.Copy(c, s); c.Close() }()
	}
}

func (p *proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func TestFailOpen(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	px := newProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(px.ln.Addr().(*net.TCPAddr).Port)
	cfg.AfterConnect = AfterConnect
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	emb, _ := embed.NewLocal(0)
	logs := &testenv.LogBuffer{}
	c, err := New(context.Background(), pool, emb, Config{FailLogInterval: time.Hour}, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, c.Store(ctx, key(diagPrompt), nil, answer))
	hit, err := c.Lookup(ctx, key(diagPrompt), nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, hit.Kind)

	px.Close() // PostgreSQL gone: live connections cut, port closed

	for range 3 {
		hit, err := c.Lookup(ctx, key(diagPrompt), nil)
		require.ErrorIs(t, err, ErrUnavailable)
		require.Equal(t, Hit{Kind: job.CachedNone}, hit)
	}
	require.ErrorIs(t, c.Store(ctx, key(diagPrompt), nil, answer), ErrUnavailable)
	require.ErrorIs(t, c.FlushHits(ctx), ErrUnavailable, "the hit before the outage cannot be written")

	s := c.Stats()
	require.Equal(t, int64(5), s.Errors)
	require.Equal(t, int64(1), s.HitCountsLost)
	require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), "one warning per FailLogInterval:\n%s", logs.String())

	// New against the dead server fails with ErrUnavailable too.
	_, err = New(ctx, pool, emb, Config{}, slog.New(slog.DiscardHandler))
	require.ErrorIs(t, err, ErrUnavailable)

	// A cancelled caller is not an outage: not counted.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = c.Lookup(cctx, key(diagPrompt), nil)
	require.Error(t, err)
	require.Equal(t, int64(5), c.Stats().Errors)
}

func TestFailLogLimiter(t *testing.T) {
	t.Parallel()
	logs := &testenv.LogBuffer{}
	c := &Cache{cfg: Config{FailLogInterval: time.Nanosecond}.WithDefaults(), logger: slog.New(slog.NewTextHandler(logs, nil))}
	for range 3 {
		c.fail(context.Background(), errors.New("boom"))
	}
	require.Equal(t, 3, strings.Count(logs.String(), "level=WARN"))
	require.Equal(t, int64(3), c.Stats().Errors)
}

func TestNewRefusesPoolWithoutAfterConnect(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testenv.Postgres(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	emb, _ := embed.NewLocal(0)
	_, err = New(context.Background(), pool, emb, Config{}, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "AfterConnect")
}

func TestIndexIsUsable(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{SmallScopeRows: -1})
	ctx := context.Background()

	var def string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT indexdef FROM pg_indexes WHERE indexname = $1", IndexName(b.emb.Name())).Scan(&def))
	require.Contains(t, def, fmt.Sprintf("USING hnsw (((embedding)::vector(384)) vector_cosine_ops) WITH (m='%d', ef_construction='%d') WHERE (embedder = 'local-ngram-384'::text)",
		IndexMDefault, IndexEfConstructionDefault))

	// New is idempotent, also for a second embedder with its own index.
	emb2, _ := embed.NewLocal(64)
	for _, e := range []embed.Embedder{b.emb, emb2} {
		_, err := New(ctx, b.pool, e, Config{}, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE indexname LIKE 'semantic_cache_hnsw_%'").Scan(&n))
	require.Equal(t, 2, n)
	require.NotContains(t, b.logs.String(), "other parameters")

	// Other build parameters do not rebuild the index behind the
	// operator's back: Prepare says how, and the statements it gives work.
	logs := &testenv.LogBuffer{}
	_, err := New(ctx, b.pool, b.emb, Config{IndexM: 8, IndexEfConstruction: 32}, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	require.Contains(t, logs.String(), "other parameters than configured")
	_, rebuild, ok := strings.Cut(logs.String(), "rebuild=\"")
	require.True(t, ok, logs.String())
	rebuild, _, _ = strings.Cut(rebuild, "\"\n")
	for stmt := range strings.SplitSeq(strings.ReplaceAll(rebuild, `\"`, `"`), "; ") {
		_, err := b.pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	logs = &testenv.LogBuffer{}
	_, err = New(ctx, b.pool, b.emb, Config{IndexM: 8, IndexEfConstruction: 32}, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	require.NotContains(t, logs.String(), "other parameters", "after the rebuild")

	// The search's expression and predicate match the index: with other
	// plans priced out, the planner picks it.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off")
	require.NoError(t, err)
	q := make([]float32, 384)
	q[0] = 1
	rows, err := tx.Query(ctx, "EXPLAIN "+b.cache.sqlSearch[0], pgvector.NewVector(q), "scope", 0.95, "")
	require.NoError(t, err)
	var plan strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	require.Contains(t, plan.String(), "Index Scan using "+IndexName(b.emb.Name()), plan.String())
}

func TestEmbeddingChecks(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	_, err := b.cache.Lookup(ctx, key("x"), make([]float32, 3))
	require.ErrorContains(t, err, "3 dimensions")
	require.ErrorContains(t, b.cache.Store(ctx, key("x"), []float32{float32(math.NaN())}, answer), "dimensions")
	require.ErrorContains(t, b.cache.Store(ctx, key("x"), nil, json.RawMessage(`{`)), "JSON")
	// The zero vector (the local embedder's vector of blank text) matches
	// nothing, but exact hits still work.
	require.NoError(t, b.cache.Store(ctx, key(" "), nil, answer))
	hit, err := b.cache.Lookup(ctx, key(""), nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, hit.Kind)
	hit, err = b.cache.Lookup(ctx, key("\t"), make([]float32, 384))
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, hit.Kind)
	hit, err = b.cache.Lookup(ctx, key("blank-ish"), make([]float32, 384))
	require.NoError(t, err)
	require.Equal(t, job.CachedNone, hit.Kind)
}

func TestConcurrentLookups(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(diagPrompt), nil, answer))
	require.NoError(t, b.cache.Start(ctx))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				hit, err := b.cache.Lookup(ctx, key(vinTimeVariant(diagPrompt)), nil)
				if err != nil || hit.Kind != job.CachedSemantic {
					t.Errorf("lookup: %v %v", hit.Kind, err)
				}
			}
		})
	}
	wg.Wait()
	b.cache.Stop()
	var n int64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT hit_count FROM semantic_cache").Scan(&n))
	require.Equal(t, int64(80), n)
}

func TestContextSeparatesSystemPrompts(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	system := strings.Repeat("You are a vehicle diagnosis assistant for OTA firmware campaigns. Answer with root cause, evidence and next step. ", 6)
	q1 := "Why did the BMS update stop at 63 percent on this car?"
	q2 := "How do I reset the infotainment head unit after a failed flash?"

	// The pitfall Key.Context avoids: inside Prompt, the shared system
	// prompt makes unrelated questions look alike.
	e1, err := b.cache.Embed(ctx, system+q1)
	require.NoError(t, err)
	e2, err := b.cache.Embed(ctx, system+q2)
	require.NoError(t, err)
	require.Greater(t, cosine(e1, e2), ThresholdDefault)

	k1, k2 := key(q1), key(q2)
	k1.Context, k2.Context = system, system
	require.NoError(t, b.cache.Store(ctx, k1, nil, answer))
	hit, err := b.cache.Lookup(ctx, k2, nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedNone, hit.Kind)
	hit, err = b.cache.Lookup(ctx, k1, nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, hit.Kind)
	k1.Context = "You are the synthesizer."
	hit, err = b.cache.Lookup(ctx, k1, nil)
	require.NoError(t, err)
	require.Equal(t, job.CachedNone, hit.Kind, "another system prompt is another scope")
}
