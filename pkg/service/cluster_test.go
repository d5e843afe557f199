package service_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"bulwark/pkg/alert"
	"bulwark/pkg/breaker"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/maintenance"
	"bulwark/pkg/priority"
	"bulwark/pkg/service"
	"bulwark/pkg/slots"
	"bulwark/pkg/testkit/mockprovider"
	"bulwark/pkg/testkit/testenv"
)

// TestRedisCluster runs Bulwark on a three-master Redis Cluster (redis.mode
// cluster): two API processes and two workers complete requests of every
// priority, identical ones coalesced, retried ones found by their
// idempotency key and a capped tenant's counted in its live set, with a
// stream following one of them; then every component's scripts run once
// more directly (breaker, key pool, slots, queue, claims, alert throttle,
// sweep lock). At the end no master has answered CROSSSLOT: every script
// and transaction kept its keys in one hash slot (pkg/config/keys.go).
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	c := testenv.RedisCluster(t)
	s := newSystem(t, opts{
		mock:      mockprovider.Config{Latency: 50 * time.Millisecond},
		redisYML:  clusterYML(c, ""),
		tenantYML: `{name: capped, token: "capped-token", max_priority: critical, max_queued: 20}`,
	})
	if s.cfg.Redis.Mode != "cluster" {
		t.Fatalf("redis mode %q", s.cfg.Redis.Mode)
	}
	apis := []*apiProc{s.startAPI(), s.startAPI()}
	s.startWorker()
	s.startWorker()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()

	t.Run("requests", func(t *testing.T) { clusterRequests(t, apis) })
	t.Run("components", func(t *testing.T) { clusterComponents(ctx, t, s, apis[0]) })

	stats, err := c.ErrorStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	failed, err := c.FailedCommands(ctx)
	if err != nil {
		t.Fatal(err)
	}
	maps.DeleteFunc(failed, func(_ string, n int) bool { return n == 0 })
	t.Logf("error replies of the cluster's masters: %v; failed commands: %v", stats, failed)
	if n := stats["CROSSSLOT"]; n > 0 {
		t.Errorf("%d CROSSSLOT replies: a script, transaction or multi-key command spans hash slots", n)
	}
	// A script that reaches a key outside its declared slot fails with
	// ERR at run time: no EVAL may fail, and no EVALSHA but the first of
	// each script on each master (NOSCRIPT, then EVAL).
	if failed["eval"] > 0 || failed["evalsha"] != stats["NOSCRIPT"] {
		t.Errorf("scripts failed: eval %d, evalsha %d (NOSCRIPT %d)", failed["eval"], failed["evalsha"], stats["NOSCRIPT"])
	}
	if t.Failed() {
		t.Log("logs:\n" + s.logs.String())
	}
}

// clusterRequests submits the request kinds whose scripts differ and waits
// for each to complete.
func clusterRequests(t *testing.T, apis []*apiProc) {
	type sub struct {
		body   map[string]any
		token  string
		hdr    []string
		prompt string
	}
	var subs []sub
	prios := []string{"critical", "high", "normal", "low"}
	for i := range 24 {
		p := fmt.Sprintf("cluster distinct %d", i)
		b := ask(p)
		b["priority"] = prios[i%4]
		subs = append(subs, sub{body: b, token: devToken, prompt: p})
	}
	const same = "cluster identical: 12 cars report U0100 after OTA 3.2.1"
	for range 8 {
		subs = append(subs, sub{body: ask(same), token: devToken, prompt: same})
	}
	for i := range 3 { // each twice: the retry must get the same request
		p := fmt.Sprintf("cluster idempotent %d", i)
		for range 2 {
			subs = append(subs, sub{body: ask(p), token: devToken, hdr: []string{"Idempotency-Key", fmt.Sprintf("cluster-k%d", i)}, prompt: p})
		}
	}
	for i := range 6 {
		p := fmt.Sprintf("cluster capped tenant %d", i)
		subs = append(subs, sub{body: ask(p), token: "capped-token", prompt: p})
	}
	ids := make([]string, len(subs))
	var wg sync.WaitGroup
	for i, sb := range subs {
		wg.Go(func() {
			code, out, _ := call(t, "POST", apis[i%2].ts.URL+"/v1/requests", sb.token, sb.body, sb.hdr...)
			if code != http.StatusAccepted && code != http.StatusOK {
				t.Errorf("submission %d: %d %v", i, code, out)
				return
			}
			ids[i], _ = out["id"].(string)
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ch, _ := stream(t, apis[1].ts.URL+"/v1/requests/"+ids[0]+"/events", devToken, "")
	byKey := map[string]string{}
	for i, sb := range subs {
		if len(sb.hdr) > 0 {
			if prev, ok := byKey[sb.hdr[1]]; ok && prev != ids[i] {
				t.Errorf("Idempotency-Key %s: requests %s and %s", sb.hdr[1], prev, ids[i])
			}
			byKey[sb.hdr[1]] = ids[i]
		}
		out := apis[i%2].waitStatusAs(t, sb.token, ids[i], 30*time.Second, "completed", "failed", "cancelled")
		res, _ := out["result"].(map[string]any)
		if out["status"] != "completed" || res["content"] != mockprovider.Reply(sb.prompt) {
			t.Errorf("submission %d (%s): %v", i, ids[i], out)
		}
	}
	next(t, ch, 10*time.Second, "completed")

	// A cache hit is stored ended in one script (job.Store.CreateEnded):
	// the identical prompt again, once its answer is in the cache.
	waitFor(t, 10*time.Second, "an exact cache hit", func() bool {
		id := apis[0].submit(t, ask(same))
		out := apis[1].waitStatus(t, id, 10*time.Second, "completed", "failed", "cancelled")
		res, _ := out["result"].(map[string]any)
		return out["status"] == "completed" && res["cached"] == "exact"
	})
}

// acquireKey leases a key of route as a worker does: when every key is
// paced (the requests before used them), it waits the pool's own
// Retry-After and asks again.
func acquireKey(ctx context.Context, b *service.Base, route llm.Route) (*keypool.Lease, error) {
	for {
		l, err := b.Pool.Acquire(ctx, route, 100)
		var ex *keypool.ExhaustedError
		if !errors.As(err, &ex) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(ex.RetryAfter):
		}
	}
}

// clusterComponents runs the scripts the request path did not (a 429's
// cooldown, a tripped breaker, slot waiters, a cancelled delayed task, …)
// on the cluster.
func clusterComponents(ctx context.Context, t *testing.T, s *system, api *apiProc) {
	b := api.base

	// Breakers: trip, read (one and all), reset, allow a call and report it.
	const name = "cluster/test"
	if err := b.Breakers.Trip(ctx, name, "cluster test"); err != nil {
		t.Fatalf("breaker trip: %v", err)
	}
	if st, err := b.Breakers.Status(ctx, name); err != nil || st.State != breaker.StateOpen {
		t.Fatalf("breaker status: %+v %v", st, err)
	}
	if all, err := b.Breakers.List(ctx); err != nil || !slices.ContainsFunc(all, func(st breaker.Status) bool { return st.Name == name }) {
		t.Fatalf("breaker list: %v %v", all, err)
	}
	if err := b.Breakers.Reset(ctx, name); err != nil {
		t.Fatalf("breaker reset: %v", err)
	}
	permit, err := b.Breakers.Allow(ctx, name)
	if err != nil {
		t.Fatalf("breaker allow: %v", err)
	}
	if err := permit.Done(ctx, breaker.Success); err != nil {
		t.Fatalf("breaker done: %v", err)
	}

	// Key pool: a 429 cools one key, the next lease goes to the other.
	route := llm.Route{Provider: "claude", Tier: "sonnet"}
	l1, err := acquireKey(ctx, b, route)
	if err != nil {
		t.Fatalf("keypool acquire: %v", err)
	}
	rl := &llm.Error{Class: llm.ClassRateLimited, RetryAfter: 30 * time.Second}
	if err := b.Pool.Failure(ctx, l1, keypool.Cool, rl); err != nil {
		t.Fatalf("keypool failure: %v", err)
	}
	l2, err := acquireKey(ctx, b, route)
	if err != nil {
		t.Fatalf("keypool acquire after a cooldown: %v", err)
	}
	if l2.KeyID == l1.KeyID {
		t.Fatalf("the cooling key %s was leased again", l1.KeyID)
	}
	if err := b.Pool.Success(ctx, l2, llm.Usage{InputTokens: 10, OutputTokens: 10}, llm.RateLimit{}); err != nil {
		t.Fatalf("keypool success: %v", err)
	}
	snap, err := b.Pool.Snapshot(ctx)
	if err != nil || !slices.ContainsFunc(snap, func(k keypool.KeyState) bool { return k.ID == l1.KeyID && !k.CoolingUntil.IsZero() }) {
		t.Fatalf("keypool snapshot: %+v %v", snap, err)
	}
	if err := b.Pool.Disable(ctx, l1.KeyID, "cluster test"); err != nil {
		t.Fatalf("keypool disable: %v", err)
	}
	if err := b.Pool.Enable(ctx, l1.KeyID); err != nil {
		t.Fatalf("keypool enable: %v", err)
	}

	// Slots: hold every one LOW may take, so the next LOW waits in line;
	// promote it, read the line, leave it, release.
	var held []*slots.Slot
	for i := 0; ; i++ {
		sl, err := b.Slots.TryAcquire(ctx, priority.Low, slots.Waiter{ID: fmt.Sprintf("cluster-hold-%d", i), Since: time.Now()})
		if errors.Is(err, slots.ErrNoSlot) {
			break
		}
		if err != nil {
			t.Fatalf("slots try-acquire: %v", err)
		}
		held = append(held, sl)
	}
	w := slots.Waiter{ID: "cluster-waiter", Since: time.Now()}
	if sl, err := b.Slots.TryAcquire(ctx, priority.Low, w); !errors.Is(err, slots.ErrNoSlot) {
		t.Fatalf("slots: a LOW beyond its share: %v %v", sl, err)
	}
	if err := b.Slots.Promote(ctx, w.ID, priority.High, time.Minute); err != nil {
		t.Fatalf("slots promote: %v", err)
	}
	waiting, err := b.Slots.Waiting(ctx)
	if err != nil || !slices.Contains(waiting[priority.Low], w.ID) {
		t.Fatalf("slots waiting: %v %v", waiting, err)
	}
	if _, err := b.Slots.Occupancy(ctx); err != nil {
		t.Fatalf("slots occupancy: %v", err)
	}
	if err := b.Slots.Leave(ctx, priority.Low, w.ID); err != nil {
		t.Fatalf("slots leave: %v", err)
	}
	for _, sl := range held {
		if err := sl.Renew(ctx); err != nil {
			t.Fatalf("slots renew: %v", err)
		}
		if err := sl.Release(ctx); err != nil {
			t.Fatalf("slots release: %v", err)
		}
	}
	if inUse, err := b.Slots.InUse(ctx); err != nil || inUse[priority.Low] != 0 {
		t.Fatalf("slots in use after release: %v %v", inUse, err)
	}

	// Queue: a delayed task is counted, found and cancelled; the drain
	// rate reads the start log.
	if err := b.Queue.Enqueue(ctx, "cluster-delayed", priority.Normal, time.Hour); err != nil {
		t.Fatalf("queue enqueue: %v", err)
	}
	if d, err := b.Queue.Depth(ctx); err != nil || d[priority.Normal] < 1 {
		t.Fatalf("queue depth: %v %v", d, err)
	}
	if ok, err := b.Queue.Cancel(ctx, "cluster-delayed", priority.Normal); err != nil || !ok {
		t.Fatalf("queue cancel: %v %v", ok, err)
	}
	if _, err := b.Queue.Rate(ctx); err != nil {
		t.Fatalf("queue rate: %v", err)
	}
	if _, err := b.Queue.Spots(ctx); err != nil {
		t.Fatalf("queue spots: %v", err)
	}

	// Coalescing claims, the alert throttle and the sweep lock.
	if lead, err := b.Claims.Claim(ctx, "cluster-ref", "r1", time.Minute); err != nil || lead != "r1" {
		t.Fatalf("claim: %q %v", lead, err)
	}
	if lead, err := b.Claims.Claim(ctx, "cluster-ref", "r2", time.Minute); err != nil || lead != "r1" {
		t.Fatalf("second claim: %q %v", lead, err)
	}
	if err := b.Claims.Release(ctx, "cluster-ref", "r1"); err != nil {
		t.Fatalf("claim release: %v", err)
	}
	if err := b.Notifier.Notify(ctx, alert.Event{Kind: alert.KindBreakerOpen, Subject: name, Summary: "cluster test"}); err != nil {
		t.Fatalf("alert: %v", err)
	}
	if err := s.workers[0].Sweeper().Sweep(ctx); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	reconcileLost(ctx, t, s.workers[0])
}

// reconcileLost runs the history reconcile job through a worker's task
// handlers on a request Redis lost twenty minutes ago (a history row with
// no live record): its row ends failed (lost), counted once.
func reconcileLost(ctx context.Context, t *testing.T, w *service.Base) {
	t.Helper()
	id := fmt.Sprintf("lost-%d", time.Now().UnixNano())
	if _, err := w.PG.Exec(ctx, `INSERT INTO requests (id, tenant, priority, status, provider, model_tier, created_at)
		VALUES ($1, 'demo', 3, 'queued', 'claude', 'sonnet', now() - interval '20 minutes')`, id); err != nil {
		t.Fatal(err)
	}
	before := testutil.ToFloat64(w.Metrics.RequestsLost)
	_, mux := w.Worker(w.Clients())
	if err := mux.ProcessTask(ctx, asynq.NewTask(maintenance.TaskReconcile, nil)); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if row, err := w.History.Get(ctx, id); err != nil || row.Status != job.StatusFailed || row.Error != job.LostReason {
		t.Fatalf("lost request's history row after the reconcile job: %+v %v", row, err)
	}
	if n := testutil.ToFloat64(w.Metrics.RequestsLost) - before; n != 1 {
		t.Fatalf("bulwark_requests_lost_total rose by %v, want 1", n)
	}
}

// TestRedisClusterFailover fails each master of a three-master cluster
// over to its replica in turn (coordinated CLUSTER FAILOVER) while
// requests arrive, with redis.min_replicas_acked 1: the clients follow
// the slots to the promoted replicas (MOVED), a submission the replicas
// could not confirm in time is answered 503 and resent with its
// Idempotency-Key, and every request answered 202 completes. The
// {job} master goes first, then the other two. (A coordinated failover
// loses no acknowledged write, so this does not test min_replicas_acked
// itself: TestRedisSentinelUnconfirmedIs503 does.)
func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	clusterFailoverUnderTraffic(t, time.Minute, func(ctx context.Context, c *testenv.Cluster, key string) (string, string, error) {
		return c.Failover(ctx, key)
	})
}

// TestFaultRedisClusterMasterKilled kills each master of a three-master cluster
// in turn with SIGKILL while requests arrive (the {job} master first):
// for cluster-node-timeout (5 s here) and the election after it, the
// dead master's slots answer nothing, then its replica serves them; the
// killed node is started again and rejoins as a replica before the next
// kill. With redis.min_replicas_acked 1 an accepted request was on the
// replica before its 202, so every one completes; work the workers had
// written only to the dead master (a transition, an asynq task's state)
// is redone, so provider calls may exceed requests, never fall short. A
// task whose end was lost comes back only when asynq's recoverer finds
// its lease expired (30 s, then up to its one-minute round): part of the
// fault matrix (make faults), not of the suite.
func TestFaultRedisClusterMasterKilled(t *testing.T) {
	if os.Getenv("BULWARK_FAULTS") != "1" {
		t.Skip("fault matrix: set BULWARK_FAULTS=1 (make faults)")
	}
	t.Parallel()
	clusterFailoverUnderTraffic(t, 3*time.Minute, func(ctx context.Context, c *testenv.Cluster, key string) (string, string, error) {
		old, promoted, err := c.Kill(ctx, key)
		if err != nil {
			return old, promoted, err
		}
		return old, promoted, c.Restart(ctx, old)
	})
}

// clusterFailoverUnderTraffic sends requests at 10/s to an API and a
// worker on a three-master cluster with replicas, has move replace each
// master in turn (the {job} one first) every 10 requests accepted, and
// checks that every request accepted completes, each within settle of
// the check.
func clusterFailoverUnderTraffic(t *testing.T, settle time.Duration, move func(ctx context.Context, c *testenv.Cluster, key string) (old, promoted string, err error)) {
	c := testenv.RedisClusterWithReplicas(t)
	s := newSystem(t, opts{
		mock:     mockprovider.Config{Latency: 50 * time.Millisecond},
		redisYML: clusterYML(c, ", min_replicas_acked: 1, replica_ack_timeout: 500ms"),
		// While a master is down everything that needs it waits, and the
		// requests of those seconds queue up: room for them, and keys
		// that drain them at once, so that this tests failover, not the
		// queue's bound or the keys' pace.
		keysYML:  unlimitedKeys,
		extraYML: "queue: {queue_max_depth: 2000}",
	})
	api := s.startAPI()
	s.startWorker()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute+settle)
	defer cancel()

	// Requests arrive at 10/s from before the first failover until 10
	// after the last; every 10 accepted, the next master fails over.
	const most, afterLast = 400, 10
	var (
		mu       sync.Mutex
		ids      []string
		resent   []int
		accepted []time.Time
	)
	done := make(chan struct{}, most) // one per request accepted (or given up)
	failedOver := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }() // no submitter outlives a failed test
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	wg.Go(func() {
		var each sync.WaitGroup
		defer each.Wait()
		more := -1 // requests still to send once the failovers are over
		for i := 0; i < most && more != 0; i++ {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
			if more < 0 {
				select {
				case <-failedOver:
					more = afterLast
				default:
				}
			}
			if more > 0 {
				more--
			}
			each.Go(func() {
				defer func() { done <- struct{}{} }()
				id, n503 := submitUntilAccepted(ctx, t, api, i)
				mu.Lock()
				ids, resent, accepted = append(ids, id), append(resent, n503), append(accepted, time.Now())
				mu.Unlock()
			})
		}
	})
	seen := map[string]bool{}
	keys := clusterMasterKeys(t, api, c)

	var first time.Time
	for i, key := range keys {
		for range 10 {
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("requests stopped coming before the failovers")
			}
		}
		if i == 0 {
			first = time.Now()
		}
		old, promoted, err := move(ctx, c, key)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("replaced %s (holding %s) by %s", old, key, promoted)
		seen[old] = true
	}
	last := time.Now()
	close(failedOver)
	wg.Wait()
	if len(seen) != 3 {
		t.Fatalf("failed over %d distinct masters, want 3", len(seen))
	}
	// The failovers happened under traffic: requests were accepted
	// during them and after the last.
	during, after := 0, 0
	for _, at := range accepted {
		switch {
		case at.After(last):
			after++
		case at.After(first):
			during++
		}
	}
	t.Logf("failovers took %s; requests accepted during them %d, after them %d", last.Sub(first).Round(time.Millisecond), during, after)
	if during == 0 || after == 0 {
		t.Fatalf("requests accepted during the failovers %d, after them %d: the failovers did not happen under traffic", during, after)
	}
	total := 0
	for i, id := range ids {
		if id == "" {
			t.Fatalf("request %d was never accepted", i)
		}
		total += resent[i]
		if out := api.waitStatus(t, id, settle, "completed", "failed", "cancelled"); out["status"] != "completed" {
			t.Errorf("request %s: %v", id, out)
		}
	}
	calls := s.mock.Stats().Total().Requests
	t.Logf("%d requests completed; %d submissions answered 503 and resent; provider calls %d", len(ids), total, calls)
	if calls < int64(len(ids)) {
		t.Errorf("provider calls %d for %d completed requests", calls, len(ids))
	}
}

// submitUntilAccepted submits request i with an Idempotency-Key of its
// own until it is answered 202, waiting Retry-After after each 503, as an
// SDK would; it returns the request's id and how many 503s it got.
func submitUntilAccepted(ctx context.Context, t *testing.T, api *apiProc, i int) (string, int) {
	code, out, n503 := resendOn503(ctx, t, api, ask(fmt.Sprintf("cluster failover request %d", i)), fmt.Sprintf("cluster-failover-%d", i))
	// 200: a resend found the request already answered.
	if code != http.StatusAccepted && code != http.StatusOK {
		t.Errorf("request %d: %d %v", i, code, out)
		return "", n503
	}
	id, _ := out["id"].(string)
	return id, n503
}

// clusterMasterKeys returns a key on each of the cluster's three masters,
// the {job} concept's first.
func clusterMasterKeys(t *testing.T, api *apiProc, c *testenv.Cluster) []string {
	t.Helper()
	cc := c.Client(t)
	byMaster := map[string]string{}
	var keys []string
	add := func(key string) {
		m, err := cc.MasterForKey(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if a := m.Options().Addr; byMaster[a] == "" {
			byMaster[a] = key
			keys = append(keys, key)
		}
	}
	add(api.base.Jobs.RecordKey("any"))
	for i := 0; len(keys) < 3 && i < 1000; i++ {
		add(fmt.Sprintf("{probe-%d}", i))
	}
	if len(keys) != 3 {
		t.Fatalf("keys on %d masters, want 3", len(keys))
	}
	return keys
}

// clusterYML is the redis section for c, with more settings appended
// (", key: value").
func clusterYML(c *testenv.Cluster, more string) string {
	addrs := make([]string, len(c.Addrs))
	for i, a := range c.Addrs {
		addrs[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf("redis: {mode: cluster, cluster: {addrs: [%s]}%s}", strings.Join(addrs, ", "), more)
}
