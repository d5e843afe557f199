package keypool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/testenv"
)

// call is one provider call a hammering worker made: on key, at Redis
// time at (µs; the lease's NotBefore), costing cost of the bucket checked.
type call struct {
	key  string
	at   int64
	cost float64
}

// TestLimitsHoldAcrossProcesses hammers one pool from several "processes"
// (separate Redis clients, separate Pool values), each with several
// goroutines that acquire a key, make their call at the lease's NotBefore
// (waiting for it when the lease was reserved ahead), settle at once, and
// wait out RetryAfter when exhausted. The pool runs with its defaults: a
// 1 s window spent at pace 0.98. Per key, from the call times (Redis time),
// it checks the claim the pool makes to the provider:
//
//   - over every span of calls [t_i, t_j], the calls cost at most a
//     window's capacity plus what the span refilled, i.e. a token bucket
//     of the paced limit would have admitted every one of them, whatever
//     its level before;
//   - replaying that bucket from the drained start, no call found it
//     short;
//   - and the calls used at least 90% of what the bucket refilled.
//
// The buckets are emptied first (through the header correction), so the
// run measures steady-state pacing rather than the initial burst.
func TestLimitsHoldAcrossProcesses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		rpm, tpm int
		est      func(i int) int // tokens to reserve on the i-th call
		tokens   bool            // check the token bucket, else the request bucket
		ahead    time.Duration   // Within, 0: only calls now
	}{
		// 6000 RPM: 100 requests per second per key, 98 paced.
		{name: "rpm", rpm: 6000, tpm: 1_000_000_000, est: func(int) int { return 0 }},
		// 600000 TPM: 10000 tokens per second per key; 50..149 tokens a call.
		{name: "tpm", rpm: 1_000_000, tpm: 600000, est: func(i int) int { return 50 + (i*37)%100 }, tokens: true},
		// Reservations ahead: callers queue for the key's next moments.
		{name: "rpm within", rpm: 6000, tpm: 1_000_000_000, est: func(int) int { return 0 }, ahead: 250 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const (
				procs    = 4
				perProc  = 4
				duration = 2 * time.Second
			)
			opts := testenv.RedisOptions(t)
			cfg := Config{Prefix: "test:hammer:", Keys: []Key{key("k1", haiku, tt.rpm, tt.tpm), key("k2", haiku, tt.rpm, tt.tpm)}}
			pools := make([]*Pool, procs)
			var admin *redis.Client
			for i := range pools {
				c := redis.NewClient(opts)
				t.Cleanup(func() { c.Close() })
				p, err := New(context.Background(), c, cfg, nil)
				require.NoError(t, err)
				pools[i], admin = p, c
			}

			// The paced bucket, computed here from the documented model
			// and checked against what the pool reports.
			limit, field := float64(tt.rpm), "rl"
			if tt.tokens {
				limit, field = float64(tt.tpm), "tl"
			}
			rate := limit * PaceDefault / 60e6                             // per µs
			capacity := limit * PaceDefault * WindowDefault.Seconds() / 60 // > 1: no floor
			s := snap(t, pools[0])[0]
			if tt.tokens {
				require.InDelta(t, capacity, s.TokensCapacity, 1e-6)
			} else {
				require.InDelta(t, capacity, s.RequestsCapacity, 1e-6)
			}

			drain(t, pools[0], haiku, !tt.tokens, tt.tokens)
			// Start state of each bucket, read from Redis.
			type start struct{ level, ts float64 }
			starts := map[string]start{}
			for _, k := range cfg.Keys {
				v, err := admin.HMGet(context.Background(), stateKey(cfg.Prefix, k.ID), field, "ts").Result()
				require.NoError(t, err)
				level, err1 := strconv.ParseFloat(v[0].(string), 64)
				ts, err2 := strconv.ParseFloat(v[1].(string), 64)
				require.NoError(t, errors.Join(err1, err2))
				require.InDelta(t, 0, level, 1e-9)
				starts[k.ID] = start{level, ts}
			}

			ctx, cancel := context.WithTimeout(context.Background(), duration)
			defer cancel()
			var (
				mu    sync.Mutex
				calls []call
				wg    sync.WaitGroup
				errs  = make(chan error, procs*perProc)
			)
			for _, p := range pools {
				for range perProc {
					wg.Go(func() {
						var mine []call
						defer func() {
							mu.Lock()
							calls = append(calls, mine...)
							mu.Unlock()
						}()
						for i := 0; ctx.Err() == nil; i++ {
							est := tt.est(i)
							l, err := p.Acquire(ctx, haiku, est, Within(tt.ahead))
							var ee *ExhaustedError
							switch {
							case err == nil:
								if !waitFor(ctx, l.Delay()) {
									// Never called: the reservation goes back.
									if err := p.Return(ctx, l); err != nil {
										errs <- err
									}
									return
								}
								cost := 1.0
								if tt.tokens {
									cost = float64(est)
								}
								mine = append(mine, call{l.KeyID, l.NotBefore.UnixMicro(), cost})
								if err := p.Success(ctx, l, llm.Usage{InputTokens: est}, llm.RateLimit{}); err != nil {
									errs <- err
									return
								}
							case errors.As(err, &ee):
								waitFor(ctx, ee.RetryAfter)
							case ctx.Err() != nil:
								return
							default:
								errs <- err
								return
							}
						}
					})
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("worker: %v", err)
			}
			end, err := admin.Time(context.Background()).Result()
			require.NoError(t, err)

			for _, k := range cfg.Keys {
				var mine []call
				for _, c := range calls {
					if c.key == k.ID {
						mine = append(mine, c)
					}
				}
				slices.SortFunc(mine, func(a, b call) int { return int(a.at - b.at) })
				st := starts[k.ID]

				// Every span of calls fits the bucket: prefix sums make the
				// cost of calls i..j sum[j+1]-sum[i].
				sum := make([]float64, len(mine)+1)
				for i, c := range mine {
					sum[i+1] = sum[i] + c.cost
				}
				for i := range mine {
					for j := i; j < len(mine); j++ {
						cost := sum[j+1] - sum[i]
						room := capacity + float64(mine[j].at-mine[i].at)*rate
						if cost > room+1e-6 {
							t.Fatalf("key %s: calls %d..%d in %d µs cost %.3f, more than the bucket allows (%.3f)",
								k.ID, i, j, mine[j].at-mine[i].at, cost, room)
						}
					}
				}

				// Replay from the drained start.
				level, ts := st.level, st.ts
				var used float64
				for i, c := range mine {
					require.GreaterOrEqual(t, float64(c.at), st.ts, "call before the drain")
					level = min(capacity, level+(float64(c.at)-ts)*rate) - c.cost
					ts = float64(c.at)
					if level < -1e-6 {
						t.Fatalf("key %s: call %d at %d overdrew the bucket to %.6f", k.ID, i, c.at, level)
					}
					if c.at <= end.UnixMicro() {
						used += c.cost
					}
				}
				refilled := (float64(end.UnixMicro()) - st.ts) * rate
				ratio := used / refilled
				t.Logf("key %s: %d calls, %.0f of %.0f refilled (%.1f%%)", k.ID, len(mine), used, refilled, 100*ratio)
				require.GreaterOrEqual(t, ratio, 0.9, fmt.Sprintf("key %s paced below 90%% of its capacity", k.ID))
				require.LessOrEqual(t, ratio, 1.0+1e-9)
			}
		})
	}
}

// waitFor waits d or until ctx ends, and reports whether d passed.
func waitFor(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
