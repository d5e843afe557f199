package queue

import (
	"testing"
	"time"
)

// Far below the limit a fresh read admits without another; the estimate
// counts this process's recent admissions, so from admitNear of the limit
// on (or once the read is stale) every submission reads again.
func TestAdmissionReadsNearTheLimitOrWhenStale(t *testing.T) {
	var a admission
	if a.cheap(100) {
		t.Fatal("admitted without any read")
	}
	a.saw(50, time.Now()) // the read admitted one: estimate 51
	n := 0
	for a.cheap(100) {
		n++
	}
	if n != 28 { // 51 + 28 = 79 < 80; the next would make 80
		t.Fatalf("%d admissions without a read, want 28", n)
	}
	var b admission
	b.saw(0, time.Now().Add(-admitFresh-time.Millisecond))
	if b.cheap(100) {
		t.Fatal("admitted on a stale read")
	}
}

// Admissions a read may have missed (concurrent ones, admitted before it
// saw their tasks) keep counting for two periods, whatever the read said.
func TestAdmissionCountsConcurrentAdmissions(t *testing.T) {
	var a admission
	now := time.Now()
	for range 4 { // four submissions read the depth at once, all see 0
		a.saw(0, now)
	}
	if a.cheap(5) {
		t.Fatal("a fifth submission was admitted on reads that missed the four before it")
	}
}
