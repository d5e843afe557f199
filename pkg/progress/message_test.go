package progress_test

import (
	"strings"
	"testing"
	"time"

	"bulwark/pkg/progress"
)

func TestLang(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"": "zh", "en-US,en;q=0.9": "en", "zh-CN,zh;q=0.9,en;q=0.8": "zh", "fr-FR, en;q=0.5": "en", "de": "zh",
	} {
		if got := progress.Lang(in); got != want {
			t.Errorf("Lang(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestQueuedEvent(t *testing.T) {
	t.Parallel()
	ev := progress.QueuedEvent("req_1", 3, 45*time.Second, "zh")
	if ev.QueuePosition != 3 || ev.EstimatedWaitSeconds != 45 || ev.Status != "queued" || ev.ID != "" {
		t.Fatalf("%+v", ev)
	}
	// Design document 4.3: position 3 has two requests ahead of it.
	if !strings.Contains(ev.Message, "前方还有 2 个任务") || !strings.Contains(ev.Message, "45 秒") {
		t.Fatalf("zh message %q", ev.Message)
	}
	if en := progress.QueuedMessage("en", 1, 0); !strings.Contains(en, "0 ahead") {
		t.Fatalf("en message %q", en)
	}
}
