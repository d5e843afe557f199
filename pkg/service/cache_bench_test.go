package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"bulwark/pkg/cache"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/mockprovider"
)

// BenchmarkCacheThroughAPI measures cache hits end to end — HTTP, auth,
// embedding, PostgreSQL lookup, the live record — with 10,000 cached rows,
// and 100,000 with BULWARK_BENCH_LARGE=1, spread over 50 scopes (one of
// them the scope of the questions asked), as in DESIGN.md's measurements.
// It reports p50/p99 latency of exact and semantic hits, the hit rate and
// the recall: the share of near-duplicates (another VIN, another
// timestamp) answered with their original's answer, which brute force
// over the same rows finds too (the masked texts are identical, so the
// original is at similarity 1). It fails below the stated figures (the
// apiMin constants).
//
// Every row is written by the production code: the questions through the
// whole path (API, queue, worker, mock provider, cache write), the filler
// by the API's own cache.Cache.Store, under keys built by the service's
// cache.KeyOf from a question's own job with another question in it. Most
// filler rows of the questions' scope ask about the same two DTCs as the
// questions, in other words: the entity-filtered candidate set of a lookup
// is the question's group (about 180 live rows at 10k; 900 at 100k, enough
// for the HNSW branch, which the benchmark checks), full of lexically
// close questions, not the question alone.
func BenchmarkCacheThroughAPI(b *testing.B) {
	sizes := []int{10_000}
	if os.Getenv("BULWARK_BENCH_LARGE") == "1" {
		sizes = append(sizes, 100_000)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) { benchCacheThroughAPI(b, n) })
	}
}

const (
	// benchTargets questions are answered through the whole path, then
	// asked again.
	benchTargets = 200
	// benchScopes is how many scopes the rows are spread over.
	benchScopes = 50
	// benchWarmup requests precede each timed run.
	benchWarmup = 100
)

// Figures the benchmark states and fails below. Measured (medians of
// three runs, 10,000 and 100,000 rows): hit rate and recall 1.000 for both
// exact repeats and near-duplicates. The semantic thresholds are a little
// below, so that noise passes and a regression does not.
const (
	// apiMinExactHitRate: the same text again is found on the unique
	// index of (scope, prompt hash): any miss is a bug.
	apiMinExactHitRate = 1.0
	// apiMinSemanticHitRate: near-duplicates answered from the cache.
	apiMinSemanticHitRate = 0.99
	// apiMinSemanticRecall: near-duplicates answered with their
	// original's answer.
	apiMinSemanticRecall = 0.99
)

// The questions' vocabulary: a question about benchDTCs[g] names a
// module, a symptom and a moment. With the local embedder two questions
// differing in one of the three score 0.83 to 0.95, in two 0.82 to 0.89.
var (
	benchDTCs = []string{"P0A80", "U0100"}
	modules   = []string{"battery management module", "gateway", "telematics unit", "body controller", "inverter",
		"on-board charger", "head unit", "brake controller", "steering module", "thermal manager"}
	symptoms = []string{"stopped responding", "rebooted twice", "lost its bus link", "reported a checksum mismatch",
		"timed out while flashing", "rolled back the image", "drained the battery", "refused the signature",
		"hung at verification", "threw a watchdog reset"}
	moments = []string{"right after the download finished", "while parked overnight", "during the second install attempt",
		"after an ignition cycle", "before the driver accepted", "with the charger plugged in", "on a cold morning",
		"under low battery voltage", "after a remote wake-up", "while the doors were locked"}
)

// question returns the question of group g naming modules[m], symptoms[s]
// and moments[t] on one car at one time. The same question with another
// vin and at is a near-duplicate: identical once VIN and timestamp are
// masked, with the same protected entities.
func question(g, m, s, t int, vin, at string) string {
	return fmt.Sprintf("Vehicle %s logged %s at %s during the OTA 4.2.0 rollout: the %s %s %s. Which module failed and what is the fix?",
		vin, benchDTCs[g], at, modules[m], symptoms[s], moments[t])
}

// targetQuestion returns question i of the benchTargets: group i%2, and
// per group a Latin square (moment = module + symptom mod 10), so any two
// differ in two of the three words and score at most 0.91: each is a miss
// when first asked, answered by the provider and stored.
func targetQuestion(i int, vin, at string) string {
	k := i / 2
	m, s := k%10, k/10%10
	return question(i%2, m, s, (m+s)%10, vin, at)
}

// fillerQuestion returns a random question of group g that is none of the
// targets (a moment off the Latin square), so that the only row identical
// to a near-duplicate once masked is its original.
func fillerQuestion(r *rand.Rand, g int) string {
	m, s := r.IntN(10), r.IntN(10)
	t := (m + s + 1 + r.IntN(9)) % 10
	return question(g, m, s, t, randomVIN(r), randomTime(r))
}

func randomVIN(r *rand.Rand) string {
	const alphabet = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"
	b := make([]byte, 17)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

func randomTime(r *rand.Rand) string {
	return fmt.Sprintf("2026-%02d-%02d %02d:%02d:%02d", 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60))
}

func benchCacheThroughAPI(b *testing.B, n int) {
	ctx := context.Background()
	s := newSystem(b, opts{extraYML: "queue: {queue_max_depth: 5000}", mock: mockprovider.Config{}})
	api := s.startAPI()
	s.startWorker()
	pool, c := api.base.PG, api.base.Cache
	r := rand.New(rand.NewPCG(uint64(n), 1))

	// The questions, answered once through the whole path.
	targets := make([]string, benchTargets)
	ids := make([]string, benchTargets)
	for i := range targets {
		targets[i] = targetQuestion(i, randomVIN(r), randomTime(r))
		ids[i] = api.submit(b, ask(targets[i]))
	}
	for _, id := range ids {
		api.waitStatus(b, id, 60*time.Second, "completed")
	}
	key := storedKey(b, api, ids)
	var embedder string
	if err := pool.QueryRow(ctx, "SELECT embedder FROM semantic_cache LIMIT 1").Scan(&embedder); err != nil {
		b.Fatal(err)
	}
	hnswIndex := cache.IndexName(embedder)

	loadFiller(b, pool, c, key, n-benchTargets, hnswIndex, r)
	s.open().Close() // rebuilds the HNSW index dropped for the load (cache.New creates it)
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE semantic_cache"); err != nil {
		b.Fatal(err)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM semantic_cache").Scan(&rows); err != nil || rows != n {
		b.Fatalf("%d rows cached, want %d (%v)", rows, n, err)
	}
	// With 100,000 rows every question's group is large enough for the
	// HNSW branch; whether PostgreSQL then walks the index is reported as
	// hnsw-scans/lookup, over the warm-up and the timed requests (see
	// pkg/cache checkPlans: the generic plan of the prepared statement
	// does not, so only the first five lookups of each connection do).
	if hnswBranch := groupSizes(b, pool, c.Scope(key(targets[0]))); n >= 100_000 && !hnswBranch {
		b.Fatalf("rows=%d: the questions' groups are below SmallScopeRows: the HNSW path is not exercised", n)
	}

	run := func(name string, question func(i int) string, want job.Cached, minHitRate, minRecall float64) {
		b.Run(name, func(b *testing.B) {
			// Fresh connections, then warm-up requests: PostgreSQL plans a
			// prepared statement's first five executions on each
			// connection with their parameters and may switch to a generic
			// plan after; a running API is past that.
			scans, lookups := hnswScans(b, pool, hnswIndex), c.Stats().Lookups
			for i := range benchWarmup {
				call(b, "POST", api.ts.URL+"/v1/requests", devToken, ask(question(i%benchTargets)))
			}
			var lat []time.Duration
			hits, found, total := 0, 0, 0
			for b.Loop() {
				t := total % benchTargets
				total++
				start := time.Now()
				code, out, _ := call(b, "POST", api.ts.URL+"/v1/requests", devToken, ask(question(t)))
				lat = append(lat, time.Since(start))
				res, _ := out["result"].(map[string]any)
				if code == 200 && res["cached"] == string(want) {
					hits++
					if replyID(res["content"]) == replyID(mockprovider.Reply(targets[t])) {
						found++
					}
				}
			}
			slices.Sort(lat)
			hitRate, recall := float64(hits)/float64(total), float64(found)/float64(total)
			b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
			b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
			b.ReportMetric(hitRate, "hit-rate")
			b.ReportMetric(recall, "recall")
			scans = hnswScans(b, pool, hnswIndex) - scans
			b.ReportMetric(float64(scans)/float64(c.Stats().Lookups-lookups), "hnsw-scans/lookup")
			if hitRate < minHitRate {
				b.Fatalf("%s hit rate %.3f, below %.3f", want, hitRate, minHitRate)
			}
			if recall < minRecall {
				b.Fatalf("recall %.3f (hits with the original's answer), below %.3f", recall, minRecall)
			}
		})
	}
	run("exact", func(i int) string { return targets[i] }, job.CachedExact, apiMinExactHitRate, apiMinExactHitRate)

	r2 := rand.New(rand.NewPCG(9, 9))
	run("semantic", func(i int) string { return targetQuestion(i, randomVIN(r2), randomTime(r2)) },
		job.CachedSemantic, apiMinSemanticHitRate, apiMinSemanticRecall)
}

// replyID is the part of a mock reply that names the prompt it answered
// (a hash of it): the rest quotes the prompt, and a semantic hit's answer
// quotes the asked car's VIN in place of the original's.
func replyID(content any) string {
	s, _ := content.(string)
	id, _, _ := strings.Cut(s, ":")
	return id
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// storedKey returns the cache key the service builds for a question
// asked with ask: cache.KeyOf of the first target's own job (as the
// API accepted it) with the question in place of its last user turn. It
// checks that the keys of every target's job are those of the rows the
// service stored.
func storedKey(b *testing.B, api *apiProc, ids []string) func(q string) cache.Key {
	b.Helper()
	ctx := context.Background()
	stored := map[[2]string]bool{}
	rows, err := api.base.PG.Query(ctx, "SELECT scope, prompt_hash FROM semantic_cache")
	if err != nil {
		b.Fatal(err)
	}
	var scope, hash string
	if _, err := pgx.ForEachRow(rows, []any{&scope, &hash}, func() error {
		stored[[2]string{scope, hash}] = true
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	if len(stored) != len(ids) {
		b.Fatalf("%d rows stored for %d questions", len(stored), len(ids))
	}
	var first job.Job
	for i, id := range ids {
		rec, err := api.base.Jobs.Get(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		k := cache.KeyOf(&rec.Job)
		if !stored[[2]string{api.base.Cache.Scope(k), cache.PromptHash(cache.Normalise(k.Prompt))}] {
			b.Fatalf("no row stored under the key of request %s", id)
		}
		if i == 0 {
			first = rec.Job
		}
	}
	return func(q string) cache.Key {
		j := first
		j.Request.Messages = []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: q}}}}
		return cache.KeyOf(&j)
	}
}

// loadFiller stores n rows through c.Store, one in benchScopes into the
// questions' scope and the others into other scopes (other tool results).
// Four rows in five ask another question of the questions' two groups;
// one in five is a fleet note with numbers of its own (an entity set of
// one row). The HNSW index is dropped during the load and rebuilt after
// (a bulk build is far faster than n index inserts).
func loadFiller(b *testing.B, pool *pgxpool.Pool, c *cache.Cache, key func(string) cache.Key, n int, hnswIndex string, r *rand.Rand) {
	b.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "DROP INDEX IF EXISTS "+pgx.Identifier{hnswIndex}.Sanitize()); err != nil {
		b.Fatal(err)
	}
	keys := make([]cache.Key, n)
	for i := range keys {
		var q string
		if j := i / benchScopes; j%5 == 4 {
			q = fmt.Sprintf("fleet note %d: cabin %s noise near %d km/h on route %d, firmware %d.%d",
				i, []string{"wind", "rattle", "hum", "click"}[r.IntN(4)], 20+r.IntN(120), r.IntN(5000), r.IntN(9), r.IntN(20))
		} else {
			q = fillerQuestion(r, j%2)
		}
		keys[i] = key(q)
		if sc := i % benchScopes; sc != 0 {
			keys[i].ToolResultsHash = fmt.Sprintf("bench-tool-results-%02d", sc)
		}
	}
	// An answer of about 1 kB, in the shape the service stores (the mock's
	// answers to the questions are about 300 bytes): row size decides
	// whether PostgreSQL keeps the embedding inline (see pkg/cache
	// benchAnswer).
	body, err := json.Marshal(map[string]any{"route": map[string]string{"provider": "claude", "model_tier": "sonnet"},
		"response": map[string]any{"content": []map[string]string{{"type": "text", "text": fillerAnswer(r)}},
			"stop_reason": "end_turn", "usage": map[string]int{"input_tokens": 120, "output_tokens": 240}}})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	var (
		next    atomic.Int64
		failed  atomic.Pointer[error]
		workers sync.WaitGroup
	)
	for range pool.Config().MaxConns {
		workers.Go(func() {
			for i := next.Add(1) - 1; i < int64(n) && failed.Load() == nil; i = next.Add(1) - 1 {
				if err := c.Store(ctx, keys[i], nil, body); err != nil {
					failed.Store(&err)
				}
			}
		})
	}
	workers.Wait()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.Logf("Store %d filler rows: %s", n, time.Since(start).Round(time.Millisecond))
}

// fillerAnswer returns about 1 kB of diagnosis text.
func fillerAnswer(r *rand.Rand) string {
	words := []string{"check", "the", "battery", "module", "firmware", "gateway", "voltage", "after", "update", "reflash",
		"contactor", "relay", "signal", "inverter", "log", "timeout", "isolation", "fault", "pack", "sensor"}
	var b strings.Builder
	for b.Len() < 1000 {
		b.WriteString(words[r.IntN(len(words))])
		b.WriteByte(' ')
	}
	return b.String()
}

// groupSizes logs how many live rows a lookup of each question filters
// to (its scope and entities) and reports whether the default lookup
// walks the HNSW index for all of them (SmallScopeRowsDefault or more);
// with 100,000 rows it must.
func groupSizes(b *testing.B, pool *pgxpool.Pool, scope string) (hnsw bool) {
	b.Helper()
	rows, err := pool.Query(context.Background(), `SELECT count(*) FROM semantic_cache s
WHERE s.scope = $1 AND s.expires_at > now() AND s.entities IN (
  SELECT entities FROM semantic_cache WHERE scope = $1 AND prompt LIKE 'user: Vehicle %')
GROUP BY s.entities`, scope)
	if err != nil {
		b.Fatal(err)
	}
	sizes, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		b.Fatal(err)
	}
	slices.Sort(sizes)
	if len(sizes) != len(benchDTCs) {
		b.Fatalf("the questions fall into %d entity groups, want %d", len(sizes), len(benchDTCs))
	}
	hnsw = sizes[0] >= cache.SmallScopeRowsDefault
	b.Logf("a semantic lookup filters to %v live rows: %s", sizes, map[bool]string{true: "HNSW path", false: "exact scan"}[hnsw])
	return hnsw
}

// hnswScans returns the scan count of the HNSW index (pg_stat_user_indexes)
// once it has stopped growing (or after 15 s). A backend reports its
// counts when idle at most once a second, and when it exits: the pool's
// connections are closed first, so that what the API ran is counted.
func hnswScans(b *testing.B, pool *pgxpool.Pool, index string) int64 {
	b.Helper()
	pool.Reset()
	deadline := time.Now().Add(15 * time.Second)
	last := int64(-1)
	for {
		var n int64
		if err := pool.QueryRow(context.Background(), "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes WHERE indexrelname = $1",
			index).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n == last || time.Now().After(deadline) {
			return n
		}
		last = n
		time.Sleep(300 * time.Millisecond)
	}
}
