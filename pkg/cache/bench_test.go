package cache

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgvector/pgvector-go"
	"github.com/stretchr/testify/require"

	"bulwark/pkg/embed"
	"bulwark/pkg/testenv"
)

// Benchmark data: benchScopes scopes of equal size, one row in ten
// expired, as in DESIGN.md's measurements. Prompt embeddings cluster by
// topic, so rows are drawn around benchTopics random topic centres per
// scope (cosine 0.85 to their centre, about 0.72 between two rows of a
// topic); uniformly random vectors, the other common choice, have no near
// neighbours at all and are the worst case of HNSW.
const (
	benchScopes  = 50
	benchTopics  = 20
	benchDims    = 384
	benchQueries = 1000
)

type benchRow struct {
	id      int64
	scope   int
	vec     []float32
	expired bool
}

type benchData struct {
	pool   *pgxpool.Pool
	emb    embed.Embedder
	rows   []benchRow
	byScop [][]int     // scope -> indexes into rows of live rows
	topics [][]float32 // scope*benchTopics+topic -> centre
}

func benchKey(scopeIdx int, prompt string) Key {
	return Key{Tenant: "bench", Tier: "claude/sonnet", Layer: LayerAgent, ToolResultsHash: "tools-" + strconv.Itoa(scopeIdx), Prompt: prompt}
}

// loadBench creates a database with n rows loaded by COPY and the HNSW
// index built after the load (a bulk build is far faster than n inserts).
func loadBench(b *testing.B, n int) *benchData {
	b.Helper()
	ctx := context.Background()
	pool := newPool(b, testenv.Postgres(b), Config{})
	emb, err := embed.NewLocal(benchDims)
	require.NoError(b, err)
	r := rand.New(rand.NewPCG(uint64(n), 42))
	d := &benchData{pool: pool, emb: emb, byScop: make([][]int, benchScopes)}
	scopes := make([]string, benchScopes)
	for s := range scopes {
		scopes[s] = scope(benchKey(s, ""), LayerAgent, true)
	}
	d.topics = make([][]float32, benchScopes*benchTopics)
	for t := range d.topics {
		d.topics[t] = randomUnit(r, benchDims)
	}
	now := time.Now()
	src := make([][]any, n)
	for i := range n {
		s := i % benchScopes
		row := benchRow{scope: s, vec: withCosine(r, d.topics[s*benchTopics+r.IntN(benchTopics)], 0.85), expired: r.IntN(10) == 0}
		exp := now.Add(4 * time.Hour)
		if row.expired {
			exp = now.Add(-time.Hour)
		}
		prompt := fmt.Sprintf("bench prompt %d", i)
		src[i] = []any{scopes[row.scope], PromptHash(prompt), emb.Name(), pgvector.NewVector(row.vec), "bench", LayerAgent, prompt,
			[]byte(fmt.Sprintf(`{"i":%d}`, i)), exp}
		d.rows = append(d.rows, row)
	}
	start := time.Now()
	_, err = pool.CopyFrom(ctx, pgx.Identifier{"semantic_cache"},
		[]string{"scope", "prompt_hash", "embedder", "embedding", "tenant", "layer", "prompt", "response", "expires_at"},
		pgx.CopyFromRows(src))
	require.NoError(b, err)
	b.Logf("COPY %d rows: %s", n, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	conn, err := pool.Acquire(ctx)
	require.NoError(b, err)
	_, err = conn.Exec(ctx, "SET maintenance_work_mem = '1GB'")
	require.NoError(b, err)
	_, err = conn.Exec(ctx, createIndexSQL(emb))
	require.NoError(b, err)
	_, err = conn.Exec(ctx, "VACUUM ANALYZE semantic_cache")
	require.NoError(b, err)
	conn.Release()
	b.Logf("HNSW build + vacuum: %s", time.Since(start).Round(time.Millisecond))

	ids, err := pool.Query(ctx, "SELECT id, prompt FROM semantic_cache")
	require.NoError(b, err)
	var (
		id     int64
		prompt string
	)
	_, err = pgx.ForEachRow(ids, []any{&id, &prompt}, func() error {
		i, err := strconv.Atoi(prompt[len("bench prompt "):])
		d.rows[i].id = id
		return err
	})
	require.NoError(b, err)
	for i, row := range d.rows {
		if !row.expired {
			d.byScop[row.scope] = append(d.byScop[row.scope], i)
		}
	}
	return d
}

// bruteForce returns the id of the live row of scope s nearest to q.
func (d *benchData) bruteForce(s int, q []float32) int64 {
	best, bestSim := int64(0), -2.0
	for _, i := range d.byScop[s] {
		if sim := cosine(q, d.rows[i].vec); sim > bestSim {
			best, bestSim = d.rows[i].id, sim
		}
	}
	return best
}

type benchQuery struct {
	key  Key
	vec  []float32
	want int64 // brute-force nearest live row
}

// queries returns benchQueries queries: near-duplicates (cosine 0.97) of
// random live rows when near, else new questions on a known topic (cosine
// 0.85 to a topic centre, like the rows: about 0.72 to the topic's rows,
// so they miss, but have a well-defined nearest row).
func (d *benchData) queries(near bool, seed uint64) []benchQuery {
	r := rand.New(rand.NewPCG(seed, 7))
	qs := make([]benchQuery, benchQueries)
	for i := range qs {
		s := r.IntN(benchScopes)
		var v []float32
		if near {
			src := d.rows[d.byScop[s][r.IntN(len(d.byScop[s]))]]
			v = withCosine(r, src.vec, 0.97)
		} else {
			v = withCosine(r, d.topics[s*benchTopics+r.IntN(benchTopics)], 0.85)
		}
		qs[i] = benchQuery{key: benchKey(s, fmt.Sprintf("query %d", i)), vec: v, want: d.bruteForce(s, v)}
	}
	return qs
}

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// BenchmarkLookup measures Lookup latency (p50/p99 per call) for exact and
// semantic hits and the recall@1 of the semantic search against brute
// force over the same live rows, at 10,000 rows across 50 scopes, and at
// 100,000 with BULWARK_BENCH_LARGE=1. Paths: auto (the default: exact scan
// below SmallScopeRows live rows, HNSW above), hnsw (always the index) and
// scan (always exact).
func BenchmarkLookup(b *testing.B) {
	sizes := []int{10_000}
	if os.Getenv("BULWARK_BENCH_LARGE") == "1" {
		sizes = append(sizes, 100_000)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			d := loadBench(b, n)
			ctx := context.Background()
			logger := slog.New(slog.DiscardHandler)
			caches := map[string]*Cache{}
			for name, small := range map[string]int{"auto": 0, "hnsw": -1, "scan": 1 << 30} {
				c, err := New(ctx, d.pool, d.emb, Config{SmallScopeRows: small}, logger)
				require.NoError(b, err)
				caches[name] = c
			}
			near, topic := d.queries(true, 1), d.queries(false, 2)
			// Warm the buffer cache the way a running service is warm.
			for _, q := range append(slices.Clone(near), topic...) {
				_, err := caches["hnsw"].search(ctx, 0, caches["hnsw"].Scope(q.key), "", q.vec, false)
				require.NoError(b, err)
			}

			// Say which branch each path's search really executes.
			for _, path := range []string{"auto", "hnsw", "scan"} {
				c := caches[path]
				rows, err := d.pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+c.sqlSearch[0], pgvector.NewVector(topic[0].vec), c.Scope(topic[0].key), 2.0)
				require.NoError(b, err)
				var plan []string
				var line string
				_, err = pgx.ForEachRow(rows, []any{&line}, func() error {
					if strings.Contains(line, "Scan") && !strings.Contains(line, "CTE Scan") && !strings.Contains(line, "Subquery Scan") {
						plan = append(plan, strings.TrimSpace(line))
					}
					return nil
				})
				require.NoError(b, err)
				b.Logf("path=%s plan: %s", path, strings.Join(plan, " | "))
			}

			b.Run("exact", func(b *testing.B) {
				c := caches["auto"]
				r := rand.New(rand.NewPCG(3, 3))
				lat := make([]time.Duration, 0, b.N)
				for b.Loop() {
					i := r.IntN(len(d.rows))
					for d.rows[i].expired {
						i = r.IntN(len(d.rows))
					}
					k := benchKey(d.rows[i].scope, fmt.Sprintf("bench prompt %d", i))
					t0 := time.Now()
					hit, err := c.Lookup(ctx, k, nil)
					lat = append(lat, time.Since(t0))
					if err != nil || hit.Kind != KindExact || hit.ID != d.rows[i].id {
						b.Fatalf("exact lookup: %+v %v", hit, err)
					}
				}
				reportLatency(b, lat)
			})
			for _, path := range []string{"auto", "hnsw", "scan"} {
				c := caches[path]
				b.Run("semantic-hit/path="+path, func(b *testing.B) {
					lat := make([]time.Duration, 0, b.N)
					var found, n int
					i := 0
					for b.Loop() {
						q := near[i%len(near)]
						i++
						t0 := time.Now()
						hit, err := c.Lookup(ctx, q.key, q.vec)
						lat = append(lat, time.Since(t0))
						if err != nil {
							b.Fatal(err)
						}
						n++
						if hit.Kind == KindSemantic && hit.ID == q.want {
							found++
						}
					}
					reportLatency(b, lat)
					b.ReportMetric(float64(found)/float64(n), "recall@1")
				})
				b.Run("nearest-topic/path="+path, func(b *testing.B) {
					lat := make([]time.Duration, 0, b.N)
					var found, n int
					i := 0
					for b.Loop() {
						q := topic[i%len(topic)]
						i++
						t0 := time.Now()
						cands, err := c.search(ctx, 0, c.Scope(q.key), "", q.vec, false)
						lat = append(lat, time.Since(t0))
						if err != nil {
							b.Fatal(err)
						}
						n++
						if len(cands) > 0 && cands[0].id == q.want {
							found++
						}
					}
					reportLatency(b, lat)
					b.ReportMetric(float64(found)/float64(n), "recall@1")
				})
				b.Run("empty-scope/path="+path, func(b *testing.B) {
					lat := make([]time.Duration, 0, b.N)
					i := 0
					for b.Loop() {
						q := topic[i%len(topic)]
						i++
						k := q.key
						k.ToolResultsHash = "no-such-tools"
						t0 := time.Now()
						hit, err := c.Lookup(ctx, k, q.vec)
						lat = append(lat, time.Since(t0))
						if err != nil || hit.Kind != KindNone {
							b.Fatalf("empty scope: %+v %v", hit, err)
						}
					}
					reportLatency(b, lat)
				})
			}
		})
	}
}
