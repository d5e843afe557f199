package progress_test

import (
	"strings"
	"testing"
	"time"

	"bulwark/pkg/progress"
)

// A wait is rounded up to whole seconds: a caller told "0 seconds" would
// poll at once.
func TestWaitSecondsRoundsUp(t *testing.T) {
	t.Parallel()
	for eta, want := range map[time.Duration]int{
		0: 0, time.Millisecond: 1, time.Second: 1, time.Second + time.Millisecond: 2, 44500 * time.Millisecond: 45,
	} {
		if got := progress.WaitSeconds(eta); got != want {
			t.Errorf("WaitSeconds(%s) = %d, want %d", eta, got, want)
		}
	}
}

// The texts callers see, in both languages: the number ahead is the
// position less one (never negative), and anything but "en" is Chinese.
func TestMessageTexts(t *testing.T) {
	t.Parallel()
	if got := progress.QueuedMessage("en", 5, 12); got != "Your request is queued: 4 ahead of it, expected to start in about 12 seconds." {
		t.Fatalf("en queued: %q", got)
	}
	if got := progress.QueuedMessage("zh", 1, 3); got != "您的诊断请求已排队，前方还有 0 个任务，预计 3 秒后开始处理" {
		t.Fatalf("zh queued: %q", got)
	}
	if got := progress.QueuedMessage("fr", 0, 0); !strings.Contains(got, "前方还有 0 个任务") {
		t.Fatalf("position 0, unknown language: %q", got)
	}
	if zh, en := progress.DegradedMessage("zh"), progress.DegradedMessage("en"); zh != "诊断服务暂时繁忙，您的请求已自动排入等待队列" ||
		!strings.Contains(en, "queued automatically") {
		t.Fatalf("degraded: %q / %q", zh, en)
	}
	if zh, en := progress.DegradedSuggestion("zh"), progress.DegradedSuggestion("en"); !strings.Contains(zh, "历史诊断") ||
		!strings.Contains(en, "request history") {
		t.Fatalf("suggestion: %q / %q", zh, en)
	}
	if ev := progress.QueuedEvent("req_1", 2, 1500*time.Millisecond, "en"); ev.EstimatedWaitMS != 1500 ||
		ev.EstimatedWaitSeconds != 2 || ev.RequestID != "req_1" || ev.Type != "queued" || ev.At.IsZero() || !strings.Contains(ev.Message, "1 ahead") {
		t.Fatalf("queued event %+v", ev)
	}
}
