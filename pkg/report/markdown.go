package report

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// words holds the report's texts in one language. The markdown keeps to
// what WeCom and DingTalk robots render (headings, bold, "- " lists): no
// tables.
type words struct {
	title, period, overview, total, hitRate, exact, semantic          string
	coalesced, saved, fallbacks, latency, tokens, input, output, cost string
	usage, calls, queue, max, trend, trendLegend, noData, colon       string
	compressed                                                        string
	priorities                                                        map[int]string
	statuses                                                          map[string]string
}

var lexicon = map[string]words{
	"zh": {
		title: "Bulwark 日报", period: "统计区间", overview: "总览", total: "请求总数",
		hitRate: "缓存命中率", exact: "精确", semantic: "语义",
		coalesced: "合并请求", saved: "共节省调用", fallbacks: "跨供应商降级",
		latency: "端到端延迟（完成且未命中缓存）", tokens: "Token", input: "输入", output: "输出", cost: "估算成本",
		usage: "按供应商 / 档位", calls: "次", queue: "排队等待（按优先级）", max: "最长",
		trend: "429 趋势（按小时）", trendLegend: "请求 / 失败 / 重试 / 平均尝试 / 限流失败 / 供应商 429",
		noData: "无", colon: "：", compressed: "压缩节省输入 Token",
		priorities: map[int]string{1: "P1 紧急", 2: "P2 高", 3: "P3 普通", 4: "P4 低"},
		statuses: map[string]string{"completed": "完成", "failed": "失败", "cancelled": "取消",
			"queued": "排队", "running": "执行中", "waiting": "等待"},
	},
	"en": {
		title: "Bulwark daily report", period: "Period", overview: "Overview", total: "Requests",
		hitRate: "Cache hit rate", exact: "exact", semantic: "semantic",
		coalesced: "Coalesced requests", saved: "calls saved in all", fallbacks: "Fallbacks to the other provider",
		latency: "End-to-end latency (completed, not cached)", tokens: "Tokens", input: "input", output: "output", cost: "estimated cost",
		usage: "By provider / tier", calls: "calls", queue: "Queue wait by priority", max: "max",
		trend: "429 trend (hourly)", trendLegend: "requests / failed / retried / avg attempts / rate-limited failures / provider 429s",
		noData: "none", colon: ": ", compressed: "Input tokens saved by compression",
		priorities: map[int]string{1: "P1 critical", 2: "P2 high", 3: "P3 normal", 4: "P4 low"},
		statuses:   map[string]string{},
	},
}

func lexiconFor(lang string) words {
	l := strings.ToLower(lang)
	if strings.HasPrefix(l, "en") {
		return lexicon["en"]
	}
	return lexicon["zh"]
}

// statusOrder is the order statuses are listed in; others follow sorted.
var statusOrder = []string{"completed", "failed", "cancelled", "waiting", "running", "queued"}

// Title is the report's headline, e.g. "Bulwark 日报 2026-03-01"; it is the
// e-mail subject.
func (r *Report) Title(lang string) string {
	return lexiconFor(lang).title + " " + r.From.Format(time.DateOnly)
}

// Markdown renders the report in lang: "zh-CN"/"zh" (the default; unknown
// tags fall back to it) or "en". Times are shown in From's location. Hours
// without requests are left out of the trend.
func (r *Report) Markdown(lang string) string {
	w := lexiconFor(lang)
	var b strings.Builder
	line := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	item := func(label, format string, a ...any) { line("- %s%s"+format, append([]any{label, w.colon}, a...)...) }

	line("# %s", r.Title(lang))
	line("")
	line("**%s**%s%s — %s", w.period, w.colon, r.From.Format("2006-01-02 15:04"), r.To.In(r.From.Location()).Format("2006-01-02 15:04 MST"))
	line("")

	line("## %s", w.overview)
	item(w.total, "%d%s", r.Total, r.statusList(w))
	item(w.hitRate, "%s (%s %d, %s %d)", pct(r.Cache.HitRate), w.exact, r.Cache.Exact, w.semantic, r.Cache.Semantic)
	item(w.coalesced, "%d; %s %d (≈ %s)", r.Cache.Coalesced, w.saved, r.Cache.SavedCalls, usd(r.Cache.EstimatedSavedUSD))
	item(w.fallbacks, "%d%s", r.Fallbacks, r.fallbackList())
	if r.Latency.Count > 0 {
		item(w.latency, "P50 %s, P95 %s (n=%d)", ms(r.Latency.P50Ms), ms(r.Latency.P95Ms), r.Latency.Count)
	}
	item(w.tokens, "%s %d, %s %d; %s %s", w.input, r.InputTokens, w.output, r.OutputTokens, w.cost, usd(r.CostUSD))
	if r.TokensSaved > 0 {
		item(w.compressed, "%d", r.TokensSaved)
	}
	line("")

	line("## %s", w.usage)
	if len(r.Usage) == 0 {
		line("- %s", w.noData)
	}
	for _, u := range r.Usage {
		item(u.Provider+"/"+u.Tier, "%d %s, %s %d, %s %d, %s", u.Requests, w.calls, w.input, u.InputTokens, w.output, u.OutputTokens, usd(u.CostUSD))
	}
	line("")

	line("## %s", w.queue)
	if len(r.QueueWait) == 0 {
		line("- %s", w.noData)
	}
	for _, q := range r.QueueWait {
		name, ok := w.priorities[q.Priority]
		if !ok {
			name = fmt.Sprintf("P%d", q.Priority)
		}
		item(name, "n=%d, P50 %s, P95 %s, %s %s", q.Count, ms(q.P50Ms), ms(q.P95Ms), w.max, ms(float64(q.MaxMs)))
	}
	line("")

	line("## %s", w.trend)
	line("%s", w.trendLegend)
	line("")
	hourFormat := "15:04"
	if r.To.Sub(r.From) > 24*time.Hour {
		hourFormat = "01-02 15:04"
	}
	shown := 0
	for _, h := range r.Hourly {
		if h.Requests == 0 && (h.RateLimitedCalls == nil || *h.RateLimitedCalls == 0) {
			continue
		}
		shown++
		provider := "—"
		if h.RateLimitedCalls != nil {
			provider = fmt.Sprint(*h.RateLimitedCalls)
		}
		line("- %s  %d / %d / %d / %.2f / %d / %s", h.Start.Format(hourFormat), h.Requests, h.Failed, h.Retried, h.AvgAttempts, h.RateLimitedFailures, provider)
	}
	if shown == 0 {
		line("- %s", w.noData)
	}
	return strings.TrimRight(b.String(), "\n")
}

// statusList renders " (完成 8 · 失败 2)" in a fixed order.
func (r *Report) statusList(w words) string {
	if len(r.ByStatus) == 0 {
		return ""
	}
	var keys []string
	for _, s := range statusOrder {
		if _, ok := r.ByStatus[s]; ok {
			keys = append(keys, s)
		}
	}
	var rest []string
	for s := range r.ByStatus {
		if !slices.Contains(statusOrder, s) {
			rest = append(rest, s)
		}
	}
	slices.Sort(rest)
	parts := make([]string, 0, len(r.ByStatus))
	for _, s := range append(keys, rest...) {
		name := s
		if t, ok := w.statuses[s]; ok {
			name = t
		}
		parts = append(parts, fmt.Sprintf("%s %d", name, r.ByStatus[s]))
	}
	return " (" + strings.Join(parts, " · ") + ")"
}

// fallbackList renders " (claude/sonnet → openai/gpt4o 3, ...)".
func (r *Report) fallbackList() string {
	if len(r.FallbackRoutes) == 0 {
		return ""
	}
	parts := make([]string, len(r.FallbackRoutes))
	for i, f := range r.FallbackRoutes {
		parts[i] = fmt.Sprintf("%s/%s → %s/%s %d", f.Provider, f.Tier, f.ServedProvider, f.ServedTier, f.Count)
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", f*100) }
func usd(f float64) string { return fmt.Sprintf("$%.4f", f) }
func ms(f float64) string  { return fmt.Sprintf("%.0f ms", f) }
