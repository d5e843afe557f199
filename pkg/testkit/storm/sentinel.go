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

	"bulwark/pkg/testkit/redisha"
)

// A system with options.Sentinel runs its Redis as the master of a
// Sentinel setup: the redis-server that startSystemWith starts anyway is
// the master, and this file adds one replica (redis-replica) and three
// sentinels (redis-sentinel-1…3, configured by redisha.SentinelConfig:
// quorum 2, down-after-milliseconds 1000).
// The api and worker processes then reach Redis through the sentinels
// (redis.mode sentinel) and answer 202 only once the replica holds a
// request (redis.min_replicas_acked 1), so that a failover test can fail
// the master over — coordinated (failover) or killed (killMaster) — in the
// middle of a storm.

// sentinelMaster is the name the sentinels monitor the master under.
const sentinelMaster = "storm"

// sentinelSet is the replica and sentinels of a system. What is asked of
// them once they run is package redisha's (shared with pkg/testkit/testenv); this
// file starts, kills and restarts the processes.
type sentinelSet struct {
	// sentinels are the sentinels' addresses and sentinelMaster; filled
	// in by startSentinel, read-only after.
	sentinels redisha.Sentinels

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
	ha := &sentinelSet{sentinels: redisha.Sentinels{MasterName: sentinelMaster},
		procs: map[string]*process{s.redisAddr: master}, args: map[string][]string{s.redisAddr: s.redisArgs}}
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
		doc, err := redisha.SentinelConfig(p, s.dir, sentinelMaster, s.redisAddr)
		if err != nil {
			return err
		}
		if err := os.WriteFile(conf, []byte(doc), 0o600); err != nil {
			return fmt.Errorf("storm: sentinel config: %w", err)
		}
		sp, err := startProcess(fmt.Sprintf("redis-sentinel-%d", i+1), s.dir, s.redisBin, []string{conf, "--sentinel"},
			os.Environ(), s.onExit)
		if err != nil {
			return err
		}
		s.addProc(sp)
		ha.sentinels.Addrs = append(ha.sentinels.Addrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	return ha.settled(ctx, s.redisAddr)
}

// yaml is the configuration's redis section for the set: the processes
// reach the master through the sentinels and answer 202 only once the
// replica holds a request.
func (h *sentinelSet) yaml() string {
	addrs := make([]string, len(h.sentinels.Addrs))
	for i, a := range h.sentinels.Addrs {
		addrs[i] = strconv.Quote(a)
	}
	return fmt.Sprintf("redis: {mode: sentinel, sentinel: {master_name: %s, addrs: [%s]}, min_replicas_acked: 1, replica_ack_timeout: 500ms}",
		h.sentinels.MasterName, strings.Join(addrs, ", "))
}

// settled waits until master has its replica online and every sentinel
// names master and sees one replica with its link up and the two other
// sentinels (redisha.Sentinels.Settled).
func (h *sentinelSet) settled(ctx context.Context, master string) error {
	if err := h.sentinels.Settled(ctx, master); err != nil {
		return fmt.Errorf("storm: sentinel setup: %w", err)
	}
	return nil
}

// promoted waits until every sentinel names a master other than old.
func (h *sentinelSet) promoted(ctx context.Context, old string) (string, error) {
	nm, err := h.sentinels.Promoted(ctx, old)
	if err != nil {
		return "", fmt.Errorf("storm: sentinel setup: %w", err)
	}
	return nm, nil
}

// failover has a sentinel fail the master over (SENTINEL FAILOVER: the
// replica is promoted as it is, the old master turned into its replica)
// and returns when the sentinels name the new master (promoted) and when
// the old master is its replica again (settled).
func (h *sentinelSet) failover(ctx context.Context) (old, nm string, promoted, settled time.Time, err error) {
	if old, err = h.sentinels.Failover(ctx); err != nil {
		return "", "", promoted, settled, fmt.Errorf("storm: %w", err)
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
	if old, err = h.sentinels.Master(ctx); err != nil {
		return "", "", fmt.Errorf("storm: %w", err)
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
