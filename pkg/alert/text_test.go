package alert

import (
	"crypto/sha256"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

var sha256New = sha256.New

func TestText(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 8, 30, 0, 0, time.FixedZone("CST", 8*3600))
	cases := []struct {
		name string
		e    Event
		lang string
		want []string
		not  []string
	}{
		{"zh default", Event{Kind: KindBreakerOpen, Subject: "claude/sonnet", Summary: "连续 3 次 429", At: at}, "",
			[]string{"### 🔴 严重 熔断器打开", "**对象**：claude/sonnet", "**说明**：连续 3 次 429", "**时间**：2026-03-01 08:30:00 CST"}, nil},
		{"zh-CN tag", Event{Kind: KindTierRecovered, Subject: "openai/gpt4o"}, "zh-CN",
			[]string{"🟢 通知 模型档位恢复可用", "openai/gpt4o"}, []string{"时间"}},
		{"english", Event{Kind: KindKeyQuotaExhausted, Subject: "oa-2", Severity: SeverityCritical}, "en",
			[]string{"### 🔴 CRITICAL Key out of quota, disabled", "**Subject**: oa-2"}, []string{"Key 额度"}},
		{"english breaker closed", Event{Kind: KindBreakerClosed, Subject: "b"}, "en-US",
			[]string{"🟢 INFO Circuit breaker closed"}, nil},
		{"unknown language falls back to zh", Event{Kind: KindKeyEnabled, Subject: "k"}, "fr",
			[]string{"Key 已重新启用"}, nil},
		{"details sorted", Event{Kind: KindGeneric, Details: map[string]string{"b": "2", "a": "1"}}, "en",
			[]string{"🟠 WARNING Alert", "- a: 1\n- b: 2"}, nil},
		{"unknown kind shown raw", Event{Kind: "queue_deep"}, "en", []string{"queue_deep"}, nil},
		{"daily report verbatim", Event{Kind: KindDailyReport, Summary: "# Report\n- x"}, "zh", []string{"# Report\n- x"}, []string{"###"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := Text(c.e, c.lang)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("Text lacks %q:\n%s", w, got)
				}
			}
			for _, w := range c.not {
				if strings.Contains(got, w) {
					t.Errorf("Text has %q:\n%s", w, got)
				}
			}
		})
	}
}

func TestTruncateUTF8(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("熔断", 3000) // 18000 bytes
	for _, n := range []int{10, 11, 12, 4096} {
		got := truncateUTF8(s, n)
		if len(got) > n || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
			t.Errorf("truncateUTF8(_, %d) = %d bytes, valid %v", n, len(got), utf8.ValidString(got))
		}
	}
	if got := truncateUTF8("short", 10); got != "short" {
		t.Errorf("short string changed: %q", got)
	}
}

func TestThrottleKey(t *testing.T) {
	t.Parallel()
	if got, want := throttleKey("p:", KindBreakerOpen, "claude/sonnet"), "p:alert:throttle:breaker_open:claude/sonnet"; got != want {
		t.Errorf("throttleKey = %q, want %q", got, want)
	}
	long := throttleKey("p:", KindGeneric, strings.Repeat("x", 500))
	if len(long) > 120 || !strings.Contains(long, "sha256:") {
		t.Errorf("long subject key = %q", long)
	}
}
