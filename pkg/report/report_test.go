package report

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5/pgxpool"

	"bulwark/pkg/testkit/testenv"
)

// cst is the deployment's zone in the seed document; whole-hour offset.
var cst = time.FixedZone("CST", 8*3600)

// from is 2026-03-01 08:00 CST = 00:00 UTC.
var (
	from = time.Date(2026, 3, 1, 8, 0, 0, 0, cst)
	to   = from.Add(24 * time.Hour)
)

func ptr[T any](v T) *T { return &v }

// row is one requests row; nil pointers are NULL.
type row struct {
	id, status, provider, tier string
	priority                   int
	servedProvider, servedTier *string
	attempts                   int
	cached                     string
	in, out                    int
	cost                       float64
	created                    time.Time
	took                       *time.Duration // finished_at - created_at
	queueWait                  *int64
	err                        *string
}

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func insert(t *testing.T, pool *pgxpool.Pool, rows []row) {
	t.Helper()
	for _, r := range rows {
		var finished *time.Time
		if r.took != nil {
			finished = ptr(r.created.Add(*r.took))
		}
		_, err := pool.Exec(context.Background(), `
INSERT INTO requests (id, tenant, priority, status, provider, model_tier, served_provider, served_tier,
                      attempts, cached, input_tokens, output_tokens, cost_usd, created_at, started_at,
                      finished_at, queue_wait_ms, error)
VALUES ($1, 't', $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14, $15, $16)`,
			r.id, r.priority, r.status, r.provider, r.tier, r.servedProvider, r.servedTier,
			r.attempts, r.cached, r.in, r.out, r.cost, r.created, finished, r.queueWait, r.err)
		if err != nil {
			t.Fatalf("insert %s: %v", r.id, err)
		}
	}
}

// fixture is a known day: ten requests in two hours (UTC 00 and 05), one
// just before the period and one at its end (excluded: [from, to)).
func fixture() []row {
	h0 := from.Add(10 * time.Minute)
	h5 := from.Add(5*time.Hour + 20*time.Minute)
	d := func(s float64) *time.Duration { return ptr(time.Duration(s * float64(time.Second))) }
	return []row{
		{id: "r1", priority: 1, status: "completed", provider: "claude", tier: "sonnet", servedProvider: ptr("claude"), servedTier: ptr("sonnet"),
			attempts: 1, cached: "none", in: 1000, out: 200, cost: 0.01, created: h0, took: d(2), queueWait: ptr[int64](100)},
		{id: "r2", priority: 1, status: "completed", provider: "claude", tier: "sonnet", servedProvider: ptr("openai"), servedTier: ptr("gpt4o"),
			attempts: 3, cached: "none", in: 2000, out: 300, cost: 0.02, created: h0, took: d(4), queueWait: ptr[int64](300)},
		{id: "r3", priority: 2, status: "completed", provider: "claude", tier: "haiku", servedProvider: ptr("claude"), servedTier: ptr("haiku"),
			cached: "exact", created: h0, took: d(0.01)},
		{id: "r4", priority: 2, status: "completed", provider: "claude", tier: "haiku", cached: "semantic", created: h0, took: d(0.02)},
		{id: "r5", priority: 3, status: "completed", provider: "openai", tier: "gpt4o", servedProvider: ptr("claude"), servedTier: ptr("sonnet"),
			cached: "coalesced", created: h0, took: d(3)},
		{id: "r6", priority: 3, status: "failed", provider: "claude", tier: "sonnet", attempts: 5, cached: "none", created: h0,
			took: d(300), queueWait: ptr[int64](1000), err: ptr("rate_limited: every key returned 429")},
		{id: "r7", priority: 4, status: "failed", provider: "openai", tier: "gpt4o", servedProvider: ptr("openai"), servedTier: ptr("gpt4o"),
			attempts: 2, cached: "none", created: h5, took: d(5), queueWait: ptr[int64](2000), err: ptr("transient: HTTP 500")},
		{id: "r8", priority: 2, status: "completed", provider: "openai", tier: "gpt4o-mini", servedProvider: ptr("openai"), servedTier: ptr("gpt4o-mini"),
			attempts: 2, cached: "none", in: 500, out: 100, cost: 0.001, created: h5, took: d(1), queueWait: ptr[int64](500)},
		{id: "r9", priority: 1, status: "cancelled", provider: "claude", tier: "sonnet", cached: "none", created: h5},
		{id: "r10", priority: 3, status: "queued", provider: "claude", tier: "sonnet", cached: "none", created: from.Add(5*time.Hour + 59*time.Minute)},
		// Outside [from, to).
		{id: "before", priority: 1, status: "completed", provider: "claude", tier: "sonnet", servedProvider: ptr("claude"), servedTier: ptr("sonnet"),
			attempts: 1, cached: "none", in: 9999, cost: 9, created: from.Add(-time.Second), took: d(1), queueWait: ptr[int64](9)},
		{id: "at-end", priority: 1, status: "failed", provider: "claude", tier: "sonnet", attempts: 9, cached: "exact", created: to, err: ptr("429")},
	}
}

func TestBuild(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	insert(t, pool, fixture())
	r, err := Build(context.Background(), pool, from, to)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}

	if r.Total != 10 {
		t.Errorf("Total = %d, want 10", r.Total)
	}
	if diff := cmp.Diff(map[string]int64{"completed": 6, "failed": 2, "cancelled": 1, "queued": 1}, r.ByStatus); diff != "" {
		t.Errorf("ByStatus (-want +got):\n%s", diff)
	}
	approx := cmpopts.EquateApprox(0, 1e-9)
	// Average completed provider call: (0.01+0.02+0.001)/3; 3 calls saved.
	wantCache := CacheStats{Exact: 1, Semantic: 1, Coalesced: 1, HitRate: 0.2, SavedCalls: 3, EstimatedSavedUSD: 0.031}
	if diff := cmp.Diff(wantCache, r.Cache, approx); diff != "" {
		t.Errorf("Cache (-want +got):\n%s", diff)
	}
	if r.Fallbacks != 1 {
		t.Errorf("Fallbacks = %d, want 1 (r2; r5 is a coalesced answer, not a call)", r.Fallbacks)
	}
	if diff := cmp.Diff([]FallbackRoute{{"claude", "sonnet", "openai", "gpt4o", 1}}, r.FallbackRoutes); diff != "" {
		t.Errorf("FallbackRoutes (-want +got):\n%s", diff)
	}
	wantUsage := []Usage{
		{Provider: "claude", Tier: "sonnet", Requests: 1, InputTokens: 1000, OutputTokens: 200, CostUSD: 0.01},
		{Provider: "openai", Tier: "gpt4o", Requests: 2, InputTokens: 2000, OutputTokens: 300, CostUSD: 0.02},
		{Provider: "openai", Tier: "gpt4o-mini", Requests: 1, InputTokens: 500, OutputTokens: 100, CostUSD: 0.001},
	}
	if diff := cmp.Diff(wantUsage, r.Usage, approx); diff != "" {
		t.Errorf("Usage (-want +got):\n%s", diff)
	}
	if r.InputTokens != 3500 || r.OutputTokens != 600 || math.Abs(r.CostUSD-0.031) > 1e-9 {
		t.Errorf("totals = %d in, %d out, $%f; want 3500, 600, $0.031", r.InputTokens, r.OutputTokens, r.CostUSD)
	}
	// percentile_cont interpolates: P1 waits 100 and 300 → p50 200, p95 290.
	wantWait := []QueueWait{
		{Priority: 1, Count: 2, P50Ms: 200, P95Ms: 290, MaxMs: 300},
		{Priority: 2, Count: 1, P50Ms: 500, P95Ms: 500, MaxMs: 500},
		{Priority: 3, Count: 1, P50Ms: 1000, P95Ms: 1000, MaxMs: 1000},
		{Priority: 4, Count: 1, P50Ms: 2000, P95Ms: 2000, MaxMs: 2000},
	}
	if diff := cmp.Diff(wantWait, r.QueueWait, approx); diff != "" {
		t.Errorf("QueueWait (-want +got):\n%s", diff)
	}
	// Completed, not cached: 2000, 4000, 1000 ms → p50 2000, p95 3800.
	if diff := cmp.Diff(Latency{Count: 3, P50Ms: 2000, P95Ms: 3800}, r.Latency, cmpopts.EquateApprox(0, 1e-6)); diff != "" {
		t.Errorf("Latency (-want +got):\n%s", diff)
	}

	if len(r.Hourly) != 24 {
		t.Fatalf("len(Hourly) = %d, want 24", len(r.Hourly))
	}
	for i, h := range r.Hourly {
		if want := from.Add(time.Duration(i) * time.Hour); !h.Start.Equal(want) || h.Start.Location() != cst {
			t.Fatalf("Hourly[%d].Start = %s, want %s", i, h.Start, want)
		}
	}
	wantHours := map[int]Hour{
		// r1..r6: r2 and r6 retried; attempts of callers 1, 3, 5; r6 rate limited.
		0: {Requests: 6, Failed: 1, Retried: 2, AvgAttempts: 3, RateLimitedFailures: 1},
		// r7..r10: r7 failed with a 500, not a rate limit.
		5: {Requests: 4, Failed: 1, Retried: 2, AvgAttempts: 2},
	}
	for i, h := range r.Hourly {
		want := wantHours[i]
		want.Start = h.Start
		if diff := cmp.Diff(want, h, approx); diff != "" {
			t.Errorf("Hourly[%d] (-want +got):\n%s", i, diff)
		}
	}
	if r.RateLimitedCalls != nil {
		t.Errorf("RateLimitedCalls = %d before SetRateLimitedCalls", *r.RateLimitedCalls)
	}
}

func TestBuildEmpty(t *testing.T) {
	t.Parallel()
	r, err := Build(context.Background(), setup(t), from, to)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if r.Total != 0 || r.Cache.HitRate != 0 || len(r.Usage) != 0 || len(r.Hourly) != 24 || r.Latency != (Latency{}) {
		t.Fatalf("empty report = %+v", r)
	}
	md := r.Markdown("en")
	if !strings.Contains(md, "- Requests: 0") || !strings.Contains(md, "none") {
		t.Errorf("empty markdown:\n%s", md)
	}
}

func TestBuildRange(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		from, to time.Time
	}{
		{"empty", from, from},
		{"reversed", to, from},
		{"too long", from, from.Add(MaxRange + time.Hour)},
	} {
		// Rejected before any query: no database needed.
		if _, err := Build(context.Background(), nil, c.from, c.to); !errors.Is(err, ErrRange) {
			t.Errorf("%s: Build = %v, want ErrRange", c.name, err)
		}
	}
}

func TestSetRateLimitedCalls(t *testing.T) {
	t.Parallel()
	r := &Report{From: from, To: from.Add(3 * time.Hour)}
	for i := range 3 {
		r.Hourly = append(r.Hourly, Hour{Start: from.Add(time.Duration(i) * time.Hour)})
	}
	r.SetRateLimitedCalls(map[time.Time]int64{
		from.UTC().Add(30 * time.Minute):  4, // truncated to the first hour
		from.Add(time.Hour):               2,
		from.Add(time.Hour + time.Minute): 1,
		from.Add(-time.Hour):              100, // outside: ignored
	})
	var got []int64
	for _, h := range r.Hourly {
		if h.RateLimitedCalls == nil {
			t.Fatalf("hour %s left nil", h.Start)
		}
		got = append(got, *h.RateLimitedCalls)
	}
	if diff := cmp.Diff([]int64{4, 3, 0}, got); diff != "" {
		t.Errorf("per hour (-want +got):\n%s", diff)
	}
	if r.RateLimitedCalls == nil || *r.RateLimitedCalls != 7 {
		t.Errorf("total = %v, want 7", r.RateLimitedCalls)
	}
}

func TestMarkdown(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	insert(t, pool, fixture())
	r, err := Build(context.Background(), pool, from, to)
	if err != nil {
		t.Fatal(err)
	}
	r.SetRateLimitedCalls(map[time.Time]int64{from: 7})

	cases := []struct {
		lang string
		want []string
	}{
		{"zh-CN", []string{
			"# Bulwark 日报 2026-03-01",
			"**统计区间**：2026-03-01 08:00 — 2026-03-02 08:00 CST",
			"- 请求总数：10 (完成 6 · 失败 2 · 取消 1 · 排队 1)",
			"- 缓存命中率：20.0% (精确 1, 语义 1)",
			"- 合并请求：1; 共节省调用 3 (≈ $0.0310)",
			"- 跨供应商降级：1 (claude/sonnet → openai/gpt4o 1)",
			"P50 2000 ms, P95 3800 ms (n=3)",
			"输入 3500, 输出 600; 估算成本 $0.0310",
			"- openai/gpt4o：2 次, 输入 2000, 输出 300, $0.0200",
			"- P1 紧急：n=2, P50 200 ms, P95 290 ms, 最长 300 ms",
			"- 08:00  6 / 1 / 2 / 3.00 / 1 / 7",
			"- 13:00  4 / 1 / 2 / 2.00 / 0 / 0",
		}},
		{"en", []string{
			"# Bulwark daily report 2026-03-01",
			"- Requests: 10 (completed 6 · failed 2 · cancelled 1 · queued 1)",
			"- Cache hit rate: 20.0% (exact 1, semantic 1)",
			"- Fallbacks to the other provider: 1",
			"- P4 low: n=1, P50 2000 ms, P95 2000 ms, max 2000 ms",
			"- 08:00  6 / 1 / 2 / 3.00 / 1 / 7",
		}},
	}
	for _, c := range cases {
		md := r.Markdown(c.lang)
		for _, w := range c.want {
			if !strings.Contains(md, w) {
				t.Errorf("%s markdown lacks %q:\n%s", c.lang, w, md)
			}
		}
		// Empty hours are left out of the trend.
		if strings.Contains(md, "09:00  ") {
			t.Errorf("%s markdown lists an empty hour:\n%s", c.lang, md)
		}
	}

	// JSON for the admin endpoint: snake_case, round-trips.
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"by_status"`, `"hit_rate"`, `"queue_wait"`, `"p95_ms"`, `"rate_limited_calls":7`, `"estimated_saved_usd"`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("JSON lacks %s: %s", k, b)
		}
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Total != r.Total || back.Cache != r.Cache || len(back.Hourly) != 24 {
		t.Errorf("JSON round trip lost data: %+v", back)
	}
}
