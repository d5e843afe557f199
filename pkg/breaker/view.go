package breaker

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A worker asks two breakers (the route's and "all") before every call and
// reports to both after it: four scripts per request, the largest share of
// a queued request's Redis round trips once the queue's were cut (issue
// 15). Nearly always the answer is the same: closed, no failure counted,
// and a success that resets a counter already at zero. While Watch runs, a
// Set remembers that answer per breaker (its view) and admits closed-state
// calls, and takes their successes, without a round trip.
//
// What keeps the breakers shared: every change that matters to other
// processes — a counted failure, any transition, a trip or a reset — is
// announced on the changes channel after its script ran, and every
// watching Set drops its view of that breaker at once, so its next call
// and its next success go to Redis again (a success then resets the
// failure count, as before). A view is also dropped after viewMaxAge, and
// every view when the subscription is (re)established: a message missed
// while disconnected cannot leave a stale view behind. Between a change
// and the announcement's arrival (a round trip), another process may still
// admit a call or skip a reset: the window every shared breaker has
// between reading its state and acting on it.
const viewMaxAge = 2 * time.Second

// view is what a Set last learnt of a healthy breaker.
type view struct {
	gen int64
	at  time.Time
}

// views are the Set's healthy breakers while Watch runs.
type views struct {
	mu       sync.Mutex
	watching bool // guarded by mu; no view is kept without it
	byName   map[string]view
}

// healthy returns breaker name's view when it is fresh.
func (v *views) healthy(name string) (view, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	w, ok := v.byName[name]
	if !ok || !v.watching || time.Since(w.at) > viewMaxAge {
		return view{}, false
	}
	return w, true
}

// learn records what a script said of breaker name: healthy (closed, no
// failure counted) at generation gen, or not.
func (v *views) learn(name string, gen int64, healthy bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.watching {
		return
	}
	if !healthy {
		delete(v.byName, name)
		return
	}
	v.byName[name] = view{gen: gen, at: time.Now()}
}

// drop forgets breaker name.
func (v *views) drop(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.byName, name)
}

// setWatching starts or stops keeping views, forgetting every one.
func (v *views) setWatching(on bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.watching = on
	clear(v.byName)
}

// changesChannel is where changes are announced.
func changesChannel(prefix string) string { return prefix + "changes" }

// announce tells every watching Set that breaker name changed. A failed
// announcement is logged: the views expire within viewMaxAge anyway.
func (s *Set) announce(name string) {
	s.views.drop(name)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RedisTimeout)
	defer cancel()
	if err := s.rdb.Publish(ctx, changesChannel(s.cfg.Prefix), name).Err(); err != nil {
		s.logger.Warn("breaker: announce a change", "breaker", name, "err", err)
	}
}

// Watch keeps this Set's views of healthy breakers until ctx ends (see
// viewMaxAge): a worker runs it so that most calls cost no breaker round
// trip. Without it every Allow and Done asks Redis. It returns when ctx
// ends.
func (s *Set) Watch(ctx context.Context) {
	ps := s.rdb.Subscribe(ctx, changesChannel(s.cfg.Prefix))
	defer func() { _ = ps.Close() }()
	defer s.views.setWatching(false)
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			switch m := m.(type) {
			case *redis.Subscription:
				// (Re)subscribed: whatever was announced meanwhile is
				// unknown, so start from nothing.
				s.views.setWatching(m.Kind == "subscribe")
			case *redis.Message:
				s.views.drop(m.Payload)
			}
		}
	}
}
