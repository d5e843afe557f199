package queue

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// A queued request starts when a slot its priority can take frees up, so
// its wait is the time until the turn-th slot release from now. Two
// measured things give it:
//
//   - the drain rate r of the queue (starts per second, Rate), and
//   - the age of every slot in use (slots.Occupancy).
//
// Slots free up at rate r once they start to: turn k waits
// first + (k − 1)/r, where first is when the first slot is expected to
// free (at least 1/r). By Little's law a slot is held H = slots in use / r
// on average; holds are taken to spread uniformly over [0.3H, 1.7H], so a
// holder of age a frees its slot somewhere in the rest of that window
// (within 0.7H when it is older). The spread is wide because a hold is
// not only a call: a request holds its slot while it waits its turn in
// the key line, so when the keys bind, the first holders (granted a key
// at once) free their slots after one call while the last wait for the
// keys' pace; with [H/2, 3H/2] a key-bound cold start's first waiters
// were promised their slot about 0.8 s late (F1-fleet-async's first
// estimates, p95 0.18-0.77 over the runs). The expected number of releases by t, N(t), sums each
// holder's chance of having released; first is where N(t) reaches ½.
//
// In a steady stream the ages spread evenly over one hold, first is 1/r,
// and the estimate is the plain drain-rate one, turn/r. At a storm's cold
// start every slot was taken at once, and the first waiters wait for the
// first calls to end, about 0.3H: the case the drain rate alone gets wrong
// (it promised 0.1 s to requests that waited 1.5 s).

// pickUp is the wait of a request for which a slot is free: until a
// worker takes it from asynq and the slot is granted (0–40 ms in the storm
// benchmark). Never 0: the answer's estimated_wait_* fields would vanish.
const pickUp = 50 * time.Millisecond

// holdSpread is the half-width of the assumed hold distribution, as a
// share of the mean hold.
const holdSpread = 0.7

// drain estimates when each turn in line gets a slot.
type drain struct {
	rate  float64       // requests per second
	first time.Duration // until the first slot frees
}

// newDrain models the queue draining at rate with slots held for ages.
// Without ages (nothing held, or slots that record no grant time) the
// estimate is the plain drain-rate one.
func newDrain(rate float64, ages []time.Duration) drain {
	d := drain{rate: rate}
	if rate <= 0 {
		return d
	}
	d.first = time.Duration(float64(time.Second) / rate)
	if len(ages) > 0 {
		hold := float64(len(ages)) / rate
		d.first = max(d.first, time.Duration(firstRelease(ages, hold)*float64(time.Second)))
	}
	return d
}

// eta is the expected wait of the request whose turn is turn (1: the next
// slot that frees is its; 0 or less: a slot is free for it now), to the
// millisecond.
func (d drain) eta(turn int) time.Duration {
	if turn <= 0 || d.rate <= 0 {
		return pickUp
	}
	wait := d.first.Seconds() + float64(turn-1)/d.rate
	return time.Duration(math.Round(wait*1000)) * time.Millisecond
}

// firstRelease returns, in seconds from now, when N(t) of the holders of
// ages reaches ½ under the hold model above, hold being the mean hold in
// seconds. N(t) is piecewise linear: one sweep over the ends of the
// holders' windows finds the crossing.
func firstRelease(ages []time.Duration, hold float64) float64 {
	type edge struct {
		at    float64 // seconds from now
		slope float64 // change of dN/dt here
	}
	edges := make([]edge, 0, 2*len(ages))
	for _, a := range ages {
		// The rest of a hold of age a: uniform over [max(a, lo), max(hi,
		// a + spread·H)] less a, with [lo, hi] = H·(1 ∓ spread).
		age := a.Seconds()
		from := max(age, (1-holdSpread)*hold) - age
		to := max((1+holdSpread)*hold, age+holdSpread*hold) - age
		to = max(to, from+1e-6)
		s := 1 / (to - from)
		edges = append(edges, edge{from, s}, edge{to, -s})
	}
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Compare(a.at, b.at) })
	var n, slope, at float64 // N(at), and dN/dt just after at
	for _, e := range edges {
		if next := n + slope*(e.at-at); slope > 0 && next >= 0.5 {
			return at + (0.5-n)/slope
		}
		n += slope * (e.at - at)
		at, slope = e.at, slope+e.slope
	}
	return at // unreachable: N ends at len(ages) ≥ 1
}
