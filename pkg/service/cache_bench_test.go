package service_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgvector/pgvector-go"

	"bulwark/pkg/cache"
	"bulwark/pkg/embed"
	"bulwark/pkg/mockprovider"
)

// BenchmarkCacheThroughAPI measures cache hits end to end — HTTP, auth,
// embedding, PostgreSQL lookup, the live record — with 10,000 cached rows,
// and 100,000 with BULWARK_BENCH_LARGE=1, spread over 50 scopes (one of
// them the scope of the questions asked), as in DESIGN.md's measurements. It reports p50/p99 latency of exact and semantic hits
// and the recall of the semantic lookup: the share of near-duplicates
// answered with the stored answer of their original, which brute force
// over the same rows finds too (the masked texts are identical).
func BenchmarkCacheThroughAPI(b *testing.B) {
	sizes := []int{10_000}
	if os.Getenv("BULWARK_BENCH_LARGE") == "1" {
		sizes = append(sizes, 100_000)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) { benchCacheThroughAPI(b, n) })
	}
}

const benchTargets = 200

func targetQuestion(i int, vin string, at string) string {
	dtc := fmt.Sprintf("P%04X", 0x0A00+i)
	return fmt.Sprintf("Vehicle %s logged %s at %s during OTA 4.%d.0 rollout; which module failed and what is the fix?", vin, dtc, at, i)
}

func randomVIN(r *rand.Rand) string {
	const alphabet = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"
	b := make([]byte, 17)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

func benchCacheThroughAPI(b *testing.B, n int) {
	ctx := context.Background()
	s := newSystem(b, opts{extraYML: "queue: {queue_max_depth: 5000}", mock: mockprovider.Config{}})
	api := s.startAPI()
	s.startWorker()
	r := rand.New(rand.NewPCG(uint64(n), 1))

	// The questions, answered once through the whole path.
	ids := make([]string, benchTargets)
	for i := range ids {
		ids[i] = api.submit(b, ask(targetQuestion(i, randomVIN(r), "2026-11-30 08:15:22")))
	}
	for _, id := range ids {
		api.waitStatus(b, id, 60*time.Second, "completed")
	}
	pool := api.base.PG
	var scope, embedder string
	if err := pool.QueryRow(ctx, "SELECT scope, embedder FROM semantic_cache LIMIT 1").Scan(&scope, &embedder); err != nil {
		b.Fatal(err)
	}
	loadFiller(b, api.base.PG, n-benchTargets, scope, embedder, r)
	s.open().Close() // rebuilds the HNSW index dropped for the load (cache.New creates it)
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE semantic_cache"); err != nil {
		b.Fatal(err)
	}

	run := func(name string, question func(i int) string, want string) {
		b.Run(name, func(b *testing.B) {
			var lat []time.Duration
			hits, total := 0, 0
			for i := range b.N {
				t := i % benchTargets
				q := question(t)
				start := time.Now()
				code, out, _ := call(b, "POST", api.ts.URL+"/v1/requests", devToken, ask(q))
				lat = append(lat, time.Since(start))
				total++
				res, _ := out["result"].(map[string]any)
				if code == 200 && res["cached"] == want {
					hits++
				}
			}
			slices.Sort(lat)
			b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
			b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
			b.ReportMetric(float64(hits)/float64(total), "hit-rate")
		})
	}
	r2 := rand.New(rand.NewPCG(9, 9))
	// Exact: the very same text again (we kept no VINs, so re-derive them).
	var questions []string
	rows, err := pool.Query(ctx, "SELECT prompt FROM semantic_cache WHERE scope = $1 AND prompt LIKE 'user: Vehicle %' ORDER BY id", scope)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var p string
		_ = rows.Scan(&p)
		questions = append(questions, strings.TrimSpace(strings.TrimPrefix(p, "user: ")))
	}
	rows.Close()
	if len(questions) != benchTargets {
		b.Fatalf("%d stored questions, want %d", len(questions), benchTargets)
	}
	run("exact", func(i int) string { return questions[i] }, "exact")
	run("semantic", func(i int) string {
		return targetQuestion(i, randomVIN(r2), fmt.Sprintf("2026-12-0%d 1%d:0%d:00", 1+i%9, i%10, i%10))
	}, "semantic")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadFiller COPYs n rows of other questions, a fiftieth into scope, with the
// HNSW index dropped during the load and rebuilt after (a bulk build is far
// faster than n index inserts).
func loadFiller(b *testing.B, pool *pgxpool.Pool, n int, scope, embedder string, r *rand.Rand) {
	ctx := context.Background()
	emb, err := embed.NewLocal(384)
	if err != nil {
		b.Fatal(err)
	}
	texts := make([]string, n)
	for i := range texts {
		texts[i] = fmt.Sprintf("user: fleet note %d: cabin %s noise near %d km/h on route %d, firmware %d.%d\n",
			i, []string{"wind", "rattle", "hum", "click"}[r.IntN(4)], 20+r.IntN(120), r.IntN(5000), r.IntN(9), r.IntN(20))
	}
	vecs, err := emb.Embed(ctx, texts)
	if err != nil {
		b.Fatal(err)
	}
	exp := time.Now().Add(4 * time.Hour)
	src := make([][]any, n)
	for i := range src {
		sc := scope
		if i%50 != 0 {
			sc = fmt.Sprintf("bench-scope-%d", i%50)
		}
		src[i] = []any{sc, cache.PromptHash(texts[i]), embedder, pgvector.NewVector(vecs[i]), "demo", "agent", texts[i],
			[]byte(`{"route":{"provider":"claude","model_tier":"sonnet"},"response":{"content":[{"type":"text","text":"filler"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}}`), exp}
	}
	if _, err := pool.Exec(ctx, "DROP INDEX IF EXISTS "+cache.IndexName(embedder)); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"semantic_cache"},
		[]string{"scope", "prompt_hash", "embedder", "embedding", "tenant", "layer", "prompt", "response", "expires_at"},
		pgx.CopyFromRows(src)); err != nil {
		b.Fatal(err)
	}
	b.Logf("COPY %d filler rows: %s", n, time.Since(start).Round(time.Millisecond))
}
