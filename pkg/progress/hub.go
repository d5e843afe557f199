// Package progress fans request events out to the Server-Sent-Event streams
// of one API process and keeps their queue positions current.
//
// One Hub per process holds ONE Redis pub/sub connection, whatever the
// number of streams: every event published by the job store arrives there
// and is handed to the local subscribers of that request. Positions are
// recomputed for all local subscribers at once (one pipelined read of the
// pending lists) when a worker announces a dequeue, debounced, and on a
// slow tick; a subscriber gets a queued event when its position changes and
// at least every KeepAlive. So 1,000 streams cost one subscription plus a
// few reads per dequeue, not 1,000 polling clients.
//
// Delivery to a subscriber never blocks the hub: a subscriber whose buffer
// is full is marked lagged and replays from the stored event stream; so is
// every subscriber after the pub/sub connection was re-established.
//
// A subscription can also go deaf without breaking: after a Sentinel
// failover the client sends its commands to the new master, but its
// pub/sub connection stays on the old one, which hears nothing until
// Sentinel turns it into a replica (about ten seconds). So the hub probes
// its own subscription end to end: every Probe it publishes to a channel
// of its own through the client's ordinary connections, and when no probe
// has come back and nothing at all has arrived for three Probes it
// subscribes again (reaching the current master) and every stream
// replays.
package progress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/job"
	"bulwark/pkg/queue"
)

// Defaults.
const (
	DebounceDefault  = 100 * time.Millisecond
	TickDefault      = 2 * time.Second
	KeepAliveDefault = 5 * time.Second
	ProbeDefault     = 500 * time.Millisecond
	bufferSize       = 64
	// staleProbes is how many Probes a subscription may stay silent, with
	// a probe unanswered, before the hub subscribes again: one late probe
	// under load is no reason to make every stream replay.
	staleProbes = 3
	// deafProbes is how many Probes a probe may stay unanswered before the
	// hub subscribes again even though other messages still arrive: after
	// a failover the old master can still pass on what clients that have
	// not switched yet publish, while this process's own probes (and
	// every switched client's events) go to the new one.
	deafProbes = 10
)

// Positioner reads the queued requests' positions and ETAs.
type Positioner interface {
	Spots(ctx context.Context) (map[string]queue.Spot, error)
	DequeuedChannel() string
}

// Config configures a Hub.
type Config struct {
	// Channel of job events (job.Store.Channel()).
	Channel string
	// Debounce of position recomputation after a dequeue. Default 100ms.
	Debounce time.Duration
	// Tick recomputes positions even without dequeues. Default 2s.
	Tick time.Duration
	// KeepAlive re-sends an unchanged position this often. Default 5s.
	KeepAlive time.Duration
	// Probe is how often the hub checks that its subscription still hears
	// what is published (package doc). Default 500ms.
	Probe time.Duration
	// Notices are other channels the process listens to on the same
	// connection (e.g. cache invalidations): channel -> what to do. The
	// function runs for each message on its channel, and each time the
	// channel is subscribed (again), since a notice may have been missed
	// before. It must not block.
	Notices map[string]func()
}

// Hub is the per-process event fan-out. Start it with Run.
type Hub struct {
	rdb    redis.UniversalClient
	pos    Positioner
	cfg    Config
	logger *slog.Logger

	mu   sync.Mutex
	subs map[string]map[*Sub]struct{} // request id → subscribers
	// placed counts the subscribers that want queue positions; without
	// any, a dequeue costs no recomputation (guarded by mu).
	placed int

	kick chan struct{} // a dequeue happened

	// probeChannel is this hub's own channel for probing its subscription.
	probeChannel string
	// subscribed: Run has had a subscription before (owned by Run).
	subscribed bool
}

// New returns a hub.
func New(rdb redis.UniversalClient, pos Positioner, cfg Config, logger *slog.Logger) *Hub {
	if cfg.Debounce == 0 {
		cfg.Debounce = DebounceDefault
	}
	if cfg.Tick == 0 {
		cfg.Tick = TickDefault
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = KeepAliveDefault
	}
	if cfg.Probe == 0 {
		cfg.Probe = ProbeDefault
	}
	return &Hub{rdb: rdb, pos: pos, cfg: cfg, logger: logger,
		subs: map[string]map[*Sub]struct{}{}, kick: make(chan struct{}, 1),
		probeChannel: cfg.Channel + ":probe:" + hex.EncodeToString(randomBytes(8))}
}

// randomBytes returns n random bytes (crypto/rand.Read never fails).
func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// Sub is one stream's subscription.
type Sub struct {
	h    *Hub
	id   string
	Lang string
	// C delivers events in order. Stored events carry their stream ID;
	// position updates have none.
	C      chan job.Event
	lagged atomic.Bool
	// quiet subscribers get stored events only, no position updates.
	quiet bool

	// Owned by the hub's position loop.
	lastPos  int
	lastSent time.Time
}

// Subscribe registers a stream for request id. lang picks the language of
// position messages ("zh" or "en"). Close it when the stream ends.
func (h *Hub) Subscribe(id, lang string) *Sub {
	return h.subscribe(&Sub{h: h, id: id, Lang: lang, C: make(chan job.Event, bufferSize)})
}

// Await registers a caller that waits for request id's stored events
// only (a compat endpoint waiting for the answer): no queue positions are
// computed for it, which under load saves reading the whole queue on
// every dequeue.
func (h *Hub) Await(id string) *Sub {
	return h.subscribe(&Sub{h: h, id: id, Lang: "en", C: make(chan job.Event, bufferSize), quiet: true})
}

func (h *Hub) subscribe(s *Sub) *Sub {
	h.mu.Lock()
	if h.subs[s.id] == nil {
		h.subs[s.id] = map[*Sub]struct{}{}
	}
	h.subs[s.id][s] = struct{}{}
	if !s.quiet {
		h.placed++
	}
	h.mu.Unlock()
	return s
}

// Close unregisters the subscription.
func (s *Sub) Close() {
	s.h.mu.Lock()
	if _, ok := s.h.subs[s.id][s]; ok && !s.quiet {
		s.h.placed--
	}
	delete(s.h.subs[s.id], s)
	if len(s.h.subs[s.id]) == 0 {
		delete(s.h.subs, s.id)
	}
	s.h.mu.Unlock()
}

// Lagged reports, and clears, whether events were dropped for this
// subscriber; it must then replay from the store.
func (s *Sub) Lagged() bool { return s.lagged.Swap(false) }

// Follows reports whether request id has a subscriber in this process
// (an event stream, a waiting compat caller).
func (h *Hub) Follows(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs[id]) > 0
}

func (h *Hub) deliver(id string, ev job.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs[id] {
		select {
		case s.C <- ev:
		default:
			s.lagged.Store(true)
		}
	}
}

func (h *Hub) markAllLagged() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.subs {
		for s := range m {
			s.lagged.Store(true)
			select { // wake the stream so it replays
			case s.C <- job.Event{Type: "resync"}:
			default:
			}
		}
	}
}

// Run receives events until ctx ends. It owns the pub/sub connection.
func (h *Hub) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		h.positionLoop(ctx)
	}()
	defer wg.Wait()
	for {
		silent := h.listen(ctx)
		if silent == 0 {
			return nil
		}
		h.logger.Warn("progress: the event subscription heard nothing, not even its own probe; subscribing again (a Redis failover?)",
			"probe_unanswered_for", silent.Round(time.Millisecond))
	}
}

// listen holds one subscription until ctx ends (0) or the subscription
// is found deaf: then it returns how long it was silent.
func (h *Hub) listen(ctx context.Context) time.Duration {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	channels := []string{h.cfg.Channel, h.pos.DequeuedChannel(), h.probeChannel}
	for ch := range h.cfg.Notices {
		channels = append(channels, ch)
	}
	ps := h.rdb.Subscribe(ctx, channels...)
	defer func() { _ = ps.Close() }()
	var live liveness
	live.heard.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	wg.Go(func() { h.probe(ctx, &live) })
	defer wg.Wait()
	defer stop() // before wg.Wait: the prober ends with ctx

	check := time.NewTicker(h.cfg.Probe)
	defer check.Stop()
	last := time.Now()
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
	for {
		select {
		case <-ctx.Done():
			return 0
		case now := <-check.C:
			if now.Sub(last) > 2*h.cfg.Probe {
				// The whole process stood still (GC, CPU throttling, a VM
				// pause): what the socket holds is not read yet. Start over.
				live.restart(now)
			} else if d := live.silence(now, staleProbes*h.cfg.Probe, deafProbes*h.cfg.Probe); d > 0 && len(ch) == 0 {
				// (Messages already waiting are read first.)
				return d
			}
			last = now
		case m, ok := <-ch:
			if !ok {
				return 0
			}
			live.heard.Store(time.Now().UnixNano())
			h.receive(m, &live)
		}
	}
}

// receive handles one message or subscription notice.
func (h *Hub) receive(m any, live *liveness) {
	switch m := m.(type) {
	case *redis.Subscription:
		// Subscribed again (after a reconnect, or after the hub found its
		// subscription deaf): anything published in between was missed,
		// so every stream replays.
		if m.Kind != "subscribe" {
			return
		}
		if m.Channel == h.cfg.Channel {
			if h.subscribed {
				h.markAllLagged()
			}
			h.subscribed = true
		}
		if f, ok := h.cfg.Notices[m.Channel]; ok {
			f() // a notice may have come before this (re)subscription
		}
	case *redis.Message:
		switch m.Channel {
		case h.probeChannel:
			live.answered(m.Payload)
			return
		case h.pos.DequeuedChannel():
			select {
			case h.kick <- struct{}{}:
			default:
			}
			return
		}
		if f, ok := h.cfg.Notices[m.Channel]; ok {
			f()
			return
		}
		// Every API process hears every event of the fleet; most are for
		// requests nobody here follows, so the id is looked up before the
		// event is decoded.
		if id, _, _ := strings.Cut(m.Payload, " "); !h.Follows(id) {
			return
		}
		id, ev, err := job.ParseMessage(m.Payload)
		if err != nil {
			h.logger.Warn("progress: bad event message", "err", err)
			return
		}
		h.deliver(id, ev)
	}
}

// liveness is what one subscription has heard lately. Times are unix ns.
type liveness struct {
	heard atomic.Int64 // the last message or notice received
	got   atomic.Int64 // the last probe heard back (its sequence number)
	// since is when Redis took the oldest probe not heard back (0: none):
	// from Redis's answer, not from sending, so a Redis that stalls does
	// not age a probe it had not even received.
	since atomic.Int64
}

// sent records that Redis took probe seq at now.
func (l *liveness) sent(seq int64, now time.Time) {
	if l.got.Load() < seq {
		l.since.CompareAndSwap(0, now.UnixNano())
	}
}

// answered records a probe heard back (payload: its sequence number).
func (l *liveness) answered(payload string) {
	if seq, err := strconv.ParseInt(payload, 10, 64); err == nil {
		l.got.Store(seq)
	}
	l.since.Store(0)
}

// restart forgets the probes out and counts the subscription heard now.
func (l *liveness) restart(now time.Time) {
	l.since.Store(0)
	l.heard.Store(now.UnixNano())
}

// silence reports how long a probe has been unanswered when the
// subscription counts as deaf at now: a probe unanswered for limit with
// nothing else heard for limit either, or a probe unanswered for deaf
// whatever else arrived. Otherwise 0.
func (l *liveness) silence(now time.Time, limit, deaf time.Duration) time.Duration {
	since := l.since.Load()
	if since == 0 {
		return 0
	}
	out := now.Sub(time.Unix(0, since))
	if out >= deaf || out >= limit && now.Sub(time.Unix(0, l.heard.Load())) >= limit {
		return out
	}
	return 0
}

// probe publishes to the hub's probe channel every Probe until ctx ends.
// A probe Redis did not take (an error) proves nothing either way and is
// not counted.
func (h *Hub) probe(ctx context.Context, live *liveness) {
	t := time.NewTicker(h.cfg.Probe)
	defer t.Stop()
	for seq := int64(1); ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := h.rdb.Publish(ctx, h.probeChannel, strconv.FormatInt(seq, 10)).Err(); err == nil {
			live.sent(seq, time.Now())
		}
	}
}

func (h *Hub) positionLoop(ctx context.Context) {
	tick := time.NewTicker(h.cfg.Tick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-h.kick:
			// Debounce: a burst of dequeues costs one recomputation.
			t := time.NewTimer(h.cfg.Debounce)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		h.updatePositions(ctx)
	}
}

func (h *Hub) updatePositions(ctx context.Context) {
	h.mu.Lock()
	n := h.placed
	h.mu.Unlock()
	if n == 0 {
		return
	}
	spots, err := h.pos.Spots(ctx)
	if err != nil {
		h.logger.Warn("progress: read positions", "err", err)
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, m := range h.subs {
		sp, ok := spots[id]
		if !ok {
			continue
		}
		for s := range m {
			if s.quiet || sp.Position == s.lastPos && now.Sub(s.lastSent) < h.cfg.KeepAlive {
				continue
			}
			ev := QueuedEvent(id, sp.Position, sp.ETA, s.Lang)
			select {
			case s.C <- ev:
				s.lastPos, s.lastSent = sp.Position, now
			default:
			}
		}
	}
}

// WaitSeconds is an estimated wait in whole seconds, rounded up: a caller
// told "0 seconds" would poll at once. estimated_wait_ms carries the
// estimate to the millisecond.
func WaitSeconds(eta time.Duration) int {
	return int((eta + time.Second - 1) / time.Second)
}

// QueuedEvent builds the design document's 4.3 queued update.
func QueuedEvent(id string, position int, eta time.Duration, lang string) job.Event {
	secs := WaitSeconds(eta)
	return job.Event{
		Type: job.EventQueued, RequestID: id, Status: job.StatusQueued, At: time.Now(),
		QueuePosition: position, EstimatedWaitSeconds: secs, EstimatedWaitMS: eta.Milliseconds(),
		Message: QueuedMessage(lang, position, secs),
	}
}
