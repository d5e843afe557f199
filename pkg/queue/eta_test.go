package queue

import (
	"testing"
	"time"
)

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// In a steady stream, slots taken evenly over one hold, the estimate is the
// plain drain-rate one: turn/r.
func TestDrainSteadyIsTurnOverRate(t *testing.T) {
	t.Parallel()
	const rate, h = 8.0, 16 // H = 2 s
	ages := make([]time.Duration, h)
	for i := range ages {
		ages[i] = secs(2 * (float64(i) + 0.5) / h)
	}
	d := newDrain(rate, ages)
	for turn := 1; turn <= 40; turn++ {
		if got, want := d.eta(turn), ETAFor(turn, rate); got != want {
			t.Errorf("eta(%d) = %s, want %s", turn, got, want)
		}
	}
}

// At a storm's cold start every slot was just taken: the first waiter waits
// for the first calls to end, the shortest hold expected ((1 − spread)·H,
// H = 15/8 s) and a little more, not 1/r; the slots then free up at the
// drain rate.
func TestDrainColdStartWaitsForTheFirstCalls(t *testing.T) {
	t.Parallel()
	const rate = 8.0
	d := newDrain(rate, make([]time.Duration, 15))
	hold := 15 / rate
	first := (1-holdSpread)*hold + hold*holdSpread/15
	for _, turn := range []int{1, 8, 15, 30} {
		want := first + float64(turn-1)/rate
		if got := d.eta(turn).Seconds(); got < want-0.002 || got > want+0.002 {
			t.Errorf("eta(%d) = %.3fs, want %.3fs", turn, got, want)
		}
	}
	if d.eta(0) != pickUp || d.eta(-2) != pickUp {
		t.Errorf("a request with a free slot waits %s, %s; want %s", d.eta(0), d.eta(-2), pickUp)
	}
	// Half a hold later the first calls are due: the drain-rate estimate.
	half := make([]time.Duration, 15)
	for i := range half {
		half[i] = secs(hold / 2)
	}
	if got, want := newDrain(rate, half).eta(2), ETAFor(2, rate); got != want {
		t.Errorf("eta(2) with holders half a hold old = %s, want %s", got, want)
	}
}

// Holders older than the longest hold expected free their slots at the
// drain rate; without ages the estimate is the drain-rate one.
func TestDrainOverdueAndUnknown(t *testing.T) {
	t.Parallel()
	if got, want := newDrain(2, []time.Duration{10 * time.Second, 12 * time.Second}).eta(3), 1500*time.Millisecond; got != want {
		t.Errorf("eta(3) with overdue holders = %s, want %s", got, want)
	}
	if got, want := newDrain(4, nil).eta(6), 1500*time.Millisecond; got != want {
		t.Errorf("eta(6) at 4/s without ages = %s, want %s", got, want)
	}
}
