package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/job"
)

// OutboxMaxDefault bounds the outcomes kept while PostgreSQL is down: about
// 20 MB of Redis at typical answer sizes, a few hours of a busy fleet.
const OutboxMaxDefault = 10_000

// replayBatch is how many kept outcomes one Replay step reads.
const replayBatch = 100

// outbox is a Redis list of outcomes whose write failed, newest first.
type outbox struct {
	rdb redis.UniversalClient
	key string
	max int
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
	s.outbox = &outbox{rdb: rdb, key: key, max: max}
}

// pushScript: KEYS[1] outbox; ARGV[1] entry, ARGV[2] max. Reply 1 kept, 0
// full.
var pushScript = redis.NewScript(`
if redis.call("LLEN", KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call("LPUSH", KEYS[1], ARGV[1])
return 1`)

// keep puts a failed outcome in the outbox; what cannot be kept is counted
// and logged with the request id, so the operator knows which rows miss.
func (s *Store) keep(ctx context.Context, rec *job.Record, costUSD float64) {
	if s.outbox == nil {
		return
	}
	b, err := json.Marshal(kept{Record: rec, CostUSD: costUSD})
	if err == nil {
		var n int64
		n, err = pushScript.Run(context.WithoutCancel(ctx), s.outbox.rdb, []string{s.outbox.key}, b, s.outbox.max).Int64()
		if err == nil && n == 1 {
			return
		}
		if err == nil {
			err = fmt.Errorf("outbox full (%d outcomes)", s.outbox.max)
		}
	}
	s.lost(rec.Job.ID, err)
}

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

// Backlog is how many outcomes wait in the outbox.
func (s *Store) Backlog(ctx context.Context) (int64, error) {
	if s.outbox == nil {
		return 0, nil
	}
	n, err := s.outbox.rdb.LLen(ctx, s.outbox.key).Result()
	if err != nil {
		return 0, fmt.Errorf("history: outbox: %w", err)
	}
	return n, nil
}

// Replay writes the kept outcomes, oldest first, until the outbox is empty
// or a write fails (PostgreSQL still down: the rest goes back and waits for
// the next call). It returns how many it wrote. Entries are popped before
// they are written, so two replayers never write or drop the same one; a
// process that dies between the two loses at most one batch (logged by
// nobody: run Replay where a crash is rare, the workers' sweep).
func (s *Store) Replay(ctx context.Context) (int, error) {
	if s.outbox == nil {
		return 0, nil
	}
	done := 0
	for {
		entries, err := s.outbox.rdb.RPopCount(ctx, s.outbox.key, replayBatch).Result() // oldest first
		if errors.Is(err, redis.Nil) {
			return done, nil
		}
		if err != nil {
			return done, fmt.Errorf("history: outbox: %w", err)
		}
		handled, written, werr := s.replay(ctx, entries)
		done += written
		if werr != nil {
			s.putBack(ctx, entries[handled:])
			return done, werr
		}
	}
}

// replay writes entries, oldest first, until the first failure: handled
// entries are done with (written or dropped), written ones are in
// PostgreSQL. An entry that cannot be decoded, or that PostgreSQL refuses,
// is dropped, logged and counted (OnDrop).
func (s *Store) replay(ctx context.Context, entries []string) (handled, written int, err error) {
	for i, e := range entries {
		var k kept
		if err := json.Unmarshal([]byte(e), &k); err != nil || k.Record == nil {
			s.logger.Error("history: dropping an unreadable outbox entry", "err", err)
			if s.OnDrop != nil {
				s.OnDrop()
			}
			continue
		}
		if err := s.finished(ctx, k.Record, k.CostUSD); err != nil {
			if refused(err) {
				s.lost(k.Record.Job.ID, err) // retrying cannot help; it would block the rest
				continue
			}
			return i, written, fmt.Errorf("history: replay %s: %w", k.Record.Job.ID, err)
		}
		written++
	}
	return len(entries), written, nil
}

// putBack returns unwritten entries (oldest first) to the outbox's oldest
// end, in their order.
func (s *Store) putBack(ctx context.Context, rest []string) {
	if len(rest) == 0 {
		return
	}
	vals := make([]any, 0, len(rest))
	for i := len(rest) - 1; i >= 0; i-- {
		vals = append(vals, rest[i])
	}
	if err := s.outbox.rdb.RPush(context.WithoutCancel(ctx), s.outbox.key, vals...).Err(); err != nil {
		for range rest {
			if s.OnDrop != nil {
				s.OnDrop()
			}
		}
		s.logger.Error("history: outcomes lost: could not return them to the outbox", "count", len(rest), "err", err)
	}
}
