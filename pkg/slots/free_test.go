package slots

import (
	"testing"

	"bulwark/pkg/priority"
)

// Free tells the queue what each priority could take now: CRITICAL's unused
// reserve is never counted for the others.
func TestFreeOf(t *testing.T) {
	t.Parallel()
	cfg := Config{Total: 20, Reserved: map[priority.Priority]int{priority.Critical: 5, priority.High: 10, priority.Normal: 4, priority.Low: 1}}
	for _, tt := range []struct {
		used map[priority.Priority]int
		want map[priority.Priority]int
	}{
		{map[priority.Priority]int{}, map[priority.Priority]int{priority.Critical: 20, priority.High: 15, priority.Normal: 15, priority.Low: 15}},
		{map[priority.Priority]int{priority.Low: 15}, map[priority.Priority]int{priority.Critical: 5, priority.High: 0, priority.Normal: 0, priority.Low: 0}},
		{map[priority.Priority]int{priority.Critical: 7, priority.Normal: 3}, map[priority.Priority]int{priority.Critical: 10, priority.High: 10, priority.Normal: 10, priority.Low: 10}},
	} {
		got := freeOf(cfg, tt.used)
		for p, w := range tt.want {
			if got[p] != w {
				t.Errorf("used %v: free[%s] = %d, want %d", tt.used, p, got[p], w)
			}
		}
	}
}
