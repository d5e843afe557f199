package alert_test

import (
	"fmt"
	"time"

	"bulwark/pkg/alert"
)

// Text renders what the robots show; zh-CN unless asked otherwise.
func ExampleText() {
	e := alert.Event{
		Kind:    alert.KindBreakerOpen,
		Subject: "claude/sonnet",
		Summary: "3 consecutive 429s; open for 60s",
		Details: map[string]string{"queued": "42"},
		At:      time.Date(2026, 3, 1, 8, 30, 0, 0, time.UTC),
	}
	fmt.Println(alert.Text(e, "en"))
	fmt.Println()
	fmt.Println(alert.Title(e, "zh-CN"))
	// Output:
	// ### 🔴 CRITICAL Circuit breaker opened
	//
	// **Subject**: claude/sonnet
	//
	// **Summary**: 3 consecutive 429s; open for 60s
	//
	// - queued: 42
	//
	// **Time**: 2026-03-01 08:30:00 UTC
	//
	// [🔴 严重] 熔断器打开 claude/sonnet
}
