package storm

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A system with options.Sentinel runs its Redis as the master of a
// Sentinel setup: the redis-server that startSystemWith starts anyway is
// the master, and this file adds one replica (redis-replica) and three
// sentinels (redis-sentinel-1…3, quorum 2, down-after-milliseconds 1000).
// The api and worker processes then reach Redis through the sentinels
// (redis.mode sentinel) and answer 202 only once the replica holds a
// request (redis.min_replicas_acked 1), so that a failover test can fail
// the master over — coordinated (failover) or killed (killMaster) — in the
// middle of a storm.

// sentinelMaster is the name the sentinels monitor the master under.
const sentinelMaster = "storm"

// sentinelSet is the replica and sentinels of a system.
type sentinelSet struct {
	sentinels []string // host:port

	mu    sync.Mutex
	procs map[string]*process // the data servers by address; guarded by mu
	args  map[string][]string // their redis-server arguments, for a restart; guarded by mu
	n     int                 // restarts so far, for log names; guarded by mu
}

// startSentinel starts the replica and the sentinels next to the running
// master and waits until all of them see each other.
func (s *system) startSentinel(ctx context.Context) error {
	s.mu.Lock()
	master := s.redis
	s.mu.Unlock()
	if err := waitReady(ctx, master, "PING "+s.redisAddr, redisPing(s.redisAddr)); err != nil {
		return err
	}
	ha := &sentinelSet{procs: map[string]*process{s.redisAddr: master}, args: map[string][]string{s.redisAddr: s.redisArgs}}
	s.ha = ha
	// The master syncs its replica without waiting for others to join
	// (a 5 s delay by default).
	mc := redis.NewClient(&redis.Options{Addr: s.redisAddr})
	defer func() { _ = mc.Close() }()
	if err := mc.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		return fmt.Errorf("storm: configure the master: %w", err)
	}
	ports := make([]int, 4)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	_, masterPort, _ := strings.Cut(s.redisAddr, ":")
	replica := "127.0.0.1:" + strconv.Itoa(ports[0])
	args := []string{"--port", strconv.Itoa(ports[0]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--dbfilename", "replica.rdb", "--repl-diskless-sync-delay", "0",
		"--replicaof", "127.0.0.1", masterPort}
	rp, err := startProcess("redis-replica", s.dir, s.redisBin, args, os.Environ(), s.onExit)
	if err != nil {
		return err
	}
	s.addProc(rp)
	ha.mu.Lock()
	ha.procs[replica], ha.args[replica] = rp, args
	ha.mu.Unlock()
	for i, p := range ports[1:] {
		conf := fmt.Sprintf("%s/sentinel-%d.conf", s.dir, i+1)
		doc := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %s 2\n"+
			"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 10000\n",
			p, s.dir, sentinelMaster, masterPort, sentinelMaster, sentinelMaster)
		if err := os.WriteFile(conf, []byte(doc), 0o600); err != nil {
			return fmt.Errorf("storm: sentinel config: %w", err)
		}
		sp, err := startProcess(fmt.Sprintf("redis-sentinel-%d", i+1), s.dir, s.redisBin, []string{conf, "--sentinel"},
			os.Environ(), s.onExit)
		if err != nil {
			return err
		}
		s.addProc(sp)
		ha.sentinels = append(ha.sentinels, "127.0.0.1:"+strconv.Itoa(p))
	}
	return ha.settled(ctx, s.redisAddr)
}

// sentinelConfig puts the Sentinel setup into the configuration doc in
// place of the one server's address; without options.Sentinel it returns
// doc as it is.
func (s *system) sentinelConfig(doc string) (string, error) {
	if s.ha == nil {
		return doc, nil
	}
	one := fmt.Sprintf("redis: {addr: %q}", s.redisAddr)
	if !strings.Contains(doc, one) {
		return "", fmt.Errorf("storm: the configuration has no line %s to replace with the sentinels", one)
	}
	addrs := make([]string, len(s.ha.sentinels))
	for i, a := range s.ha.sentinels {
		addrs[i] = strconv.Quote(a)
	}
	ha := fmt.Sprintf("redis: {mode: sentinel, sentinel: {master_name: %s, addrs: [%s]}, min_replicas_acked: 1, replica_ack_timeout: 500ms}",
		sentinelMaster, strings.Join(addrs, ", "))
	return strings.Replace(doc, one, ha, 1), nil
}

// settled waits until master has its replica online and every sentinel
// names master and sees one replica with its link up and the two other
// sentinels. Redis announces none of this: it is polled every 50 ms.
func (h *sentinelSet) settled(ctx context.Context, master string) error {
	mc := redis.NewClient(&redis.Options{Addr: master})
	defer func() { _ = mc.Close() }()
	check := func(what string, ok func(ctx context.Context) (bool, error)) error {
		var last error
		for {
			done, err := ok(ctx)
			if done {
				return nil
			}
			if err != nil {
				last = err
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("storm: sentinel setup: %s: %w (last error: %v)", what, context.Cause(ctx), last)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	if err := check("replica online at "+master, func(ctx context.Context) (bool, error) {
		info, err := mc.Info(ctx, "replication").Result()
		return strings.Contains(info, "slave0:") && strings.Contains(info, "state=online"), err
	}); err != nil {
		return err
	}
	for _, a := range h.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a})
		err := check("sentinel "+a+" settled on "+master, func(ctx context.Context) (bool, error) {
			m, err := sc.Master(ctx, sentinelMaster).Result()
			if err != nil {
				return false, err
			}
			if m["ip"]+":"+m["port"] != master || strings.Contains(m["flags"], "down") ||
				m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
				return false, nil
			}
			reps, err := sc.Replicas(ctx, sentinelMaster).Result()
			if err != nil || len(reps) != 1 {
				return false, err
			}
			return !strings.Contains(reps[0]["flags"], "down") && reps[0]["master-link-status"] == "ok", nil
		})
		_ = sc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// master returns the address the first sentinel names as master.
func (h *sentinelSet) master(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: h.sentinels[0]})
	defer func() { _ = sc.Close() }()
	a, err := sc.GetMasterAddrByName(ctx, sentinelMaster).Result()
	if err != nil {
		return "", fmt.Errorf("storm: the sentinels' master: %w", err)
	}
	return a[0] + ":" + a[1], nil
}

// promoted waits until every sentinel names a master other than old.
func (h *sentinelSet) promoted(ctx context.Context, old string) (string, error) {
	var nm string
	for _, a := range h.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a})
		for {
			m, err := sc.GetMasterAddrByName(ctx, sentinelMaster).Result()
			if err == nil && m[0]+":"+m[1] != old {
				nm = m[0] + ":" + m[1]
				break
			}
			select {
			case <-ctx.Done():
				_ = sc.Close()
				return "", fmt.Errorf("storm: sentinel %s still names %s: %w", a, old, context.Cause(ctx))
			case <-time.After(50 * time.Millisecond):
			}
		}
		_ = sc.Close()
	}
	return nm, nil
}

// failover has a sentinel fail the master over (SENTINEL FAILOVER: the
// replica is promoted as it is, the old master turned into its replica)
// and returns when the sentinels name the new master (promoted) and when
// the old master is its replica again (settled).
func (h *sentinelSet) failover(ctx context.Context) (old, nm string, promoted, settled time.Time, err error) {
	if old, err = h.master(ctx); err != nil {
		return "", "", promoted, settled, err
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: h.sentinels[0]})
	err = sc.Failover(ctx, sentinelMaster).Err()
	_ = sc.Close()
	if err != nil {
		return "", "", promoted, settled, fmt.Errorf("storm: SENTINEL FAILOVER: %w", err)
	}
	if nm, err = h.promoted(ctx, old); err != nil {
		return old, "", promoted, settled, err
	}
	promoted = time.Now()
	err = h.settled(ctx, nm)
	return old, nm, promoted, time.Now(), err
}

// killMaster kills the master with SIGKILL, as a crash would (what it had
// not yet sent its replica is lost), and returns once the sentinels have
// promoted the replica.
func (h *sentinelSet) killMaster(ctx context.Context) (old, nm string, err error) {
	if old, err = h.master(ctx); err != nil {
		return "", "", err
	}
	h.mu.Lock()
	p := h.procs[old]
	h.mu.Unlock()
	if p == nil {
		return "", "", fmt.Errorf("storm: no redis-server of ours at %s", old)
	}
	p.kill()
	nm, err = h.promoted(ctx, old)
	return old, nm, err
}

// restart starts the killed server at addr again, empty; the sentinels
// turn it into the new master's replica. It returns once they have.
func (h *sentinelSet) restart(ctx context.Context, s *system, addr, master string) error {
	h.mu.Lock()
	args := h.args[addr]
	h.n++
	name := fmt.Sprintf("redis-restarted-%d", h.n)
	h.mu.Unlock()
	p, err := startProcess(name, s.dir, s.redisBin, args, os.Environ(), s.onExit)
	if err != nil {
		return err
	}
	s.addProc(p)
	h.mu.Lock()
	h.procs[addr] = p
	h.mu.Unlock()
	return h.settled(ctx, master)
}
