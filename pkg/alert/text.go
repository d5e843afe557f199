package alert

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Texts per language. The markdown is the subset WeCom and DingTalk robots
// both render: headings, bold, quotes, "- " lists; no tables, no colours.
type texts struct {
	kinds                  map[Kind]string
	severity               map[string]string
	subject, summary, time string
	colon                  string
}

var langTexts = map[string]texts{
	"zh": {
		kinds: map[Kind]string{
			KindBreakerOpen:       "熔断器打开",
			KindBreakerClosed:     "熔断器恢复",
			KindTierExhausted:     "模型档位的 Key 全部冷却",
			KindTierRecovered:     "模型档位恢复可用",
			KindKeyQuotaExhausted: "Key 额度耗尽，已停用",
			KindKeyEnabled:        "Key 已重新启用",
			KindGeneric:           "告警",
			KindDailyReport:       "日报",
		},
		severity: map[string]string{SeverityCritical: "🔴 严重", SeverityWarning: "🟠 警告", SeverityInfo: "🟢 通知"},
		subject:  "对象", summary: "说明", time: "时间", colon: "：",
	},
	"en": {
		kinds: map[Kind]string{
			KindBreakerOpen:       "Circuit breaker opened",
			KindBreakerClosed:     "Circuit breaker closed",
			KindTierExhausted:     "Every key of the tier is cooling",
			KindTierRecovered:     "Tier available again",
			KindKeyQuotaExhausted: "Key out of quota, disabled",
			KindKeyEnabled:        "Key enabled again",
			KindGeneric:           "Alert",
			KindDailyReport:       "Daily report",
		},
		severity: map[string]string{SeverityCritical: "🔴 CRITICAL", SeverityWarning: "🟠 WARNING", SeverityInfo: "🟢 INFO"},
		subject:  "Subject", summary: "Summary", time: "Time", colon: ": ",
	},
}

func textsFor(lang string) texts {
	l, ok := normalizeLang(lang)
	if !ok {
		l = "zh"
	}
	return langTexts[l]
}

func (t texts) kind(k Kind) string {
	if s, ok := t.kinds[k]; ok {
		return s
	}
	return string(k)
}

func (t texts) sev(e Event) string {
	s := e.Severity
	if s == "" {
		s = defaultSeverity(e.Kind)
	}
	if v, ok := t.severity[s]; ok {
		return v
	}
	return s
}

// Title is a one-line headline of e, e.g. "[🔴 严重] 熔断器打开 claude/sonnet";
// DingTalk shows it in the notification preview.
func Title(e Event, lang string) string {
	t := textsFor(lang)
	s := fmt.Sprintf("[%s] %s", t.sev(e), t.kind(e.Kind))
	if e.Subject != "" {
		s += " " + e.Subject
	}
	return s
}

// Text renders e as markdown in lang ("zh-CN"/"zh", the default, or "en";
// unknown tags fall back to Chinese). A KindDailyReport event renders as its
// Summary verbatim: the report is already a markdown document.
func Text(e Event, lang string) string {
	if e.Kind == KindDailyReport {
		return e.Summary
	}
	t := textsFor(lang)
	var b strings.Builder
	fmt.Fprintf(&b, "### %s %s\n\n", t.sev(e), t.kind(e.Kind))
	if e.Subject != "" {
		fmt.Fprintf(&b, "**%s**%s%s\n\n", t.subject, t.colon, e.Subject)
	}
	if e.Summary != "" {
		fmt.Fprintf(&b, "**%s**%s%s\n\n", t.summary, t.colon, e.Summary)
	}
	if len(e.Details) > 0 {
		keys := make([]string, 0, len(e.Details))
		for k := range e.Details {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "- %s: %s\n", k, e.Details[k])
		}
		b.WriteString("\n")
	}
	if !e.At.IsZero() {
		fmt.Fprintf(&b, "**%s**%s%s\n", t.time, t.colon, e.At.Format(time.DateTime+" MST"))
	}
	return strings.TrimRight(b.String(), "\n")
}
