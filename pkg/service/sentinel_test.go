package service_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/testkit/mockprovider"
	"bulwark/pkg/testkit/redisha"
	"bulwark/pkg/testkit/testenv"
)

// TestRedisSentinelAcceptedOnReplica runs Bulwark through Redis Sentinel
// with redis.min_replicas_acked 1: every request answered 202 is already
// on the replica when the answer arrives (the master could die right
// then and the promoted replica would still run it), and completes. On
// loopback the replica would mostly have it without the wait too;
// TestRedisSentinelUnconfirmedIs503 is the check that fails without it.
func TestRedisSentinelAcceptedOnReplica(t *testing.T) {
	t.Parallel()
	rs := testenv.RedisSentinel(t)
	s := newSystem(t, opts{
		mock:     mockprovider.Config{Latency: 20 * time.Millisecond},
		redisYML: sentinelYML(rs, "min_replicas_acked: 1"),
	})
	api := s.startAPI()
	s.startWorker()
	replicaAddr, err := rs.Replica(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	replica := redis.NewClient(&redis.Options{Addr: replicaAddr})
	defer replica.Close()
	for i := range 10 {
		id := api.submit(t, ask(fmt.Sprintf("sentinel request %d", i)))
		if n, err := replica.Exists(t.Context(), api.base.Jobs.RecordKey(id)).Result(); err != nil || n != 1 {
			t.Fatalf("request %s answered 202 but not on the replica: %d %v", id, n, err)
		}
		api.waitStatus(t, id, 20*time.Second, "completed")
	}
}

// sentinelYML is the redis section for rs, with more settings.
func sentinelYML(rs *testenv.Sentinel, more string) string {
	addrs := make([]string, len(rs.Sentinels))
	for i, a := range rs.Sentinels {
		addrs[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf("redis: {mode: sentinel, sentinel: {master_name: %s, addrs: [%s]}, %s}",
		rs.MasterName, strings.Join(addrs, ", "), more)
}

// TestRedisSentinelUnconfirmedIs503 is the half of the test above that
// can fail: on loopback the replica has a request long before any 202,
// waited for or not. Here the replica leaves replication (REPLICAOF NO
// ONE: the master's WAIT counts no replica), so a submission must be
// answered 503 "retry shortly", not 202 — and the stored request still
// runs at once (queued by that submission: it completes well before the
// orphan sweep would look at it, 10 s after it was stored). Once the
// replica follows the master again, a retry with the same Idempotency-Key
// gets that request, confirmed on the replica, with its answer.
//
// REPLICAOF NO ONE rather than DEBUG SLEEP (refused: Redis 7 disables
// DEBUG by default) or a pause: the master drops the replica at once on
// every Redis version. The sentinels would make it a replica again on
// their own only after it has reported itself master for about 8 s; the
// test gives it back within a second or two.
func TestRedisSentinelUnconfirmedIs503(t *testing.T) {
	t.Parallel()
	rs := testenv.RedisSentinel(t)
	s := newSystem(t, opts{
		mock:     mockprovider.Config{Latency: 20 * time.Millisecond},
		redisYML: sentinelYML(rs, "min_replicas_acked: 1, replica_ack_timeout: 300ms"),
	})
	api := s.startAPI()
	s.startWorker()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	masterAddr, err := rs.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	replicaAddr, err := rs.Replica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	replica := redis.NewClient(&redis.Options{Addr: replicaAddr})
	defer replica.Close()
	if err := replica.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatalf("REPLICAOF NO ONE: %v", err)
	}

	const key = "unconfirmed-1"
	body := ask("a request no replica confirms")
	code, out, hdr := call(t, "POST", api.ts.URL+"/v1/requests", devToken, body, "Idempotency-Key", key)
	e, _ := out["error"].(map[string]any)
	if code != http.StatusServiceUnavailable || e["type"] != "unavailable" || !strings.Contains(fmt.Sprint(e["message"]), "retry shortly") ||
		hdr.Get("Retry-After") != "1" {
		t.Fatalf("submission while the replica does not confirm: %d %v Retry-After %q, want 503 unavailable \"retry shortly\", Retry-After 1",
			code, out, hdr.Get("Retry-After"))
	}
	stored, err := api.base.Jobs.Idempotent(ctx, "demo", key)
	if err != nil || stored == "" {
		t.Fatalf("the refused submission's record on the master: %q %v", stored, err)
	}
	if got := hdr.Get("X-Bulwark-Request-Id"); got != stored {
		t.Fatalf("the 503's X-Bulwark-Request-Id %q, want the stored request %s", got, stored)
	}
	api.waitStatus(t, stored, 8*time.Second, "completed")

	host, port, _ := net.SplitHostPort(masterAddr)
	if err := replica.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatalf("REPLICAOF %s: %v", masterAddr, err)
	}
	master := redis.NewClient(&redis.Options{Addr: masterAddr})
	defer master.Close()
	if err := redisha.Poll(ctx, "replica online at "+masterAddr, func(ctx context.Context) (bool, error) {
		info, err := master.Info(ctx, "replication").Result()
		return strings.Contains(info, "slave0:") && strings.Contains(info, "state=online"), err
	}); err != nil {
		t.Fatal(err)
	}
	// Resent as a client would on 503 + Retry-After: the replica online
	// may still need a moment to acknowledge within replica_ack_timeout
	// on a loaded machine.
	code, out, _ = resendOn503(ctx, t, api, body, key)
	if code != http.StatusOK || out["id"] != stored || out["status"] != "completed" {
		t.Fatalf("the retry once the replica is back: %d %v, want 200 with %s completed", code, out, stored)
	}
	if n, err := replica.Exists(ctx, api.base.Jobs.RecordKey(stored)).Result(); err != nil || n != 1 {
		t.Fatalf("request %s confirmed but not on the replica: %d %v", stored, n, err)
	}
}

// failWait fails every WAIT as a connection reset would, after the write
// it confirms went through.
type failWait struct{}

func (failWait) DialHook(next redis.DialHook) redis.DialHook { return next }
func (failWait) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (failWait) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "wait" {
			err := errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: connection reset by peer (injected)")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// A confirmation that fails for another reason than too few replicas (the
// connection broke during WAIT) is answered like one the replicas did not
// give in time: 503 "retry shortly" naming the request, which runs at once
// rather than waiting for the orphan sweep (it looks at records 10 s old).
func TestUnconfirmedByABrokenConnectionStillRuns(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{mock: mockprovider.Config{Latency: 20 * time.Millisecond}})
	s.cfg.Redis.MinReplicasAcked, s.cfg.Redis.ReplicaAckTimeout = 1, 300*time.Millisecond
	api := s.startAPI()
	s.startWorker()
	api.base.Redis.(*redis.Client).AddHook(failWait{})

	code, out, hdr := call(t, "POST", api.ts.URL+"/v1/requests", devToken, ask("confirmed over a broken connection"),
		"Idempotency-Key", "broken-wait-1")
	id := hdr.Get("X-Bulwark-Request-Id")
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "1" || id == "" {
		t.Fatalf("submission whose WAIT failed: %d %v, Retry-After %q, request id %q; want 503, 1 and the stored request",
			code, out, hdr.Get("Retry-After"), id)
	}
	api.waitStatus(t, id, 8*time.Second, "completed")
}
