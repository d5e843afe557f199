package cache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgvector/pgvector-go"

	"bulwark/pkg/embed"
	"bulwark/pkg/groupcommit"
	"bulwark/pkg/job"
)

// ErrUnavailable is wrapped by every error caused by the database or the
// embedder failing (unreachable, timed out, erroring). The caller bypasses
// the cache and goes on; such errors never need to fail a request.
var ErrUnavailable = errors.New("semantic cache unavailable")

// hnswMaxDims is pgvector's limit on the dimension of an HNSW-indexed vector.
const hnswMaxDims = 2000

// purgeBatch is how many rows PurgeExpired deletes per statement, so that
// no single statement holds locks or builds WAL for long.
const purgeBatch = 5000

// Hit is the outcome of a Lookup.
type Hit struct {
	// Kind is job.CachedNone (a miss, or a bypass after an error),
	// job.CachedExact (the same normalised prompt in the same scope) or
	// job.CachedSemantic (a similar prompt in the same scope).
	Kind job.Cached
	// Similarity is the cosine similarity of the stored prompt to the
	// asked one: 1 for exact hits, 0 for misses.
	Similarity float64
	// Age is how long ago the answer was stored.
	Age time.Duration
	// Response is the stored answer, as given to Store; after a semantic
	// hit, with the stored prompt's VINs, times, phones and plates replaced
	// by the asked prompt's (see Lookup). It may be shared with other hits
	// (the memo): read it, never modify it.
	Response json.RawMessage
	// ID is the row id of the answer (0 on a miss).
	ID int64
	// Embedding is the prompt's embedding when the lookup got as far as
	// the semantic search (nil after an exact hit), for the caller to pass
	// to Store: a prompt is embedded at most once, and not at all when it
	// hits exactly.
	Embedding []float32
}

// Stats are counters since New. All are cumulative; metrics take deltas or
// expose them as counters.
type Stats struct {
	Lookups       int64 // Lookup calls
	ExactHits     int64
	SemanticHits  int64
	Misses        int64 // lookups that found nothing, errors excluded
	GuardRejected int64 // candidates above the threshold refused by the protected-entity guard
	// EntityRefused are candidates above the threshold refused because
	// their answer quotes a VIN, time, phone or plate of the stored prompt
	// that has no unambiguous counterpart in the asked one (carry.go).
	EntityRefused int64
	// AskRefused are candidates above the threshold refused because the
	// prompts differ in what they ask around a shared text, such as an
	// added instruction (difference.go).
	AskRefused     int64
	Stores         int64 // successful Store calls
	Errors         int64 // operations that failed with ErrUnavailable (each is also a bypass)
	HitCountsLost  int64 // hits whose count could not be recorded (queue full or write failed)
	HitCountWrites int64 // hit-count flushes written
	// StoresShed are answers not stored because the answer writer's queue
	// was full (PostgreSQL slower than the answers arrive).
	StoresShed int64
	// MemoHits are the exact hits the memo served without PostgreSQL
	// (counted in ExactHits too).
	MemoHits int64
	// MemoEntries is how many answers the memo holds now (not cumulative).
	MemoEntries int64
}

// Cache is layer 1: a semantic cache of final answers in PostgreSQL with
// pgvector. It is safe for concurrent use. See the package documentation.
type Cache struct {
	pool   *pgxpool.Pool
	emb    embed.Embedder
	cfg    Config
	guard  *guard
	logger *slog.Logger

	indexName string
	sqlExact  string
	// sqlSearch[0] takes 1 row from the HNSW branch, sqlSearch[1]
	// Config.Candidates (see buildSQL).
	sqlSearch [2]string
	sqlStore  string

	hits    hitLog
	run     runner
	answers atomic.Pointer[groupcommit.Writer[pendingAnswer]] // while Start runs
	memo    atomic.Pointer[memo]                              // after EnableMemo (memo.go)

	lookups, exactHits, semHits, misses, guardRejected atomic.Int64
	entityRefused, askRefused                          atomic.Int64
	stores, errs, hitsLost, hitWrites                  atomic.Int64
	storesShed, memoHits                               atomic.Int64

	// failMu guards the warning limiter.
	failMu     sync.Mutex
	lastFailAt time.Time
	suppressed int64
}

// New returns a Cache over pool, which must have been built with
// AfterConnect (or AfterConnectWith(cfg)), and prepares it (Prepare). New
// needs the database: its error wraps ErrUnavailable when the database is
// the cause, so a caller can use Open and Prepare later instead.
func New(ctx context.Context, pool *pgxpool.Pool, emb embed.Embedder, cfg Config, logger *slog.Logger) (*Cache, error) {
	c, err := Open(pool, emb, cfg, logger)
	if err != nil {
		return nil, err
	}
	if err := c.Prepare(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Open returns a Cache over pool without touching the database: for a
// process that starts while PostgreSQL is down (every lookup and store then
// fails with ErrUnavailable, and the caller bypasses the cache) and calls
// Prepare once it is back.
func Open(pool *pgxpool.Pool, emb embed.Embedder, cfg Config, logger *slog.Logger) (*Cache, error) {
	if pool == nil || emb == nil || logger == nil {
		return nil, errors.New("cache: New: pool, embedder and logger are required")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d := emb.Dims(); d < 1 || d > hnswMaxDims {
		return nil, fmt.Errorf("cache: embedder %q has %d dimensions: the HNSW index allows 1..%d", emb.Name(), d, hnswMaxDims)
	}
	g, err := newGuard(cfg.ProtectedPatterns, cfg.IgnoredPatterns)
	if err != nil {
		return nil, fmt.Errorf("cache: protected patterns: %w", err)
	}
	c := &Cache{pool: pool, emb: emb, cfg: cfg, guard: g, logger: logger, indexName: IndexName(emb.Name())}
	c.buildSQL()
	return c, nil
}

// Prepare checks that the pool's connections carry the settings the
// lookups need and creates, if missing, the partial HNSW index for the
// embedder's vectors; several processes may call it at once. Its error
// wraps ErrUnavailable when the database is the cause.
func (c *Cache) Prepare(ctx context.Context) error {
	if err := c.checkConn(ctx); err != nil {
		return err
	}
	return c.ensureIndex(ctx)
}

// IndexName returns the name of the partial HNSW index of an embedder's
// vectors: "semantic_cache_hnsw_" and the name with every character other
// than a-z, 0-9 and _ replaced by _, plus a short hash of the name when that
// changed it or when it is too long for an identifier.
func IndexName(embedder string) string {
	const prefix = "semantic_cache_hnsw_"
	const maxIdent = 63 // PostgreSQL's NAMEDATALEN-1
	var b strings.Builder
	for _, r := range strings.ToLower(embedder) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if s == embedder && len(prefix)+len(s) <= maxIdent {
		return prefix + s
	}
	sum := sha256.Sum256([]byte(embedder))
	suffix := "_" + hex.EncodeToString(sum[:4])
	if n := maxIdent - len(prefix) - len(suffix); len(s) > n {
		s = s[:n]
	}
	return prefix + s + suffix
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings
// is on by default since PostgreSQL 9.1).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// buildSQL writes the statements with the embedder name and dimension as
// literals: the planner can match a partial index predicate and an index
// expression only against constants, and a generic plan of a prepared
// statement would not see a parameter's value.
func (c *Cache) buildSQL() {
	name := quoteLiteral(c.emb.Name())
	vec := fmt.Sprintf("embedding::vector(%d)", c.emb.Dims())

	c.sqlExact = `SELECT id, response, extract(epoch FROM now() - created_at), extract(epoch FROM expires_at - now())
FROM semantic_cache WHERE scope = $1 AND prompt_hash = $2 AND expires_at > now()`

	// One round trip. "live" counts the scope's live rows up to the
	// small-scope limit (an index-only scan of semantic_cache_entities_live);
	// its value gates, as a one-time filter, which of the two branches
	// runs: an exact scan of the scope (the "+ 0" keeps the planner off the
	// HNSW index) or the HNSW index walk with iterative scan. Candidates
	// carry only id and distance; prompt and response are fetched for the
	// few that make the threshold ($3), so a sort never drags them along.
	//
	// The exact branch returns Config.Candidates rows at no extra cost (a
	// top-N sort). An iterative HNSW walk under a filter costs about
	// proportionally to the rows it must return (LIMIT 5 read 4.5x the
	// buffers of LIMIT 1 at 100k rows), so sqlSearch[0] asks HNSW for one
	// row and Lookup runs sqlSearch[1] only when the guard refused it.
	small := c.cfg.SmallScopeRows
	if small < 0 {
		small = 0 // never take the exact branch
	}
	filter := fmt.Sprintf("scope = $2 AND entities = $4 AND embedder = %s AND expires_at > now()", name)
	for i, hnswLimit := range []int{1, c.cfg.Candidates} {
		c.sqlSearch[i] = fmt.Sprintf(`WITH live AS MATERIALIZED (
  SELECT count(*) AS n FROM (SELECT 1 FROM semantic_cache WHERE %[1]s LIMIT %[2]d) l
), cand AS (
  (SELECT id, %[3]s <=> $1 AS dist FROM semantic_cache
   WHERE (SELECT n FROM live) < %[2]d AND %[1]s
   ORDER BY (%[3]s <=> $1) + 0 LIMIT %[4]d)
  UNION ALL
  (SELECT id, %[3]s <=> $1 AS dist FROM semantic_cache
   WHERE (SELECT n FROM live) >= %[2]d AND %[1]s
   ORDER BY %[3]s <=> $1 LIMIT %[5]d)
)
SELECT c.id, 1 - c.dist,
  CASE WHEN 1 - c.dist >= $3 THEN s.prompt END,
  CASE WHEN 1 - c.dist >= $3 THEN s.response END,
  extract(epoch FROM now() - s.created_at)
FROM cand c JOIN semantic_cache s ON s.id = c.id
ORDER BY c.dist`, filter, small, vec, c.cfg.Candidates, hnswLimit)
	}

	c.sqlStore = fmt.Sprintf(`INSERT INTO semantic_cache
  (scope, prompt_hash, embedder, embedding, tenant, case_id, layer, prompt, response, expires_at, entities)
VALUES ($1, $2, %s, $3, $4, NULLIF($5, ''), $6, $7, $8, now() + make_interval(secs => $9), $10)
ON CONFLICT (scope, prompt_hash) DO UPDATE SET
  embedder = EXCLUDED.embedder, embedding = EXCLUDED.embedding, tenant = EXCLUDED.tenant, entities = EXCLUDED.entities,
  case_id = EXCLUDED.case_id, layer = EXCLUDED.layer, prompt = EXCLUDED.prompt,
  response = EXCLUDED.response, created_at = now(), expires_at = EXCLUDED.expires_at,
  hit_count = 0, last_hit_at = NULL`, name)
}

// createIndexSQL is the DDL of emb's partial HNSW index. Queries use the
// same expression (the cast to the embedder's dimension; the column itself
// has none, so one column serves every embedder) and the same predicate.
func createIndexSQL(emb embed.Embedder, cfg Config) string {
	return fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON semantic_cache USING hnsw ((embedding::vector(%d)) vector_cosine_ops) WITH (m = %d, ef_construction = %d) WHERE embedder = %s`,
		pgx.Identifier{IndexName(emb.Name())}.Sanitize(), emb.Dims(), cfg.IndexM, cfg.IndexEfConstruction, quoteLiteral(emb.Name()))
}

// ensureIndex creates the embedder's HNSW index if it is missing. The
// advisory lock serialises concurrent New calls: two concurrent CREATE
// INDEX IF NOT EXISTS of one name can fail on the catalog's unique index.
// For a new embedder the index is empty, so the build is quick.
func (c *Cache) ensureIndex(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('bulwark.semantic_cache.index'))"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, createIndexSQL(c.emb, c.cfg))
		return err
	})
	if err != nil {
		return fmt.Errorf("cache: create index %s: %w: %w", c.indexName, ErrUnavailable, err)
	}
	c.checkIndexParams(ctx)
	return nil
}

// checkIndexParams warns when the embedder's index was built with other
// HNSW parameters than the configured ones: CREATE INDEX IF NOT EXISTS
// kept it, and rebuilding an index of every stored answer (the statement
// is in the warning) is the operator's call.
func (c *Cache) checkIndexParams(ctx context.Context) {
	var opts []string
	err := c.pool.QueryRow(ctx, "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE relname = $1", c.indexName).Scan(&opts)
	if err != nil {
		c.logger.Warn("cache: could not read the HNSW index's parameters", "index", c.indexName, "err", err)
		return
	}
	m, ef := IndexMDefault, IndexEfConstructionDefault // pgvector's when none is set
	for _, o := range opts {
		k, v, _ := strings.Cut(o, "=")
		n, _ := strconv.Atoi(v)
		switch k {
		case "m":
			m = n
		case "ef_construction":
			ef = n
		}
	}
	if m != c.cfg.IndexM || ef != c.cfg.IndexEfConstruction {
		name := pgx.Identifier{c.indexName}.Sanitize()
		c.logger.Warn("cache: the HNSW index was built with other parameters than configured; they apply once it is rebuilt",
			"index", c.indexName, "m", m, "ef_construction", ef,
			"configured_m", c.cfg.IndexM, "configured_ef_construction", c.cfg.IndexEfConstruction,
			"rebuild", fmt.Sprintf("ALTER INDEX %s SET (m = %d, ef_construction = %d); REINDEX INDEX CONCURRENTLY %s",
				name, c.cfg.IndexM, c.cfg.IndexEfConstruction, name))
	}
}

// checkConn refuses a pool built without AfterConnect: without iterative
// scan, filtered HNSW lookups silently miss.
func (c *Cache) checkConn(ctx context.Context) error {
	var mode string
	err := c.pool.QueryRow(ctx, "SELECT coalesce(current_setting('hnsw.iterative_scan', true), '')").Scan(&mode)
	if err != nil {
		return fmt.Errorf("cache: check connection settings: %w: %w", ErrUnavailable, err)
	}
	if mode != "relaxed_order" {
		return fmt.Errorf("cache: pool connections have hnsw.iterative_scan = %q: build the pool with cache.AfterConnect", mode)
	}
	return nil
}

// Embed returns the embedding of a prompt (normalised, and with what the
// ignored patterns match masked out), for a caller
// that computes it once per request and passes it to both Lookup and Store.
// Errors wrap ErrUnavailable.
func (c *Cache) Embed(ctx context.Context, prompt string) ([]float32, error) {
	v, err := c.emb.Embed(ctx, []string{c.guard.mask(Normalise(prompt))})
	if err == nil && len(v) != 1 {
		err = fmt.Errorf("%d vectors for 1 text", len(v))
	}
	if err != nil {
		err = fmt.Errorf("cache: embed with %s: %w: %w", c.emb.Name(), ErrUnavailable, err)
		c.fail(ctx, err)
		return nil, err
	}
	return v[0], nil
}

// checkEmbedding validates a caller-supplied vector and reports whether it
// can be compared (a zero vector has no cosine similarity to anything).
func (c *Cache) checkEmbedding(v []float32) (usable bool, err error) {
	if len(v) != c.emb.Dims() {
		return false, fmt.Errorf("cache: embedding has %d dimensions, embedder %q has %d", len(v), c.emb.Name(), c.emb.Dims())
	}
	var sum float64
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false, errors.New("cache: embedding holds NaN or Inf")
		}
		sum += float64(x) * float64(x)
	}
	return sum > 0, nil
}

func (c *Cache) checkKey(k Key) (layer string, err error) {
	layer = c.layer(k)
	if _, ok := c.cfg.TTL[layer]; !ok {
		return "", fmt.Errorf("cache: Key.Layer %q: no TTL configured for it", layer)
	}
	if k.Tier == "" {
		return "", errors.New("cache: Key.Tier is empty")
	}
	return layer, nil
}

// LookupExact is Lookup's first step alone: the entry stored under k's
// exact scope and prompt, or a job.CachedNone hit. One indexed query, no
// embedding: for a caller that only needs an identical request's answer.
func (c *Cache) LookupExact(ctx context.Context, k Key) (Hit, error) {
	layer, err := c.checkKey(k)
	if err != nil {
		return Hit{Kind: job.CachedNone}, err
	}
	prompt := Normalise(k.Prompt)
	hit, _, err := c.exact(ctx, scope(k, layer, *c.cfg.TenantIsolation), prompt)
	return hit, err
}

// exact looks up the entry of scope sc and prompt, in the memo first when
// there is one; ok reports a hit.
func (c *Cache) exact(ctx context.Context, sc, prompt string) (hit Hit, ok bool, err error) {
	hit = Hit{Kind: job.CachedExact, Similarity: 1}
	hash := PromptHash(prompt)
	key := memoKey(sc, hash)
	m := c.memo.Load()
	var gen uint64
	if m != nil {
		now := time.Now()
		if e, ok := m.get(key, now); ok {
			hit.ID, hit.Response, hit.Age = e.id, e.response, now.Sub(e.created)
			c.exactHits.Add(1)
			c.memoHits.Add(1)
			c.recordHit(hit.ID)
			return hit, true, nil
		}
		gen = m.generation()
	}
	var ageSec, leftSec float64
	start := time.Now() // before PostgreSQL's now(): a memo entry must not outlive its row
	qctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	err = c.pool.QueryRow(qctx, c.sqlExact, sc, hash).Scan(&hit.ID, &hit.Response, &ageSec, &leftSec)
	cancel()
	switch {
	case err == nil:
		hit.Age = seconds(ageSec)
		if m != nil {
			m.put(gen, key, memoEntry{id: hit.ID, response: hit.Response, created: start.Add(-hit.Age)}, start, seconds(leftSec))
		}
		c.exactHits.Add(1)
		c.recordHit(hit.ID)
		return hit, true, nil
	case errors.Is(err, pgx.ErrNoRows):
		return Hit{Kind: job.CachedNone}, false, nil
	}
	err = fmt.Errorf("cache: lookup exact: %w: %w", ErrUnavailable, err)
	c.fail(ctx, err)
	return Hit{Kind: job.CachedNone}, false, err
}

// Lookup finds a stored answer for k: first an exact match of the
// normalised prompt in k's scope, then the most similar live prompt of the
// same scope and embedder whose cosine similarity is at least the threshold,
// whose protected entities (trouble codes, ECUs, parts, versions) are the
// same, and whose difference from k.Prompt around any shared text asks the
// same thing (no instruction added to a shared log). A semantic hit's
// Response has the stored prompt's VINs, times, phones and plates replaced
// by k.Prompt's; one that quotes a value without an unambiguous
// counterpart is not a hit. emb is k.Prompt's embedding from Embed; nil
// means Lookup computes it, and only if the exact match misses.
//
// On a hit its hit count and last-hit time are recorded (written in the
// background; see Start). A failure of the database or embedder returns a
// job.CachedNone hit and an error wrapping ErrUnavailable: the caller bypasses
// the cache. Other errors (a bad key or vector) are the caller's.
func (c *Cache) Lookup(ctx context.Context, k Key, emb []float32) (Hit, error) {
	miss := Hit{Kind: job.CachedNone}
	layer, err := c.checkKey(k)
	if err != nil {
		return miss, err
	}
	c.lookups.Add(1)
	prompt := Normalise(k.Prompt)
	sc := scope(k, layer, *c.cfg.TenantIsolation)
	if hit, ok, err := c.exact(ctx, sc, prompt); ok || err != nil {
		return hit, err
	}

	if emb == nil {
		if emb, err = c.Embed(ctx, prompt); err != nil {
			return miss, err
		}
	}
	usable, err := c.checkEmbedding(emb)
	if err != nil {
		return miss, err
	}
	miss.Embedding = emb
	if !usable {
		c.misses.Add(1)
		return miss, nil
	}

	q := c.question(k.Prompt, prompt)
	var refused map[int64]bool
	for round := range c.sqlSearch {
		qctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
		cands, err := c.search(qctx, round, sc, q.ents.key(), emb, true)
		cancel()
		if err != nil {
			err = fmt.Errorf("cache: lookup semantic: %w: %w", ErrUnavailable, err)
			c.fail(ctx, err)
			return miss, err
		}
		for _, cd := range cands {
			if cd.sim < c.cfg.Threshold {
				break // ordered by distance: the rest are further still
			}
			if refused[cd.id] {
				continue
			}
			response, ok, err := c.admit(ctx, q, cd)
			if err != nil {
				return miss, err
			}
			if !ok {
				if refused == nil {
					refused = map[int64]bool{}
				}
				refused[cd.id] = true
				continue
			}
			c.semHits.Add(1)
			c.recordHit(cd.id)
			return Hit{Kind: job.CachedSemantic, Similarity: cd.sim, Age: cd.age, Response: response, ID: cd.id, Embedding: emb}, nil
		}
		// A second round only helps when the first came from the HNSW
		// branch (one row) and admit refused that row.
		if len(cands) != 1 || refused == nil || c.cfg.Candidates == 1 {
			break
		}
	}
	c.misses.Add(1)
	return miss, nil
}

// question is the asked prompt as admit compares it with candidates.
type question struct {
	ents     entities   // protected entities of the normalised prompt
	values   [][]string // guard.values of the normalised prompt
	segments []string   // guard.segments of the prompt in line form
	// diffEmbeds is how many more candidates may have their differences
	// embedded (difference.go).
	diffEmbeds int
}

func (c *Cache) question(raw, normalised string) *question {
	return &question{
		ents:       c.guard.extract(normalised),
		values:     c.guard.values(normalised),
		segments:   c.guard.segments(lineForm(raw)),
		diffEmbeds: diffEmbedsMax,
	}
}

// admit decides whether a candidate above the threshold may answer q, and
// returns the answer to serve: the stored one with the asked prompt's
// VINs, times, phones and plates in place of the stored prompt's
// (carry.go). Each refusal is counted by its reason. The checks run
// cheapest first; only sameAsk may call the embedder, and its error (which
// wraps ErrUnavailable) is returned.
func (c *Cache) admit(ctx context.Context, q *question, cd candidate) (json.RawMessage, bool, error) {
	stored := Normalise(cd.prompt) // rows keep their line breaks (lineForm)
	// The SQL already filters on the entities; this re-check guards rows
	// stored before that column existed.
	if !c.guard.extract(stored).same(q.ents) {
		c.guardRejected.Add(1)
		return nil, false, nil
	}
	response, ok := c.guard.carry(stored, q.values, cd.response)
	if !ok {
		c.entityRefused.Add(1)
		return nil, false, nil
	}
	same, err := c.sameAsk(ctx, q, cd.prompt)
	if err != nil {
		return nil, false, err
	}
	if !same {
		c.askRefused.Add(1)
		return nil, false, nil
	}
	return response, true, nil
}

// candidate is one row of the semantic search.
type candidate struct {
	id       int64
	sim      float64
	prompt   string          // empty below the threshold
	response json.RawMessage // nil below the threshold
	age      time.Duration
}

// search runs sqlSearch[round] and returns the nearest live rows of a
// scope, nearest first. Without withText no prompt or response is fetched.
func (c *Cache) search(ctx context.Context, round int, scope, ents string, emb []float32, withText bool) ([]candidate, error) {
	threshold := c.cfg.Threshold
	if !withText {
		threshold = 2 // above any similarity: no text fetched
	}
	// An unnamed statement (CacheDescribe) is planned with this lookup's
	// values every time. A prepared one switches to a generic plan after
	// five executions, and that plan, estimating one row for the scope and
	// entities, sorts the group instead of walking the HNSW index: 8 ms
	// instead of 2.5 ms at p50 with 100,000 rows (BenchmarkLookup).
	rows, err := c.pool.Query(ctx, c.sqlSearch[round], pgx.QueryExecModeCacheDescribe,
		pgvector.NewVector(emb), scope, threshold, ents)
	if err != nil {
		return nil, err
	}
	out := make([]candidate, 0, c.cfg.Candidates)
	var (
		cd     candidate
		prompt *string
		ageSec float64
	)
	_, err = pgx.ForEachRow(rows, []any{&cd.id, &cd.sim, &prompt, &cd.response, &ageSec}, func() error {
		if prompt != nil {
			cd.prompt = *prompt
		}
		cd.age = seconds(ageSec)
		out = append(out, cd)
		cd, prompt = candidate{}, nil
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Store saves response as the answer to k (an upsert on scope and prompt
// hash), to expire after the TTL of k's layer. emb is k.Prompt's embedding
// from Embed; nil means Store computes it. Only the caller knows what may
// be cached: it stores final successful answers only. Database and
// embedder failures wrap ErrUnavailable.
func (c *Cache) Store(ctx context.Context, k Key, emb []float32, response json.RawMessage) error {
	args, err := c.storeArgs(ctx, k, emb, response)
	if err != nil {
		return err
	}
	qctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	defer cancel()
	return c.insert(qctx, args)
}

// insert writes one entry (sqlStore's arguments) and counts it; a failure
// is counted, logged (rate-limited) and returned wrapping ErrUnavailable.
func (c *Cache) insert(ctx context.Context, args []any) error {
	if _, err := c.pool.Exec(ctx, c.sqlStore, args...); err != nil {
		err = fmt.Errorf("cache: store: %w: %w", ErrUnavailable, err)
		c.fail(ctx, err)
		return err
	}
	c.stores.Add(1)
	return nil
}

// storeArgs checks an entry and returns sqlStore's arguments.
func (c *Cache) storeArgs(ctx context.Context, k Key, emb []float32, response json.RawMessage) ([]any, error) {
	layer, err := c.checkKey(k)
	if err != nil {
		return nil, err
	}
	if !json.Valid(response) {
		return nil, errors.New("cache: store: response is not valid JSON")
	}
	prompt := Normalise(k.Prompt)
	if emb == nil {
		if emb, err = c.Embed(ctx, prompt); err != nil {
			return nil, err
		}
	}
	if _, err := c.checkEmbedding(emb); err != nil {
		return nil, err
	}
	return []any{scope(k, layer, *c.cfg.TenantIsolation), PromptHash(prompt), pgvector.NewVector(emb),
		k.Tenant, k.CaseID, layer, lineForm(k.Prompt), []byte(response), c.cfg.TTL[layer].Seconds(), c.guard.extract(prompt).key()}, nil
}

// InvalidateCase deletes every stored answer of a diagnosis case, so none
// is served again; tenant "" means any tenant's. It returns the number of
// answers deleted.
func (c *Cache) InvalidateCase(ctx context.Context, tenant, caseID string) (int64, error) {
	if caseID == "" {
		return 0, errors.New("cache: InvalidateCase: empty case id")
	}
	tag, err := c.pool.Exec(ctx, `DELETE FROM semantic_cache WHERE case_id = $1 AND ($2 = '' OR tenant = $2)`, caseID, tenant)
	c.ForgetMemo() // even after an error: the delete may have happened
	if err != nil {
		return 0, fmt.Errorf("cache: invalidate case: %w: %w", ErrUnavailable, err)
	}
	return tag.RowsAffected(), nil
}

// InvalidateNamespace deletes the stored answers of a tenant ("" = every
// tenant) in a layer ("" = every layer); both empty empties the cache. It
// returns the number of answers deleted.
func (c *Cache) InvalidateNamespace(ctx context.Context, tenant, layer string) (int64, error) {
	tag, err := c.pool.Exec(ctx, `DELETE FROM semantic_cache WHERE ($1 = '' OR tenant = $1) AND ($2 = '' OR layer = $2)`, tenant, layer)
	c.ForgetMemo() // even after an error: the delete may have happened
	if err != nil {
		return 0, fmt.Errorf("cache: invalidate namespace: %w: %w", ErrUnavailable, err)
	}
	return tag.RowsAffected(), nil
}

// EnableMemo puts the memo (memo.go) in front of exact lookups. Call it
// only in a process that calls ForgetMemo whenever another process
// invalidates answers.
func (c *Cache) EnableMemo() {
	c.memo.CompareAndSwap(nil, newMemo(c.cfg.MemoEntries, c.cfg.MemoTTL))
}

func (c *Cache) memoLen() int64 {
	if m := c.memo.Load(); m != nil {
		return int64(m.lru.Len())
	}
	return 0
}

// ForgetMemo empties the memo: answers were invalidated somewhere (or a
// notice of that may have been missed). It does nothing without a memo.
func (c *Cache) ForgetMemo() {
	if m := c.memo.Load(); m != nil {
		m.forget()
	}
}

// PurgeExpired deletes expired answers in batches of 5,000 and returns how
// many it deleted. Expired answers are never served even before the purge;
// it only reclaims space. The scheduler runs it periodically.
func (c *Cache) PurgeExpired(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := c.pool.Exec(ctx, fmt.Sprintf(`DELETE FROM semantic_cache WHERE id IN (
  SELECT id FROM semantic_cache WHERE expires_at <= now() LIMIT %d)`, purgeBatch))
		if err != nil {
			return total, fmt.Errorf("cache: purge expired: %w: %w", ErrUnavailable, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			return total, nil
		}
	}
}

// Stats returns the counters since New.
func (c *Cache) Stats() Stats {
	return Stats{
		Lookups:        c.lookups.Load(),
		ExactHits:      c.exactHits.Load(),
		SemanticHits:   c.semHits.Load(),
		Misses:         c.misses.Load(),
		GuardRejected:  c.guardRejected.Load(),
		EntityRefused:  c.entityRefused.Load(),
		AskRefused:     c.askRefused.Load(),
		Stores:         c.stores.Load(),
		StoresShed:     c.storesShed.Load(),
		MemoHits:       c.memoHits.Load(),
		MemoEntries:    c.memoLen(),
		Errors:         c.errs.Load(),
		HitCountsLost:  c.hitsLost.Load(),
		HitCountWrites: c.hitWrites.Load(),
	}
}

// fail counts a failure and logs it, at most once per FailLogInterval with
// the number of failures not logged since. A cancelled caller is not a
// failure of the cache and is neither counted nor logged.
func (c *Cache) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	c.errs.Add(1)
	c.failMu.Lock()
	now := time.Now()
	if !c.lastFailAt.IsZero() && now.Sub(c.lastFailAt) < c.cfg.FailLogInterval {
		c.suppressed++
		c.failMu.Unlock()
		return
	}
	suppressed := c.suppressed
	c.lastFailAt, c.suppressed = now, 0
	c.failMu.Unlock()
	c.logger.Warn("semantic cache unavailable, bypassing it", "error", err, "suppressed_since_last_warning", suppressed)
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second))
}
