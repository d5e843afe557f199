package job_test

import (
	"strings"
	"testing"
	"time"

	"bulwark/pkg/job"
)

// Ids carry their creation time to the microsecond, and sort by it: the
// queue orders waiting requests by id as the slots order them by age,
// and two requests of one millisecond in the order they came.
func TestIDTime(t *testing.T) {
	t.Parallel()
	at := time.UnixMicro(1_764_547_200_123_456)
	id := job.NewID(at)
	got, ok := job.IDTime(id)
	if !ok || !got.Equal(at) {
		t.Fatalf("IDTime(%q) = %s, %v; want %s", id, got, ok, at)
	}
	if later := job.NewID(at.Add(time.Millisecond)); strings.Compare(id, later) >= 0 {
		t.Errorf("%q is not before %q, made 1 ms later", id, later)
	}
	if later := job.NewID(at.Add(time.Microsecond)); strings.Compare(id, later) >= 0 {
		t.Errorf("%q is not before %q, made 1 µs later", id, later)
	}
	if a, b := job.NewID(at), job.NewID(at); a == b {
		t.Errorf("two ids of the same millisecond are equal: %q", a)
	}
	for _, bad := range []string{"", "req_", "req_zz", "x_lmn0a1b2c3", "req_!!!!!!!!00"} {
		if _, ok := job.IDTime(bad); ok {
			t.Errorf("IDTime(%q) is ok", bad)
		}
	}
}
