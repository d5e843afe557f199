package progress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/job"
	"bulwark/pkg/queue"
	"bulwark/pkg/testkit/testenv"
)

// fakePositioner serves positions from a map and counts its reads.
type fakePositioner struct {
	channel string
	mu      sync.Mutex
	spots   map[string]queue.Spot
	err     error
	reads   int
}

func (p *fakePositioner) Spots(context.Context) (map[string]queue.Spot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads++
	if p.err != nil {
		return nil, p.err
	}
	out := make(map[string]queue.Spot, len(p.spots))
	for k, v := range p.spots {
		out[k] = v
	}
	return out, nil
}

func (p *fakePositioner) DequeuedChannel() string { return p.channel }

func (p *fakePositioner) set(id string, sp queue.Spot) {
	p.mu.Lock()
	p.spots[id] = sp
	p.mu.Unlock()
}

func (p *fakePositioner) readCount() int { p.mu.Lock(); defer p.mu.Unlock(); return p.reads }

// fixture is a hub on the test's own Redis database, with a job store
// publishing on the hub's channel.
type fixture struct {
	rdb   *redis.Client // the store's and the test's client
	name  string        // CLIENT SETNAME of the hub's connections
	store *job.Store
	pos   *fakePositioner
	hub   *Hub
	logs  *testenv.LogBuffer
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	opt := testenv.RedisOptions(t)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	b := make([]byte, 6)
	rand.Read(b)
	hubOpt := *opt
	hubOpt.ClientName = "hub-" + hex.EncodeToString(b)
	hubRDB := redis.NewClient(&hubOpt)
	t.Cleanup(func() { hubRDB.Close() })
	// Pub/sub channels are server-wide, not per database: the prefix keeps
	// parallel tests apart.
	prefix := hubOpt.ClientName + ":"
	store := job.NewStore(rdb, prefix, time.Hour)
	pos := &fakePositioner{channel: prefix + "queue:dequeued", spots: map[string]queue.Spot{}}
	cfg.Channel = store.Channel()
	if cfg.Tick == 0 {
		cfg.Tick = time.Hour // positions only when a test asks
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = time.Hour
	}
	logs := &testenv.LogBuffer{}
	return &fixture{rdb: rdb, name: hubOpt.ClientName, store: store, pos: pos, logs: logs,
		hub: New(hubRDB, pos, cfg, slog.New(slog.NewTextHandler(logs, nil)))}
}

// run starts the hub and waits until Redis counts its subscriptions; the
// hub is stopped, and Run must have returned nil, at cleanup.
func (f *fixture) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.hub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v after its context ended, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	f.awaitSubscribed(t)
}

// awaitSubscribed waits until the hub's connection is subscribed to both
// channels (PUBSUB NUMSUB), the one condition the hub does not signal.
func (f *fixture) awaitSubscribed(t *testing.T) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(10 * time.Second)
	for {
		n, err := f.rdb.PubSubNumSub(context.Background(), f.store.Channel(), f.pos.channel).Result()
		if err == nil && n[f.store.Channel()] == 1 && n[f.pos.channel] == 1 {
			return
		}
		select {
		case <-tick.C:
		case <-timeout:
			t.Fatalf("the hub did not subscribe: %v %v", n, err)
		}
	}
}

// create stores a queued request (publishing its queued event).
func (f *fixture) create(t *testing.T, id string) {
	t.Helper()
	now := time.Now()
	if _, _, err := f.store.Create(context.Background(), &job.Job{ID: id, Tenant: "demo", CreatedAt: now,
		Deadline: now.Add(time.Minute)}, job.Event{Type: job.EventQueued}, "", 0); err != nil {
		t.Fatal(err)
	}
}

// publish appends an event to id and returns its stream id.
func (f *fixture) publish(t *testing.T, id string, ev job.Event) string {
	t.Helper()
	return f.publishOn(t, f.store, id, ev)
}

// recv waits for the next event on s.
func recv(t *testing.T, s *Sub) job.Event {
	t.Helper()
	select {
	case ev := <-s.C:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("no event for %s", s.id)
		return job.Event{}
	}
}

// Events reach every subscriber of their request, in order and with their
// stream id, and no subscriber of another request.
func TestHubFansOutToThatRequestOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.run(t)
	a1, a2, b := f.hub.Subscribe("req-a", "zh"), f.hub.Subscribe("req-a", "en"), f.hub.Subscribe("req-b", "zh")
	defer a1.Close()
	defer a2.Close()
	defer b.Close()
	f.create(t, "req-a")
	sid := f.publish(t, "req-a", job.Event{Type: job.EventStarted, Attempt: 1})
	f.create(t, "req-b")
	for _, s := range []*Sub{a1, a2} {
		if ev := recv(t, s); ev.Type != job.EventQueued || ev.RequestID != "req-a" || ev.ID == "" {
			t.Fatalf("first event %+v, want req-a queued with its stream id", ev)
		}
		if ev := recv(t, s); ev.Type != job.EventStarted || ev.ID != sid || ev.Attempt != 1 {
			t.Fatalf("second event %+v, want started with id %s", ev, sid)
		}
	}
	// req-a's events were published first, on the same connection: had
	// they reached b, they would come before its own.
	if ev := recv(t, b); ev.RequestID != "req-b" {
		t.Fatalf("req-b's subscriber got %+v", ev)
	}
	if a1.Lagged() || b.Lagged() {
		t.Fatal("a subscriber that kept up is marked lagged")
	}
}

// A closed subscription receives nothing more, and the hub forgets a
// request with no subscriber left.
func TestHubClosedSubscriptionGetsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.run(t)
	gone, stays := f.hub.Subscribe("req-a", "zh"), f.hub.Subscribe("req-a", "zh")
	gone.Close()
	f.create(t, "req-a")
	recv(t, stays) // delivery to every subscriber of req-a happens at once
	if n := len(gone.C); n != 0 {
		t.Fatalf("a closed subscription received %d events", n)
	}
	stays.Close()
	f.hub.mu.Lock()
	n := len(f.hub.subs)
	f.hub.mu.Unlock()
	if n != 0 {
		t.Fatalf("the hub keeps %d requests with no subscriber", n)
	}
}

// A subscriber that does not read never holds up the others: once its
// buffer is full it is marked lagged (once) and the rest go on receiving.
func TestHubSlowSubscriberLagsWithoutBlocking(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.run(t)
	slow, fast := f.hub.Subscribe("req-a", "zh"), f.hub.Subscribe("req-a", "zh")
	defer slow.Close()
	defer fast.Close()
	f.create(t, "req-a")
	recv(t, fast)
	const n = bufferSize + 10
	for i := range n {
		sid := f.publish(t, "req-a", job.Event{Type: job.EventRetrying, Attempt: i + 1})
		if ev := recv(t, fast); ev.ID != sid {
			t.Fatalf("fast subscriber got %+v, want event %s", ev, sid)
		}
	}
	if len(slow.C) != bufferSize {
		t.Fatalf("slow subscriber holds %d events, want its full buffer of %d", len(slow.C), bufferSize)
	}
	if !slow.Lagged() || slow.Lagged() {
		t.Fatal("Lagged must report the dropped events once, then clear")
	}
	if fast.Lagged() {
		t.Fatal("the fast subscriber is marked lagged")
	}
}

// A message the hub cannot parse is skipped; the next one is delivered.
func TestHubSkipsBadMessages(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.run(t)
	s := f.hub.Subscribe("req-a", "zh")
	defer s.Close()
	for _, bad := range []string{"garbage", "req-a 1-0 {not json"} {
		if err := f.rdb.Publish(context.Background(), f.store.Channel(), bad).Err(); err != nil {
			t.Fatal(err)
		}
	}
	f.create(t, "req-a")
	if ev := recv(t, s); ev.Type != job.EventQueued || s.Lagged() {
		t.Fatalf("after bad messages: %+v (lagged %v)", ev, s.Lagged())
	}
}

// Every API process hears every event of the fleet: one for a request
// nobody here follows is not even decoded (a malformed one goes
// unnoticed), while a followed request's is.
func TestHubDecodesOnlyFollowedRequests(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.run(t)
	s := f.hub.Subscribe("req-a", "en")
	defer s.Close()
	for _, msg := range []string{"req-elsewhere 1-0 {not json", "req-a 1-0 {not json"} {
		if err := f.rdb.Publish(context.Background(), f.store.Channel(), msg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	f.create(t, "req-a")
	if ev := recv(t, s); ev.Type != job.EventQueued {
		t.Fatalf("event %+v", ev)
	}
	if n := strings.Count(f.logs.String(), "bad event message"); n != 1 {
		t.Fatalf("%d bad messages decoded, want only the followed request's:\n%s", n, f.logs.String())
	}
}

// When the pub/sub connection is lost and re-established, events may
// have been missed: every subscriber is woken with a resync and marked
// lagged (not on the first subscription), and events flow again.
func TestHubResyncsAfterReconnect(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	s := f.hub.Subscribe("req-a", "zh") // before the first subscription
	defer s.Close()
	f.run(t)
	f.create(t, "req-a")
	if ev := recv(t, s); ev.Type != job.EventQueued || s.Lagged() {
		t.Fatalf("first event %+v, lagged %v: the first subscription is no reconnect", ev, s.Lagged())
	}
	if err := f.killHubConnection(t); err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, s); ev.Type != "resync" || !s.Lagged() {
		t.Fatalf("after a reconnect: %+v, lagged %v; want a resync and lagged", ev, s.Lagged())
	}
	f.awaitSubscribed(t)
	sid := f.publish(t, "req-a", job.Event{Type: job.EventStarted})
	if ev := recv(t, s); ev.ID != sid {
		t.Fatalf("after the resync: %+v, want event %s", ev, sid)
	}
}

// killHubConnection closes the hub's pub/sub connection server-side.
func (f *fixture) killHubConnection(t *testing.T) error {
	t.Helper()
	ctx := context.Background()
	list, err := f.rdb.ClientList(ctx).Result()
	if err != nil {
		return err
	}
	for _, line := range strings.Split(list, "\n") {
		var id, name, sub string
		for _, field := range strings.Fields(line) {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "id":
				id = v
			case "name":
				name = v
			case "sub":
				sub = v
			}
		}
		if name == f.name && sub != "" && sub != "0" {
			return f.rdb.Do(ctx, "CLIENT", "KILL", "ID", id).Err()
		}
	}
	return fmt.Errorf("no pub/sub connection named %s in CLIENT LIST", f.name)
}

// Positions: each subscriber of a queued request gets its position and
// ETA in its own language; requests not queued get nothing; with no
// subscriber the positions are not even read.
func TestPositionsInTheSubscribersLanguage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	f.hub.updatePositions(ctx)
	if f.pos.readCount() != 0 {
		t.Fatal("positions read with no subscriber")
	}
	zh, en, other := f.hub.Subscribe("req-a", "zh"), f.hub.Subscribe("req-a", "en"), f.hub.Subscribe("req-c", "en")
	f.pos.set("req-a", queue.Spot{Position: 3, ETA: 44500 * time.Millisecond})
	f.hub.updatePositions(ctx)
	ev := recv(t, zh)
	if ev.Type != job.EventQueued || ev.RequestID != "req-a" || ev.QueuePosition != 3 || ev.EstimatedWaitSeconds != 45 ||
		ev.EstimatedWaitMS != 44500 || ev.ID != "" || !strings.Contains(ev.Message, "前方还有 2 个任务") {
		t.Fatalf("zh position %+v", ev)
	}
	if ev := recv(t, en); !strings.Contains(ev.Message, "2 ahead") || !strings.Contains(ev.Message, "45 seconds") {
		t.Fatalf("en position %q", ev.Message)
	}
	if len(other.C) != 0 {
		t.Fatal("a request not in the queue got a position")
	}
}

// An unchanged position is not sent again before KeepAlive; a changed one
// is sent at once.
func TestPositionsOnlyWhenChanged(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	s := f.hub.Subscribe("req-a", "en")
	f.pos.set("req-a", queue.Spot{Position: 4, ETA: time.Second})
	f.hub.updatePositions(ctx)
	recv(t, s)
	f.hub.updatePositions(ctx)
	if len(s.C) != 0 {
		t.Fatal("an unchanged position was sent again within KeepAlive")
	}
	f.pos.set("req-a", queue.Spot{Position: 2, ETA: time.Second})
	f.hub.updatePositions(ctx)
	if ev := recv(t, s); ev.QueuePosition != 2 {
		t.Fatalf("position %d, want 2", ev.QueuePosition)
	}

	// With a short KeepAlive the same position is re-sent.
	g := newFixture(t, Config{KeepAlive: time.Nanosecond})
	k := g.hub.Subscribe("req-a", "en")
	g.pos.set("req-a", queue.Spot{Position: 4})
	g.hub.updatePositions(ctx)
	g.hub.updatePositions(ctx)
	if len(k.C) != 2 {
		t.Fatalf("%d updates, want the unchanged position re-sent after KeepAlive", len(k.C))
	}
}

// A position that did not fit a full buffer is sent once there is room,
// even though it did not change; a failed read of the positions sends
// nothing and breaks nothing.
func TestPositionsRetriedAfterFullBuffer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	s := f.hub.Subscribe("req-a", "en")
	for range bufferSize {
		s.C <- job.Event{Type: job.EventRetrying}
	}
	f.pos.set("req-a", queue.Spot{Position: 5})
	f.hub.updatePositions(ctx)
	for range bufferSize {
		<-s.C
	}
	f.pos.mu.Lock()
	f.pos.err = errors.New("redis: connection refused")
	f.pos.mu.Unlock()
	f.hub.updatePositions(ctx)
	if len(s.C) != 0 {
		t.Fatal("an update was sent without positions")
	}
	f.pos.mu.Lock()
	f.pos.err = nil
	f.pos.mu.Unlock()
	f.hub.updatePositions(ctx)
	if ev := recv(t, s); ev.QueuePosition != 5 {
		t.Fatalf("position %d, want the 5 that did not fit", ev.QueuePosition)
	}
}

// A dequeue announced on the queue's channel makes a running hub
// recompute positions (after the debounce) without waiting for its tick;
// the tick alone does too.
func TestPositionsFollowDequeuesAndTicks(t *testing.T) {
	t.Parallel()
	t.Run("dequeue", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, Config{Debounce: 10 * time.Millisecond})
		f.run(t)
		s := f.hub.Subscribe("req-a", "zh")
		defer s.Close()
		f.pos.set("req-a", queue.Spot{Position: 7, ETA: 3 * time.Second})
		if err := f.rdb.Publish(context.Background(), f.pos.channel, "req-x").Err(); err != nil {
			t.Fatal(err)
		}
		if ev := recv(t, s); ev.Type != job.EventQueued || ev.QueuePosition != 7 {
			t.Fatalf("after a dequeue: %+v", ev)
		}
	})
	t.Run("tick", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, Config{Tick: 20 * time.Millisecond})
		s := f.hub.Subscribe("req-a", "zh")
		defer s.Close()
		f.pos.set("req-a", queue.Spot{Position: 2})
		f.run(t)
		if ev := recv(t, s); ev.QueuePosition != 2 {
			t.Fatalf("on the tick: %+v", ev)
		}
	})
}

// A caller awaiting the answer (Await) gets the stored events but no
// position updates, and while only such callers are subscribed a position
// update reads nothing from the queue.
func TestAwaitGetsEventsWithoutPositions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.run(t)
	quiet := f.hub.Await("req-a")
	defer quiet.Close()
	f.pos.set("req-a", queue.Spot{Position: 3})
	f.hub.updatePositions(context.Background())
	if n := f.pos.readCount(); n != 0 {
		t.Fatalf("%d position reads for a caller that shows none", n)
	}
	loud := f.hub.Subscribe("req-a", "en")
	f.hub.updatePositions(context.Background())
	if ev := recv(t, loud); ev.QueuePosition != 3 || f.pos.readCount() != 1 {
		t.Fatalf("stream subscriber: %+v after %d reads", ev, f.pos.readCount())
	}
	loud.Close()
	f.hub.updatePositions(context.Background())
	if n := f.pos.readCount(); n != 1 {
		t.Fatalf("%d position reads once the stream closed, want still 1", n)
	}
	f.create(t, "req-a")
	if ev := recv(t, quiet); ev.Type != job.EventQueued || ev.ID == "" {
		t.Fatalf("awaiting caller got %+v first, want the stored queued event (no position update)", ev)
	}
}

// After a Sentinel failover the client's commands go to the new master,
// but its pub/sub connection stays on the old one, which hears nothing
// until Sentinel makes it a replica of the new one (seconds later, and it
// never hears what was published before). The hub notices that its own
// probes stopped coming back, subscribes again (on the new master) and has
// every stream replay; what is published next arrives live.
func TestHubSubscribesAgainAfterASentinelFailover(t *testing.T) {
	t.Parallel()
	rs := testenv.RedisSentinel(t)
	ctx := t.Context()
	failoverClient := func() *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: rs.MasterName, SentinelAddrs: rs.Sentinels})
		t.Cleanup(func() { c.Close() })
		return c
	}
	rdb := failoverClient()
	store := job.NewStore(rdb, "", time.Hour)
	pos := &fakePositioner{channel: "queue:dequeued", spots: map[string]queue.Spot{}}
	logs := &testenv.LogBuffer{}
	cfg := Config{Channel: store.Channel(), Tick: time.Hour, KeepAlive: time.Hour, Probe: 100 * time.Millisecond}
	f := &fixture{rdb: rdb, store: store, pos: pos, logs: logs,
		hub: New(failoverClient(), pos, cfg, slog.New(slog.NewTextHandler(logs, nil)))}
	s := f.hub.Subscribe("req-a", "en")
	defer s.Close()
	f.run(t)
	f.create(t, "req-a")
	if ev := recv(t, s); ev.Type != job.EventQueued {
		t.Fatalf("first event %+v, want queued", ev)
	}
	// The replica has the record before it is promoted.
	if n, err := rdb.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	old, err := rs.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: rs.Sentinels[0]})
	defer sc.Close()
	if err := sc.Failover(ctx, rs.MasterName).Err(); err != nil {
		t.Fatal(err)
	}
	nm := awaitPromoted(t, rs, old)
	newMaster := redis.NewClient(&redis.Options{Addr: nm})
	defer newMaster.Close()
	onNew := job.NewStore(newMaster, "", time.Hour)
	missed := f.publishOn(t, onNew, "req-a", job.Event{Type: job.EventStarted})

	start := time.Now()
	if ev := recv(t, s); ev.Type != "resync" || !s.Lagged() {
		t.Fatalf("after the failover: %+v, want a resync and lagged", ev)
	}
	t.Logf("resync %v after the event published on the new master", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(f.logs.String(), "subscribing again") {
		t.Errorf("no warning about the deaf subscription in the log:\n%s", f.logs.String())
	}
	// The replay finds what was missed; what comes next arrives live.
	evs, err := onNew.Events(ctx, "req-a", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 || evs[len(evs)-1].ID != missed {
		t.Fatalf("stored events %+v, want the missed %s last", evs, missed)
	}
	live := f.publishOn(t, onNew, "req-a", job.Event{Type: job.EventStarted})
	for {
		ev := recv(t, s)
		if ev.ID == live {
			break
		}
		if ev.Type != "resync" {
			t.Fatalf("before the live event: %+v", ev)
		}
	}
}

// publishOn appends an event to id through store and returns its stream id.
func (f *fixture) publishOn(t *testing.T, store *job.Store, id string, ev job.Event) string {
	t.Helper()
	sid, err := store.Apply(context.Background(), id, job.Change{Tenant: "t", Event: &ev})
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

// awaitPromoted waits until the sentinels name a master other than old.
func awaitPromoted(t *testing.T, rs *testenv.Sentinel, old string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		nm, err := rs.Master(t.Context())
		if err == nil && nm != old {
			return nm
		}
		if time.Now().After(deadline) {
			t.Fatalf("no master other than %s after 30s: %v", old, err)
		}
		time.Sleep(20 * time.Millisecond) // Sentinel announces nothing to poll on
	}
}

// A subscription is deaf when a probe is overdue and nothing else arrived
// meanwhile (under load a probe can come back late behind a backlog of
// events, and that must not make every stream replay), or when a probe is
// long overdue whatever else arrives (an old master passing on what
// clients that did not switch publish). A probe heard back, even out of
// order, clears it; one Redis took after it was heard does not count.
func TestLivenessSilence(t *testing.T) {
	t.Parallel()
	now := time.Now()
	ago := func(d time.Duration) int64 { return now.Add(-d).UnixNano() }
	const limit, deaf = time.Second, 5 * time.Second
	for _, c := range []struct {
		name         string
		heard, since int64
		want         time.Duration
	}{
		{"no probe out", ago(time.Hour), 0, 0},
		{"probe not yet overdue", ago(time.Hour), ago(500 * time.Millisecond), 0},
		{"probe overdue, events still arriving", ago(100 * time.Millisecond), ago(2 * time.Second), 0},
		{"probe overdue, silent", ago(3 * time.Second), ago(2 * time.Second), 2 * time.Second},
		{"probe long overdue, events still arriving", ago(100 * time.Millisecond), ago(6 * time.Second), 6 * time.Second},
	} {
		var l liveness
		l.heard.Store(c.heard)
		l.since.Store(c.since)
		if got := l.silence(now, limit, deaf); got != c.want {
			t.Errorf("%s: silence = %v, want %v", c.name, got, c.want)
		}
	}

	var l liveness
	l.heard.Store(ago(time.Hour))
	l.answered("3") // heard before Redis's answer reached the prober
	l.sent(3, now.Add(-2*time.Second))
	if got := l.silence(now, limit, deaf); got != 0 {
		t.Errorf("a probe heard before its send was recorded: silence = %v, want 0", got)
	}
	l.sent(4, now.Add(-2*time.Second))
	if got := l.silence(now, limit, deaf); got != 2*time.Second {
		t.Errorf("probe 4 unanswered: silence = %v, want 2s", got)
	}
	l.answered("4")
	if got := l.silence(now, limit, deaf); got != 0 {
		t.Errorf("probe 4 heard: silence = %v, want 0", got)
	}
}

// A notice channel's function runs for each message on it, and again each
// time the channel is subscribed after a reconnect (a notice may have been
// missed meanwhile).
func TestHubNotices(t *testing.T) {
	t.Parallel()
	var got atomic.Int64
	ch := "notice-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	f := newFixture(t, Config{Notices: map[string]func(){ch: func() { got.Add(1) }}})
	f.run(t)
	waitCount := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for got.Load() < want {
			if time.Now().After(deadline) {
				t.Fatalf("notice function ran %d times, want %d", got.Load(), want)
			}
			time.Sleep(5 * time.Millisecond) // the hub signals nothing else to await
		}
	}
	waitCount(1) // the first subscription
	if err := f.rdb.Publish(t.Context(), ch, "x").Err(); err != nil {
		t.Fatal(err)
	}
	waitCount(2)
	if err := f.killHubConnection(t); err != nil {
		t.Fatal(err)
	}
	waitCount(3)
}
