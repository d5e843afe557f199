package cache

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	pgxvector "github.com/pgvector/pgvector-go/pgx"
)

// Layers named by the design document, each with its own TTL.
const (
	LayerRouter      = "router"
	LayerAgent       = "agent"
	LayerSynthesizer = "synthesizer"
)

// Defaults of Config. The pgvector settings are the ones measured in
// DESIGN.md ("pgvector facts").
const (
	ThresholdDefault           = 0.95
	DefaultLayerDefault        = LayerAgent
	EfSearchDefault            = 40
	MaxScanTuplesDefault       = 5000
	SmallScopeRowsDefault      = 500
	CandidatesDefault          = 5
	IndexMDefault              = 16
	IndexEfConstructionDefault = 64
	FailLogIntervalDefault     = time.Minute
	QueryTimeoutDefault        = 500 * time.Millisecond
	HitFlushDefault            = time.Second
	MemoEntriesDefault         = 10000
	MemoTTLDefault             = 10 * time.Second
)

// TTLDefault returns the default time to live per layer: router 24 h, agent
// 4 h, synthesizer 2 h. It returns a new map on each call.
func TTLDefault() map[string]time.Duration {
	return map[string]time.Duration{
		LayerRouter:      24 * time.Hour,
		LayerAgent:       4 * time.Hour,
		LayerSynthesizer: 2 * time.Hour,
	}
}

// ProtectedPatternsDefault returns the default protected-entity patterns
// (see Config.ProtectedPatterns). It returns a new slice on each call.
//
//   - Diagnostic trouble codes, e.g. P0A80, U0100, c1234:
//     (?i)\b[PCBU][0-9A-F]{4}\b
//   - ECU identifiers: "ECU" then an upper-case/digit name, e.g. ECU BMS,
//     ECU-7E0, ECU_GW01 (not "ECU reports"): \bECU[-_ ]?[A-Z0-9]+\b
//   - Part-number-like tokens: 2 to 4 groups of upper-case letters and
//     digits joined by hyphens, e.g. 8W0-907-115, 5Q0-937-084-B:
//     \b[0-9A-Z]{2,5}(?:-[0-9A-Z]{2,6}){1,3}\b. VINs (17 characters, no
//     hyphens) do not match; ISO dates would, which is why dates are
//     ignored first (IgnoredPatternsDefault).
//   - Version numbers, e.g. 2.4.1, v10.3: \bv?\d+\.\d+(\.\d+)*\b
//   - Any other standalone number (car 12, 120 km/h, batch 7): \b\d+\b.
//     A lexical embedding scores "request 367" and "request 7" at 0.95,
//     so without it questions about different things would share an
//     answer. Timestamps and VINs are masked first and do not count.
func ProtectedPatternsDefault() []string {
	return []string{
		`(?i)\b[PCBU][0-9A-F]{4}\b`,
		`\bECU[-_ ]?[A-Z0-9]+\b`,
		`\b[0-9A-Z]{2,5}(?:-[0-9A-Z]{2,6}){1,3}\b`,
		`\bv?\d+\.\d+(?:\.\d+)*\b`,
		`\b\d+\b`,
	}
}

// IgnoredPatternsDefault returns the default patterns masked before the
// protected patterns are applied and before a prompt is embedded (see
// Config.IgnoredPatterns): what tells one car, one driver or one moment from
// another, not one question from another. A question about one car at one
// time is the same question about another car at another time, and its
// answer is served with these values substituted (see the package
// documentation, "Lookup"). It returns a new slice on each call. In order
// (each pattern sees the text the earlier ones masked):
//
//   - ISO 8601 dates and timestamps, e.g. 2024-11-03,
//     2024-11-03T08:15:22.123Z, 2024-11-03 08:15:22+08:00: masked first so
//     that dates do not read as part numbers nor fractional seconds as
//     version numbers.
//     \b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?
//   - Clock times, e.g. 08:15, 08:15:22.5:
//     \b\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\b
//   - VINs (ISO 3779: 17 letters and digits, no I, O or Q), e.g.
//     LSVAU2180N2183294: \b[A-HJ-NPR-Z0-9]{17}\b
//   - Phone numbers in E.164 form, e.g. +8613812345678, +4915112345678:
//     \+[1-9]\d{7,14}\b. Before the Unix-time pattern, so that a "+1…"
//     number is a phone, never a time.
//   - Chinese mobile numbers, 11 digits, e.g. 13812345678: \b1[3-9]\d{9}\b.
//     Unix times have 10 or 13 digits, so neither pattern matches the
//     other's numbers; another 11-digit number starting 13 to 19 (a serial
//     number) is masked too, and then no longer tells two prompts apart.
//   - Unix times in seconds or milliseconds (2001-2033), e.g. 1730621722,
//     1730621722123: \b1\d{9}(?:\d{3})?\b
//   - Chinese licence plates: a province character, the city letter, an
//     optional middle dot, then 5 letters or digits (6 on new-energy
//     plates) or 4 and one of 挂学警港澳, e.g. 京A12345, 粤B·D12345,
//     沪AD12345: [京津…琼][A-HJ-NP-Z][·•]?(?:[A-HJ-NP-Z0-9]{5,6}\b|[A-HJ-NP-Z0-9]{4}[挂学警港澳]).
//     There is no generic plate pattern: without a province character, a
//     plate (AB-123-CD, B-MW 1234) has the shape of the part numbers the
//     guard protects, and masking those would let questions about
//     different parts share an answer. A fleet with one known plate
//     format adds its own pattern.
func IgnoredPatternsDefault() []string {
	return []string{
		`\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?`,
		`\b\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\b`,
		`\b[A-HJ-NPR-Z0-9]{17}\b`, // VIN (ISO 3779: no I, O, Q)
		`\+[1-9]\d{7,14}\b`,       // E.164 phone number
		`\b1[3-9]\d{9}\b`,         // Chinese mobile number
		`\b1\d{9}(?:\d{3})?\b`,    // Unix time in s or ms (2001-2033)
		`[京津沪渝冀豫云辽黑湘皖鲁新苏浙赣鄂桂甘晋蒙陕吉闽贵粤青藏川宁琼][A-HJ-NP-Z][·•]?(?:[A-HJ-NP-Z0-9]{5,6}\b|[A-HJ-NP-Z0-9]{4}[挂学警港澳])`, // Chinese licence plate
	}
}

// Config configures a Cache. Zero fields mean the documented default.
type Config struct {
	// Threshold is the least cosine similarity of a semantic hit, in
	// (0, 1]. Default ThresholdDefault (0.95).
	Threshold float64 `yaml:"threshold"`
	// TTL is the time to live of a stored answer per layer. Layers not
	// given keep their default (TTLDefault: router 24 h, agent 4 h,
	// synthesizer 2 h); extra layers may be added. Every TTL must be > 0.
	TTL map[string]time.Duration `yaml:"ttl"`
	// DefaultLayer is the layer of a Key whose Layer is empty. Default
	// DefaultLayerDefault ("agent"). It must have a TTL.
	DefaultLayer string `yaml:"default_layer"`
	// TenantIsolation puts the tenant into the scope, so one tenant's
	// answers never serve another. nil means true.
	TenantIsolation *bool `yaml:"tenant_isolation"`
	// ProtectedPatterns are regular expressions (RE2) of entities that
	// must agree for a semantic hit: for each pattern, the multiset of its
	// matches in the stored prompt and in the new one must be equal
	// (compared case-insensitively). nil means ProtectedPatternsDefault;
	// an empty non-nil slice disables the guard.
	ProtectedPatterns []string `yaml:"protected_patterns"`
	// IgnoredPatterns are regular expressions whose matches are blanked
	// before ProtectedPatterns are applied, and masked out of the text
	// that is embedded and of the texts compared for an added
	// instruction. A semantic hit's answer is served with the stored
	// prompt's matches replaced by the asked prompt's (see the package
	// documentation). nil means IgnoredPatternsDefault (dates, timestamps,
	// clock times, VINs, phone numbers, Unix times, Chinese plates); an
	// empty non-nil slice ignores nothing.
	IgnoredPatterns []string `yaml:"ignored_patterns"`
	// EfSearch is hnsw.ef_search, set per connection by AfterConnectWith:
	// the HNSW candidate list size, 1..1000. Default EfSearchDefault (40):
	// recall 0.968 at 100k rows; 100 gives 0.994 at twice the latency.
	EfSearch int `yaml:"ef_search"`
	// MaxScanTuples is hnsw.max_scan_tuples, set per connection by
	// AfterConnectWith: how far an iterative HNSW scan walks before giving
	// up. Default MaxScanTuplesDefault (5000; pgvector's 20,000 costs
	// 63-73 ms per lookup in a scope with no live rows).
	MaxScanTuples int `yaml:"max_scan_tuples"`
	// SmallScopeRows is the number of live rows of a scope below which a
	// semantic lookup scans the scope exactly instead of walking the HNSW
	// index. Default SmallScopeRowsDefault (500): an exact scan costs about
	// 1.2-2.3 µs per row and an HNSW lookup about 0.5 ms, while an HNSW walk
	// in a scope with few live rows may run to MaxScanTuples (26 ms). See
	// the package documentation. Negative means always use the index.
	SmallScopeRows int `yaml:"small_scope_rows"`
	// IndexM and IndexEfConstruction are the HNSW index's build
	// parameters (pgvector's m, 2..100, and ef_construction, at least
	// 2*m): the cost of every store's index insert against the graph's
	// quality. Defaults IndexMDefault and IndexEfConstructionDefault (pgvector's
	// own). They apply when the index is created: Prepare warns, with the
	// statements that rebuild it, when it was built with others.
	IndexM              int `yaml:"index_m"`
	IndexEfConstruction int `yaml:"index_ef_construction"`
	// Candidates is how many nearest rows a semantic lookup fetches, so
	// that one rejected by the protected-entity guard can give way to the
	// next. Default CandidatesDefault (5), at most 100.
	Candidates int `yaml:"candidates"`
	// QueryTimeout bounds each statement of Lookup and Store (the embedder
	// has its own timeout). Default QueryTimeoutDefault (500 ms).
	QueryTimeout time.Duration `yaml:"query_timeout"`
	// HitFlushInterval is how often hit counts gathered by Lookup are
	// written (see Start). Default HitFlushDefault (1 s).
	HitFlushInterval time.Duration `yaml:"hit_flush_interval"`
	// FailLogInterval is the least time between two warnings about the
	// database or embedder failing. Default FailLogIntervalDefault (1 min).
	FailLogInterval time.Duration `yaml:"fail_log_interval"`
	// MemoEntries is how many exact answers the memo keeps (least
	// recently used first out), once EnableMemo turns it on. Default
	// MemoEntriesDefault (10,000).
	MemoEntries int `yaml:"memo_entries"`
	// MemoTTL is the longest an answer stays in the memo: how long an
	// answer invalidated elsewhere can still be served here should the
	// notice be lost (memo.go). Default MemoTTLDefault (10 s).
	MemoTTL time.Duration `yaml:"memo_ttl"`
}

// WithDefaults returns a copy of c with defaults filled in. Maps and slices
// are copied so the caller's values are never shared.
func (c Config) WithDefaults() Config {
	if c.Threshold == 0 {
		c.Threshold = ThresholdDefault
	}
	ttl := TTLDefault()
	maps.Copy(ttl, c.TTL)
	c.TTL = ttl
	if c.DefaultLayer == "" {
		c.DefaultLayer = DefaultLayerDefault
	}
	if c.TenantIsolation == nil {
		on := true
		c.TenantIsolation = &on
	} else {
		v := *c.TenantIsolation
		c.TenantIsolation = &v
	}
	if c.ProtectedPatterns == nil {
		c.ProtectedPatterns = ProtectedPatternsDefault()
	} else {
		c.ProtectedPatterns = append([]string{}, c.ProtectedPatterns...)
	}
	if c.IgnoredPatterns == nil {
		c.IgnoredPatterns = IgnoredPatternsDefault()
	} else {
		c.IgnoredPatterns = append([]string{}, c.IgnoredPatterns...)
	}
	if c.EfSearch == 0 {
		c.EfSearch = EfSearchDefault
	}
	if c.MaxScanTuples == 0 {
		c.MaxScanTuples = MaxScanTuplesDefault
	}
	if c.SmallScopeRows == 0 {
		c.SmallScopeRows = SmallScopeRowsDefault
	}
	if c.Candidates == 0 {
		c.Candidates = CandidatesDefault
	}
	if c.IndexM == 0 {
		c.IndexM = IndexMDefault
	}
	if c.IndexEfConstruction == 0 {
		c.IndexEfConstruction = max(IndexEfConstructionDefault, 2*c.IndexM)
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = QueryTimeoutDefault
	}
	if c.HitFlushInterval == 0 {
		c.HitFlushInterval = HitFlushDefault
	}
	if c.FailLogInterval == 0 {
		c.FailLogInterval = FailLogIntervalDefault
	}
	if c.MemoEntries == 0 {
		c.MemoEntries = MemoEntriesDefault
	}
	if c.MemoTTL == 0 {
		c.MemoTTL = MemoTTLDefault
	}
	return c
}

// Validate checks a Config that went through WithDefaults.
func (c Config) Validate() error {
	if !(c.Threshold > 0 && c.Threshold <= 1) {
		return fmt.Errorf("cache: Config.Threshold %v: want 0 < threshold <= 1", c.Threshold)
	}
	if c.MemoEntries < 1 || c.MemoTTL <= 0 {
		return fmt.Errorf("cache: Config.MemoEntries %d, MemoTTL %s: want both > 0", c.MemoEntries, c.MemoTTL)
	}
	for layer, ttl := range c.TTL {
		if layer == "" {
			return fmt.Errorf("cache: Config.TTL: empty layer name")
		}
		if ttl <= 0 {
			return fmt.Errorf("cache: Config.TTL[%q] %s: want > 0", layer, ttl)
		}
	}
	if _, ok := c.TTL[c.DefaultLayer]; !ok {
		return fmt.Errorf("cache: Config.DefaultLayer %q: no TTL for it", c.DefaultLayer)
	}
	for i, p := range c.ProtectedPatterns {
		if _, err := regexp.Compile(p); err != nil {
			return fmt.Errorf("cache: Config.ProtectedPatterns[%d]: %w", i, err)
		}
	}
	for i, p := range c.IgnoredPatterns {
		if _, err := regexp.Compile(p); err != nil {
			return fmt.Errorf("cache: Config.IgnoredPatterns[%d]: %w", i, err)
		}
	}
	if c.EfSearch < 1 || c.EfSearch > 1000 {
		return fmt.Errorf("cache: Config.EfSearch %d: want 1..1000", c.EfSearch)
	}
	if c.MaxScanTuples < 1 {
		return fmt.Errorf("cache: Config.MaxScanTuples %d: want >= 1", c.MaxScanTuples)
	}
	if c.IndexM < 2 || c.IndexM > 100 {
		return fmt.Errorf("cache: Config.IndexM %d: want 2..100 (pgvector's limits)", c.IndexM)
	}
	if c.IndexEfConstruction < 2*c.IndexM || c.IndexEfConstruction > 1000 {
		return fmt.Errorf("cache: Config.IndexEfConstruction %d: want 2*IndexM (%d)..1000 (pgvector's limits)", c.IndexEfConstruction, 2*c.IndexM)
	}
	if c.Candidates < 1 || c.Candidates > 100 {
		return fmt.Errorf("cache: Config.Candidates %d: want 1..100", c.Candidates)
	}
	if c.QueryTimeout < 0 {
		return fmt.Errorf("cache: Config.QueryTimeout %s: want > 0", c.QueryTimeout)
	}
	if c.HitFlushInterval < 0 {
		return fmt.Errorf("cache: Config.HitFlushInterval %s: want > 0", c.HitFlushInterval)
	}
	if c.FailLogInterval < 0 {
		return fmt.Errorf("cache: Config.FailLogInterval %s: want > 0", c.FailLogInterval)
	}
	return nil
}

// AfterConnect prepares a new pool connection for the cache with the
// default settings; it is AfterConnectWith(Config{}). Whoever builds the
// pgxpool sets it as pgxpool.Config.AfterConnect.
func AfterConnect(ctx context.Context, conn *pgx.Conn) error {
	return afterConnect(ctx, conn, Config{}.WithDefaults())
}

// AfterConnectWith returns a pgxpool AfterConnect hook that registers
// pgvector's types on the connection and sets, for its whole life:
//
//   - hnsw.iterative_scan = relaxed_order: without it a filtered HNSW query
//     silently returns nothing for some lookups once the planner prefers the
//     index (6.6% at 100k rows, DESIGN.md);
//   - hnsw.ef_search = cfg.EfSearch;
//   - hnsw.max_scan_tuples = cfg.MaxScanTuples.
//
// These settings only affect HNSW scans, so the hook is harmless on a pool
// shared with other packages. New refuses a pool whose connections lack it.
func AfterConnectWith(cfg Config) func(context.Context, *pgx.Conn) error {
	cfg = cfg.WithDefaults()
	return func(ctx context.Context, conn *pgx.Conn) error {
		return afterConnect(ctx, conn, cfg)
	}
}

func afterConnect(ctx context.Context, conn *pgx.Conn, cfg Config) error {
	if err := pgxvector.RegisterTypes(ctx, conn); err != nil {
		return fmt.Errorf("cache: after connect: register pgvector types: %w", err)
	}
	// Integers formatted by us, no user text: a single simple-protocol
	// round trip.
	sql := fmt.Sprintf("SET hnsw.iterative_scan = relaxed_order; SET hnsw.ef_search = %d; SET hnsw.max_scan_tuples = %d",
		cfg.EfSearch, cfg.MaxScanTuples)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("cache: after connect: set hnsw options: %w", err)
	}
	return nil
}
