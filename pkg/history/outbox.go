package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/compactjson"
	"bulwark/pkg/job"
)

// OutboxMaxDefault bounds the outcomes kept while PostgreSQL is down: about
// 20 MB of Redis at typical answer sizes, a few hours of a busy fleet.
const OutboxMaxDefault = 10_000

// replayBatch is how many kept outcomes one Replay step reads.
const replayBatch = 100

// outbox is a Redis list of outcomes whose write failed, newest first,
// and the set of those a replay took and has not written yet (inflight).
type outbox struct {
	rdb      redis.UniversalClient
	key      string
	inflight string
	bytes    string // hash: tenant → bytes of its entries, waiting or held
	max      int
}

// replayLease is how long a replay may hold the entries it took before
// another replay takes them back (the replayer died): longer than writing
// one batch may take (replayBatch writes of up to 2 s each).
const replayLease = 5 * time.Minute

// inflightKey is the sorted set of the entries replays hold, in the hash
// slot of key (Redis Cluster: the scripts touch both): key's own hash tag
// when it has one, else key whole as the tag.
func inflightKey(key string) string {
	if strings.Contains(key, "{") {
		return key + ":replaying"
	}
	return "{" + key + "}:replaying"
}

// bytesKey is the hash of what each tenant's entries take, in the hash
// slot of key (as inflightKey).
func bytesKey(key string) string {
	if strings.Contains(key, "{") {
		return key + ":bytes"
	}
	return "{" + key + "}:bytes"
}

// kept is one outcome waiting in the outbox.
type kept struct {
	Record  *job.Record `json:"record"`
	CostUSD float64     `json:"cost_usd"`
}

// Outbox keeps the outcomes whose write fails in the Redis list key, up to
// max (0: OutboxMaxDefault), for Replay. Call it before the store is used.
func (s *Store) Outbox(rdb redis.UniversalClient, key string, max int) {
	if max <= 0 {
		max = OutboxMaxDefault
	}
	s.outbox = &outbox{rdb: rdb, key: key, inflight: inflightKey(key), bytes: bytesKey(key), max: max}
}

// pushScript: KEYS[1] outbox, KEYS[2] bytes; ARGV[1] max, ARGV[2..] pairs
// of tenant and entry, oldest first. Reply: how many entries, from the
// first, were kept before the outbox was full.
var pushScript = redis.NewScript(`
local room = tonumber(ARGV[1]) - redis.call("LLEN", KEYS[1])
local n = 0
for i = 2, #ARGV, 2 do
  if n >= room then break end
  redis.call("LPUSH", KEYS[1], ARGV[i + 1])
  redis.call("HINCRBY", KEYS[2], ARGV[i], #ARGV[i + 1])
  n = n + 1
end
return n`)

// keep puts a failed outcome in the outbox; what cannot be kept is counted
// and logged with the request id, so the operator knows which rows miss.
func (s *Store) keep(ctx context.Context, rec *job.Record, costUSD float64) {
	s.keepAll(ctx, []kept{{Record: rec, CostUSD: costUSD}})
}

// slim is what of rec its row needs (outcome): the request itself (the
// prompt, tools, metadata), which the requests table does not hold, would
// make an outcome kept through an outage as large as the record.
func slim(rec *job.Record) *job.Record {
	j := rec.Job
	out := &job.Record{Status: rec.Status, Reason: rec.Reason, State: rec.State,
		Job: job.Job{ID: j.ID, Tenant: j.Tenant, Priority: j.Priority, Route: j.Route, CaseID: j.CaseID,
			Layer: j.Layer, CreatedAt: j.CreatedAt}}
	return out
}

// keepAll puts outcomes, oldest first, in the outbox in one round trip,
// each counted against its tenant (HeldBy).
func (s *Store) keepAll(ctx context.Context, ks []kept) {
	if s.outbox == nil || len(ks) == 0 {
		return
	}
	args := []any{s.outbox.max}
	for _, k := range ks {
		b, err := compactjson.Marshal(kept{Record: slim(k.Record), CostUSD: k.CostUSD})
		if err != nil {
			s.lost(k.Record.Job.ID, err)
			continue
		}
		args = append(args, k.Record.Job.Tenant, b)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keepTimeout)
	defer cancel()
	n, err := pushScript.Run(ctx, s.outbox.rdb, []string{s.outbox.key, s.outbox.bytes}, args...).Int64()
	if err == nil && int(n) == (len(args)-1)/2 {
		return
	}
	if err == nil {
		err = fmt.Errorf("outbox full (%d outcomes)", s.outbox.max)
	} else {
		n = 0
		err = fmt.Errorf("history: outbox: %w", err)
	}
	for _, k := range ks[n:] {
		s.lost(k.Record.Job.ID, err)
	}
}

// HeldBy returns the bytes each tenant's outcomes take in the outbox,
// waiting or held by a replay: they count against its Redis budget
// (pkg/job budget.go). Empty without an outbox.
func (s *Store) HeldBy(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	if s.outbox == nil {
		return out, nil
	}
	all, err := s.outbox.rdb.HGetAll(ctx, s.outbox.bytes).Result()
	if err != nil {
		return nil, fmt.Errorf("history: outbox: %w", err)
	}
	for t, v := range all {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
			out[t] = n
		}
	}
	return out, nil
}

// keepTimeout bounds one push to the outbox.
const keepTimeout = 2 * time.Second

// lost counts and logs an outcome history will never have.
func (s *Store) lost(id string, err error) {
	if s.OnDrop != nil {
		s.OnDrop()
	}
	s.logger.Error("history: outcome lost; its row stays as it was", "request_id", id, "err", err)
}

// refused reports whether PostgreSQL refused the data itself (SQLSTATE
// class 22, e.g. a NUL in text or jsonb): writing it again fails again.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// Backlog is how many outcomes wait in the outbox, those a replay holds
// (taken, not yet written) included: none of their rows may be judged
// lost (pkg/maintenance's reconcile job).
func (s *Store) Backlog(ctx context.Context) (int64, error) {
	if s.outbox == nil {
		return 0, nil
	}
	p := s.outbox.rdb.Pipeline()
	waiting := p.LLen(ctx, s.outbox.key)
	held := p.ZCard(ctx, s.outbox.inflight)
	if _, err := p.Exec(ctx); err != nil {
		return 0, fmt.Errorf("history: outbox: %w", err)
	}
	return waiting.Val() + held.Val(), nil
}

// claimScript: KEYS[1] outbox, KEYS[2] inflight; ARGV[1] count, ARGV[2]
// lease (ms). It first returns the entries whose lease ran out (their
// replayer died) to the outbox's oldest end, then moves up to count of the
// oldest entries into inflight, leased until now + lease (Redis TIME), and
// replies with them, oldest first. Nothing is ever in neither place.
var claimScript = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", now)
for _, e in ipairs(expired) do
  redis.call("RPUSH", KEYS[1], e)
  redis.call("ZREM", KEYS[2], e)
end
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local e = redis.call("RPOP", KEYS[1])
  if not e then break end
  redis.call("ZADD", KEYS[2], now + tonumber(ARGV[2]), e)
  out[#out + 1] = e
end
return out`)

// releaseScript: KEYS[1] outbox, KEYS[2] inflight, KEYS[3] bytes; ARGV[1]
// n, ARGV[2] m, ARGV[3..m+2] the m entries a replay took, oldest first,
// then the tenants of the first n ("" unknown). The first n are done with:
// they leave inflight and their tenants' counts; the others go back to the
// outbox's oldest end, in their order. Reply: nil.
var releaseScript = redis.NewScript(`
local n, m = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = m + 2, 3, -1 do
  redis.call("ZREM", KEYS[2], ARGV[i])
  if i - 2 > n then redis.call("RPUSH", KEYS[1], ARGV[i]) end
end
for i = 1, n do
  local t = ARGV[m + 2 + i]
  if t ~= "" and redis.call("HINCRBY", KEYS[3], t, -#ARGV[i + 2]) <= 0 then redis.call("HDEL", KEYS[3], t) end
end
return false`)

// Replay writes the kept outcomes, oldest first, until the outbox is empty
// or a write fails (PostgreSQL still down: the rest goes back and waits for
// the next call). It returns how many it wrote. A replay takes a batch into
// a leased in-flight set rather than out of Redis, so two replayers never
// write the same entry, the reconcile job still sees the entries while
// they are written (Backlog), and the batch of a replayer that dies goes
// back to the outbox once its lease (replayLease) runs out.
func (s *Store) Replay(ctx context.Context) (int, error) {
	if s.outbox == nil {
		return 0, nil
	}
	o := s.outbox
	done := 0
	for {
		entries, err := claimScript.Run(ctx, o.rdb, []string{o.key, o.inflight}, replayBatch, replayLease.Milliseconds()).StringSlice()
		if errors.Is(err, redis.Nil) || (err == nil && len(entries) == 0) {
			return done, nil
		}
		if err != nil {
			return done, fmt.Errorf("history: outbox: %w", err)
		}
		owners, written, werr := s.replay(ctx, entries)
		done += written
		s.release(ctx, entries, owners)
		if werr != nil {
			return done, werr
		}
	}
}

// replay writes entries, oldest first, until the first failure: the
// handled entries (written or dropped; owners names their tenants, ""
// for one unreadable) are done with, written ones are in PostgreSQL. An
// entry that cannot be decoded, or that PostgreSQL refuses, is dropped,
// logged and counted (OnDrop).
func (s *Store) replay(ctx context.Context, entries []string) (owners []string, written int, err error) {
	for _, e := range entries {
		var k kept
		if err := json.Unmarshal([]byte(e), &k); err != nil || k.Record == nil {
			s.logger.Error("history: dropping an unreadable outbox entry", "err", err)
			if s.OnDrop != nil {
				s.OnDrop()
			}
			owners = append(owners, "")
			continue
		}
		if err := s.finished(ctx, k.Record, k.CostUSD); err != nil {
			if refused(err) {
				s.lost(k.Record.Job.ID, err) // retrying cannot help; it would block the rest
				owners = append(owners, k.Record.Job.Tenant)
				continue
			}
			return owners, written, fmt.Errorf("history: replay %s: %w", k.Record.Job.ID, err)
		}
		owners = append(owners, k.Record.Job.Tenant)
		written++
	}
	return owners, written, nil
}

// release ends a replay's hold on entries: the first len(owners) are done
// with (and no longer count against their tenants), the rest (unwritten,
// oldest first) return to the outbox's oldest end. If Redis fails here
// the entries stay leased and come back to the outbox when the lease runs
// out: written ones are written again (an upsert, harmless), none is lost.
func (s *Store) release(ctx context.Context, entries []string, owners []string) {
	args := make([]any, 0, len(entries)+len(owners)+2)
	args = append(args, len(owners), len(entries))
	for _, e := range entries {
		args = append(args, e)
	}
	for _, o := range owners {
		args = append(args, o)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keepTimeout)
	defer cancel()
	err := releaseScript.Run(ctx, s.outbox.rdb, []string{s.outbox.key, s.outbox.inflight, s.outbox.bytes}, args...).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		s.logger.Warn("history: could not release replayed outbox entries; they return when their lease runs out",
			"count", len(entries), "lease", replayLease, "err", err)
	}
}
