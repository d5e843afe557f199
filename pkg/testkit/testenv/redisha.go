package testenv

// Redis Cluster and Redis Sentinel for tests: real redis-server processes
// (scripts/deps.sh installs redis-server and redis-cli; Sentinel is the
// same binary with --sentinel) on free loopback ports, their files in the
// test's temporary folder, stopped at cleanup. No persistence: each lives
// for one test. What a Sentinel setup is asked once it runs (who is
// master, wait for a failover) is package redisha's, which the fault
// bench (pkg/testkit/storm) shares; this file starts, kills and restarts the
// processes.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/testkit/ports"
	"bulwark/pkg/testkit/redisha"
)

// haStartTimeout bounds the start of a cluster or a sentinel setup.
const haStartTimeout = 60 * time.Second

// server is one redis-server process.
type server struct {
	name string
	addr string
	args []string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// start runs the server in dir; it does not wait for it to answer.
func (s *server) start(dir string) error {
	f, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command("redis-server", s.args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = dir, f, f, sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("testenv: start %s (redis-server on PATH? scripts/deps.sh installs it): %w", s.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// kill sends sig and waits for the process to exit.
func (s *server) kill(sig os.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// freePorts returns n distinct free loopback ports (pkg/testkit/ports).
func freePorts(n int) ([]int, error) {
	p, err := ports.Free(n)
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	return p, nil
}

// poll is redisha.Poll with this package's name on its error.
func poll(ctx context.Context, what string, ok func(ctx context.Context) (bool, error)) error {
	if err := redisha.Poll(ctx, what, ok); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	return nil
}

// logTails returns the last lines of each server's log, for a failure.
func logTails(servers []*server) string {
	var b strings.Builder
	for _, s := range servers {
		raw, _ := os.ReadFile(s.log)
		lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
		fmt.Fprintf(&b, "----- %s (%s) -----\n%s\n", s.name, s.addr, strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
	return b.String()
}

// Cluster is a Redis Cluster of three masters on loopback, each with a
// replica when started by RedisClusterWithReplicas.
type Cluster struct {
	// Addrs are the masters' host:port at the start.
	Addrs []string
	// Replicas are the replicas' host:port at the start (none for
	// RedisCluster).
	Replicas []string
	servers  []*server
}

// RedisCluster starts a three-master Redis Cluster for t, every hash slot
// assigned and cluster_state:ok on every node, stopped at cleanup.
func RedisCluster(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, 0)
}

// RedisClusterWithReplicas starts a three-master Redis Cluster whose
// masters each have a replica in sync, for failover tests (Failover).
func RedisClusterWithReplicas(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, 1)
}

func startCluster(t testing.TB, replicas int) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), haStartTimeout)
	defer cancel()
	dir := t.TempDir()
	n := 3 * (1 + replicas)
	ports, err := freePorts(2 * n) // client ports, then cluster-bus ports
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{}
	t.Cleanup(func() { stopAll(c.servers) })
	var all []string
	for i := range n {
		p, bus := strconv.Itoa(ports[i]), strconv.Itoa(ports[n+i])
		s := &server{name: "cluster-" + p, addr: "127.0.0.1:" + p, log: filepath.Join(dir, "cluster-"+p+".log"),
			args: []string{"--port", p, "--bind", "127.0.0.1", "--cluster-enabled", "yes", "--cluster-port", bus,
				"--cluster-config-file", "nodes-" + p + ".conf", "--cluster-node-timeout", "5000",
				"--save", "", "--appendonly", "no", "--dir", dir, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}}
		if err := s.start(dir); err != nil {
			t.Fatal(err)
		}
		c.servers = append(c.servers, s)
		all = append(all, s.addr)
	}
	for _, s := range c.servers {
		if err := waitPing(ctx, s.addr); err != nil {
			t.Fatalf("%v\n%s", err, logTails(c.servers))
		}
	}
	args := append([]string{"--cluster", "create"}, all...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s\n%s", err, out, logTails(c.servers))
	}
	for _, s := range c.servers {
		if err := c.waitNode(ctx, s.addr, n); err != nil {
			t.Fatalf("%v\n%s", err, logTails(c.servers))
		}
	}
	// A manual failover needs the master to know the replica as its own;
	// that spreads by gossip after the replicas synced.
	for _, s := range c.servers {
		if err := waitTopology(ctx, s.addr, 3, 3*replicas); err != nil {
			t.Fatalf("%v\n%s", err, logTails(c.servers))
		}
	}
	return c
}

// waitTopology waits until the node at addr sees masters masters and
// replicas replicas, each connected and none flagged failing or in
// handshake (CLUSTER NODES).
func waitTopology(ctx context.Context, addr string, masters, replicas int) error {
	cl := redis.NewClient(&redis.Options{Addr: addr})
	defer cl.Close()
	return poll(ctx, "cluster topology seen by "+addr, func(ctx context.Context) (bool, error) {
		nodes, err := cl.ClusterNodes(ctx).Result()
		if err != nil {
			return false, err
		}
		m, r := 0, 0
		for line := range strings.SplitSeq(strings.TrimSpace(nodes), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || f[7] != "connected" {
				return false, nil
			}
			flags := strings.Split(f[2], ",") // e.g. myself,master; slave; master,fail?
			if slices.ContainsFunc(flags, func(fl string) bool {
				return fl == "fail" || fl == "fail?" || fl == "handshake" || fl == "noaddr"
			}) {
				return false, nil
			}
			switch {
			case slices.Contains(flags, "master"):
				m++
			case slices.Contains(flags, "slave") && f[3] != "-":
				r++
			}
		}
		return m == masters && r == replicas, nil
	})
}

// waitNode waits until the node at addr sees a healthy cluster of n nodes
// and, when it is a replica, is in sync with its master; it records the
// node as master or replica.
func (c *Cluster) waitNode(ctx context.Context, addr string, n int) error {
	cl := redis.NewClient(&redis.Options{Addr: addr})
	defer cl.Close()
	known := "cluster_known_nodes:" + strconv.Itoa(n)
	if err := poll(ctx, "cluster_state:ok on "+addr, func(ctx context.Context) (bool, error) {
		info, err := cl.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, known), err
	}); err != nil {
		return err
	}
	role, err := redisha.InfoField(ctx, cl, "replication", "role")
	if err != nil {
		return err
	}
	if role == "master" {
		c.Addrs = append(c.Addrs, addr)
		return nil
	}
	c.Replicas = append(c.Replicas, addr)
	return poll(ctx, "replica "+addr+" in sync", func(ctx context.Context) (bool, error) {
		v, err := redisha.InfoField(ctx, cl, "replication", "master_link_status")
		return v == "up", err
	})
}

// masterAndReplica returns the addresses of the master that holds key and
// of its replica.
func (c *Cluster) masterAndReplica(ctx context.Context, key string) (master, replica string, err error) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	defer cc.Close()
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return "", "", fmt.Errorf("testenv: master of %s: %w", key, err)
	}
	master = m.Options().Addr
	slave0, err := redisha.InfoField(ctx, m, "replication", "slave0")
	if err != nil || slave0 == "" {
		return "", "", fmt.Errorf("testenv: replica of %s: %q %v", master, slave0, err)
	}
	return master, replicaAddr(slave0), nil
}

// Failover has the replica of the master that holds key take over (a
// coordinated CLUSTER FAILOVER: the replica catches up first, so no
// acknowledged write is lost) and returns the old and the new master's
// addresses once the new one serves the slot and the old one replicates it.
func (c *Cluster) Failover(ctx context.Context, key string) (old, promoted string, err error) {
	old, promoted, err = c.masterAndReplica(ctx, key)
	if err != nil {
		return "", "", err
	}
	rc := redis.NewClient(&redis.Options{Addr: promoted})
	defer rc.Close()
	if err := rc.ClusterFailover(ctx).Err(); err != nil {
		return "", "", fmt.Errorf("testenv: CLUSTER FAILOVER on %s: %w", promoted, err)
	}
	oc := redis.NewClient(&redis.Options{Addr: old})
	defer oc.Close()
	err = poll(ctx, promoted+" master and "+old+" its replica", func(ctx context.Context) (bool, error) {
		r, err := redisha.InfoField(ctx, rc, "replication", "role")
		if err != nil || r != "master" {
			return false, err
		}
		link, err := redisha.InfoField(ctx, oc, "replication", "master_link_status")
		return link == "up", err
	})
	if err != nil {
		return "", "", fmt.Errorf("%w\n%s", err, logTails(c.servers))
	}
	return old, promoted, nil
}

// Kill kills the master that holds key with SIGKILL (no coordination: the
// cluster must notice it is gone, after cluster-node-timeout, and elect its
// replica) and returns the old and the new master's addresses once the
// new one serves the slot. The old master stays down until Restart.
func (c *Cluster) Kill(ctx context.Context, key string) (old, promoted string, err error) {
	old, promoted, err = c.masterAndReplica(ctx, key)
	if err != nil {
		return "", "", err
	}
	srv := c.server(old)
	if srv == nil {
		return "", "", fmt.Errorf("testenv: no server at %s", old)
	}
	srv.kill(os.Kill)
	rc := redis.NewClient(&redis.Options{Addr: promoted})
	defer rc.Close()
	err = poll(ctx, promoted+" elected master in place of "+old, func(ctx context.Context) (bool, error) {
		r, err := redisha.InfoField(ctx, rc, "replication", "role")
		if err != nil || r != "master" {
			return false, err
		}
		info, err := rc.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok"), err
	})
	if err != nil {
		return "", "", fmt.Errorf("%w\n%s", err, logTails(c.servers))
	}
	return old, promoted, nil
}

// Restart starts a killed node again on its address and configuration
// file: it learns it was replaced and rejoins as the new master's
// replica. It returns once that replica is in sync.
func (c *Cluster) Restart(ctx context.Context, addr string) error {
	srv := c.server(addr)
	if srv == nil {
		return fmt.Errorf("testenv: no server at %s", addr)
	}
	if err := srv.start(filepath.Dir(srv.log)); err != nil {
		return err
	}
	cl := redis.NewClient(&redis.Options{Addr: addr})
	defer cl.Close()
	err := poll(ctx, addr+" back as a replica in sync", func(ctx context.Context) (bool, error) {
		r, err := redisha.InfoField(ctx, cl, "replication", "role")
		if err != nil || r != "slave" {
			return false, nil // still starting or not yet told
		}
		link, err := redisha.InfoField(ctx, cl, "replication", "master_link_status")
		return link == "up", err
	})
	if err != nil {
		return fmt.Errorf("%w\n%s", err, logTails(c.servers))
	}
	return nil
}

// server is the process at addr, or nil.
func (c *Cluster) server(addr string) *server {
	for _, s := range c.servers {
		if s.addr == addr {
			return s
		}
	}
	return nil
}

// replicaAddr reads host:port from an INFO replication slaveN value
// ("ip=127.0.0.1,port=7001,state=online,offset=…,lag=0").
func replicaAddr(v string) string {
	var ip, port string
	for f := range strings.SplitSeq(v, ",") {
		k, val, _ := strings.Cut(f, "=")
		switch k {
		case "ip":
			ip = val
		case "port":
			port = val
		}
	}
	return net.JoinHostPort(ip, port)
}

// Client returns a cluster client, closed at cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { cl.Close() })
	return cl
}

// ErrorStats sums every master's INFO errorstats: error prefix (CROSSSLOT,
// NOSCRIPT, ERR, …) → count of replies with it since the start.
func (c *Cluster) ErrorStats(ctx context.Context) (map[string]int, error) {
	// errorstat_CROSSSLOT:count=3
	return c.sumInfo(ctx, "errorstats", "errorstat_", "count")
}

// FailedCommands sums every master's INFO commandstats: command → calls
// that failed or were rejected, for a failure's log.
func (c *Cluster) FailedCommands(ctx context.Context) (map[string]int, error) {
	// cmdstat_get:calls=1,usec=2,usec_per_call=2.00,rejected_calls=0,failed_calls=0
	return c.sumInfo(ctx, "commandstats", "cmdstat_", "rejected_calls", "failed_calls")
}

// sumInfo reads an INFO section of every master, takes its lines
// "<prefix><name>:<field>=<n>,<field>=<n>,…" and returns name → the sum,
// over the masters, of the fields named.
func (c *Cluster) sumInfo(ctx context.Context, section, prefix string, fields ...string) (map[string]int, error) {
	out := map[string]int{}
	for _, a := range c.Addrs {
		cl := redis.NewClient(&redis.Options{Addr: a})
		s, err := cl.Info(ctx, section).Result()
		cl.Close()
		if err != nil {
			return nil, fmt.Errorf("testenv: %s of %s: %w", section, a, err)
		}
		for l := range strings.SplitSeq(s, "\r\n") {
			name, rest, ok := strings.Cut(strings.TrimPrefix(l, prefix), ":")
			if !ok || !strings.HasPrefix(l, prefix) {
				continue
			}
			for f := range strings.SplitSeq(rest, ",") {
				k, v, _ := strings.Cut(f, "=")
				if slices.Contains(fields, k) {
					n, _ := strconv.Atoi(v)
					out[name] += n
				}
			}
		}
	}
	return out, nil
}

// Sentinel is a Redis master, one replica and three sentinels watching
// them (quorum 2), on loopback.
type Sentinel struct {
	// MasterName is the name the sentinels monitor the master under.
	MasterName string
	// Sentinels are the sentinels' host:port.
	Sentinels []string

	mu      sync.Mutex
	servers map[string]*server // data servers by address; guarded by mu
	all     []*server          // every process, for logs and cleanup; guarded by mu
	dir     string
}

// SentinelMasterName is the name RedisSentinel's sentinels monitor.
const SentinelMasterName = "bulwark-test"

// RedisSentinel starts a master, a replica of it in sync, and three
// sentinels that each see the master, the replica and the two other
// sentinels, configured by redisha.SentinelConfig (a dead master is
// failed over within seconds); everything stops at cleanup.
func RedisSentinel(t testing.TB) *Sentinel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), haStartTimeout)
	defer cancel()
	dir := t.TempDir()
	ports, err := freePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	s := &Sentinel{MasterName: SentinelMasterName, servers: map[string]*server{}, dir: dir}
	t.Cleanup(func() {
		s.mu.Lock()
		all := s.all
		s.mu.Unlock()
		stopAll(all)
	})
	master := "127.0.0.1:" + strconv.Itoa(ports[0])
	for i, role := range []string{"master", "replica"} {
		p := strconv.Itoa(ports[i])
		args := []string{"--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
			"--dbfilename", "dump-" + p + ".rdb", "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}
		if role == "replica" {
			args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(ports[0]))
		}
		srv := &server{name: role + "-" + p, addr: "127.0.0.1:" + p, log: filepath.Join(dir, role+"-"+p+".log"), args: args}
		if err := s.add(srv, true); err != nil {
			t.Fatal(err)
		}
	}
	for i := 2; i < 5; i++ {
		p := strconv.Itoa(ports[i])
		conf := filepath.Join(dir, "sentinel-"+p+".conf")
		doc, err := redisha.SentinelConfig(ports[i], dir, s.MasterName, master)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(conf, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		srv := &server{name: "sentinel-" + p, addr: "127.0.0.1:" + p, log: filepath.Join(dir, "sentinel-"+p+".log"),
			args: []string{conf, "--sentinel"}}
		if err := s.add(srv, false); err != nil {
			t.Fatal(err)
		}
		s.Sentinels = append(s.Sentinels, srv.addr)
	}
	if err := s.waitSettled(ctx, master); err != nil {
		t.Fatal(err)
	}
	return s
}

// add starts srv and records it (data servers by address too).
func (s *Sentinel) add(srv *server, data bool) error {
	if err := srv.start(s.dir); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, srv)
	if data {
		s.servers[srv.addr] = srv
	}
	return nil
}

func (s *Sentinel) logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return logTails(s.all)
}

// ha is the setup as package redisha queries it.
func (s *Sentinel) ha() redisha.Sentinels {
	return redisha.Sentinels{Addrs: s.Sentinels, MasterName: s.MasterName}
}

// waitSettled waits until master has its replica online and every
// sentinel names master as the master and sees one replica (not down) and
// the two other sentinels (redisha.Sentinels.Settled), with the servers'
// logs on an error.
func (s *Sentinel) waitSettled(ctx context.Context, master string) error {
	if err := s.ha().Settled(ctx, master); err != nil {
		return fmt.Errorf("%w\n%s", err, s.logs())
	}
	return nil
}

// Master returns the address the sentinels currently name as master.
func (s *Sentinel) Master(ctx context.Context) (string, error) {
	return s.ha().Master(ctx)
}

// Replica returns the address of the replica the sentinels know.
func (s *Sentinel) Replica(ctx context.Context) (string, error) {
	return s.ha().Replica(ctx)
}

// Failover has a sentinel fail the master over to the replica (SENTINEL
// FAILOVER, no agreement needed) and returns once the sentinels have
// settled on the new master with the old one as its replica.
func (s *Sentinel) Failover(ctx context.Context) (newMaster string, err error) {
	old, err := s.ha().Failover(ctx)
	if err != nil {
		return "", err
	}
	nm, err := s.awaitPromoted(ctx, old)
	if err != nil {
		return "", err
	}
	if err := s.waitSettled(ctx, nm); err != nil {
		return "", err
	}
	return nm, nil
}

// Kill kills the master with SIGKILL and returns once the sentinels have
// promoted the replica; the old master stays down until Restart.
func (s *Sentinel) Kill(ctx context.Context) (killed, newMaster string, err error) {
	old, err := s.Master(ctx)
	if err != nil {
		return "", "", err
	}
	s.mu.Lock()
	srv := s.servers[old]
	s.mu.Unlock()
	srv.kill(os.Kill)
	nm, err := s.awaitPromoted(ctx, old)
	return old, nm, err
}

// Restart starts a killed server again on its address; the sentinels
// turn it into a replica of the current master. It returns once the
// sentinels have settled with it as the replica.
func (s *Sentinel) Restart(ctx context.Context, addr string) error {
	s.mu.Lock()
	srv := s.servers[addr]
	s.mu.Unlock()
	if srv == nil {
		return fmt.Errorf("testenv: no server at %s", addr)
	}
	if err := srv.start(s.dir); err != nil {
		return err
	}
	master, err := s.Master(ctx)
	if err != nil {
		return err
	}
	return s.waitSettled(ctx, master)
}

// awaitPromoted waits until every sentinel names a master other than
// old, with the servers' logs on an error.
func (s *Sentinel) awaitPromoted(ctx context.Context, old string) (string, error) {
	nm, err := s.ha().Promoted(ctx, old)
	if err != nil {
		return "", fmt.Errorf("%w\n%s", err, s.logs())
	}
	return nm, nil
}

// stopAll stops servers with SIGTERM (no persistence: they exit at once).
func stopAll(servers []*server) {
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Go(func() { s.kill(os.Interrupt) })
	}
	wg.Wait()
}

// waitPing waits until addr answers PING.
func waitPing(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	return poll(ctx, "PING "+addr, func(ctx context.Context) (bool, error) {
		err := c.Ping(ctx).Err()
		return err == nil, err
	})
}
