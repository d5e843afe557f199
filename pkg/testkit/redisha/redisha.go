package redisha

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// PollInterval is how often the waits ask again.
const PollInterval = 50 * time.Millisecond

// The sentinels' settings (SentinelConfig).
const (
	// quorum is the sentinels that must agree the master is down: two of
	// three, so that one sentinel alone cannot fail a master over.
	quorum = 2
	// downAfter is how long a master may not answer before a sentinel
	// thinks it down: short, so a killed master is failed over within
	// seconds, and still far above a loopback round trip.
	downAfter = time.Second
	// failoverTimeout bounds one failover attempt before the sentinels
	// try again.
	failoverTimeout = 10 * time.Second
)

// Poll calls ok every PollInterval until it reports true or ctx ends; the
// error then names what and the last error ok returned. It is for states
// Redis announces to nobody (a cluster formed, a replica synced).
func Poll(ctx context.Context, what string, ok func(ctx context.Context) (bool, error)) error {
	t := time.NewTicker(PollInterval)
	defer t.Stop()
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
			return fmt.Errorf("%s: %w (last error: %v)", what, context.Cause(ctx), last)
		case <-t.C:
		}
	}
}

// SentinelConfig is the configuration file of a sentinel that listens on
// 127.0.0.1:port, keeps its state in dir (a sentinel rewrites its file as
// it learns) and monitors the master at host:port master under name.
func SentinelConfig(port int, dir, name, master string) (string, error) {
	host, mport, err := net.SplitHostPort(master)
	if err != nil {
		return "", fmt.Errorf("redisha: sentinel config: master address: %w", err)
	}
	return fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s %d\n"+
		"sentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s %d\nsentinel parallel-syncs %s 1\n",
		port, dir, name, host, mport, quorum,
		name, downAfter.Milliseconds(), name, failoverTimeout.Milliseconds(), name), nil
}

// Sentinels is a Sentinel setup seen from outside: the sentinels and the
// name they monitor the master under. It holds no connections — each call
// opens and closes its own — so it is safe for concurrent use.
type Sentinels struct {
	// Addrs are the sentinels' host:port; the one-sentinel queries ask
	// the first.
	Addrs []string
	// MasterName is the name the sentinels monitor the master under.
	MasterName string
}

// Settled waits until master has its replica online and every sentinel
// names master as the master (not down) and sees one replica (not down,
// its link to master ok) and all the other sentinels.
func (s Sentinels) Settled(ctx context.Context, master string) error {
	mc := redis.NewClient(&redis.Options{Addr: master})
	defer func() { _ = mc.Close() }()
	if err := Poll(ctx, "replica online at "+master, func(ctx context.Context) (bool, error) {
		v, err := InfoField(ctx, mc, "replication", "slave0")
		return strings.Contains(v, "state=online"), err
	}); err != nil {
		return fmt.Errorf("redisha: %w", err)
	}
	for _, a := range s.Addrs {
		if err := s.settledAt(ctx, a, master); err != nil {
			return err
		}
	}
	return nil
}

// settledAt waits until the sentinel at addr sees what Settled waits for.
func (s Sentinels) settledAt(ctx context.Context, addr, master string) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer func() { _ = sc.Close() }()
	others := strconv.Itoa(len(s.Addrs) - 1)
	err := Poll(ctx, "sentinel "+addr+" settled on "+master, func(ctx context.Context) (bool, error) {
		m, err := sc.Master(ctx, s.MasterName).Result()
		if err != nil {
			return false, err
		}
		if net.JoinHostPort(m["ip"], m["port"]) != master || strings.Contains(m["flags"], "down") ||
			m["num-slaves"] != "1" || m["num-other-sentinels"] != others {
			return false, nil
		}
		reps, err := sc.Replicas(ctx, s.MasterName).Result()
		if err != nil || len(reps) != 1 {
			return false, err
		}
		return !strings.Contains(reps[0]["flags"], "down") && reps[0]["master-link-status"] == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("redisha: %w", err)
	}
	return nil
}

// Master returns the address the first sentinel names as master.
func (s Sentinels) Master(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addrs[0]})
	defer func() { _ = sc.Close() }()
	a, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		return "", fmt.Errorf("redisha: master of %s: %w", s.MasterName, err)
	}
	return net.JoinHostPort(a[0], a[1]), nil
}

// Replica returns the address of the one replica the first sentinel knows.
func (s Sentinels) Replica(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addrs[0]})
	defer func() { _ = sc.Close() }()
	reps, err := sc.Replicas(ctx, s.MasterName).Result()
	if err != nil {
		return "", fmt.Errorf("redisha: replicas of %s: %w", s.MasterName, err)
	}
	if len(reps) != 1 {
		return "", fmt.Errorf("redisha: replicas of %s: %d, want 1: %v", s.MasterName, len(reps), reps)
	}
	return net.JoinHostPort(reps[0]["ip"], reps[0]["port"]), nil
}

// Failover has the first sentinel fail the master over (SENTINEL
// FAILOVER: the replica is promoted as it is, no agreement needed) and
// returns the master before it. It does not wait: Promoted waits for the
// new master, Settled for the old one to replicate it.
func (s Sentinels) Failover(ctx context.Context) (old string, err error) {
	if old, err = s.Master(ctx); err != nil {
		return "", err
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addrs[0]})
	defer func() { _ = sc.Close() }()
	if err := sc.Failover(ctx, s.MasterName).Err(); err != nil {
		return "", fmt.Errorf("redisha: SENTINEL FAILOVER %s: %w", s.MasterName, err)
	}
	return old, nil
}

// Promoted waits until every sentinel names a master other than old and
// returns the one the last of them names.
func (s Sentinels) Promoted(ctx context.Context, old string) (string, error) {
	var nm string
	for _, a := range s.Addrs {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a})
		err := Poll(ctx, "sentinel "+a+" names a master other than "+old, func(ctx context.Context) (bool, error) {
			m, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
			if err != nil {
				return false, err
			}
			nm = net.JoinHostPort(m[0], m[1])
			return nm != old, nil
		})
		_ = sc.Close()
		if err != nil {
			return "", fmt.Errorf("redisha: %w", err)
		}
	}
	return nm, nil
}

// InfoField reads one field of an INFO section of the server c talks to
// ("" when absent).
func InfoField(ctx context.Context, c *redis.Client, section, field string) (string, error) {
	s, err := c.Info(ctx, section).Result()
	if err != nil {
		return "", err
	}
	for l := range strings.SplitSeq(s, "\r\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return v, nil
		}
	}
	return "", nil
}
