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
	"bulwark/pkg/testenv"
)

type grant struct {
	key  string
	at   int64 // Redis µs
	cost float64
}

// TestLimitsHoldAcrossProcesses hammers one pool from several "processes"
// (separate Redis clients, separate Pool values), each with several
// goroutines that call Acquire, settle at once, and wait out RetryAfter when
// exhausted. From the grant timestamps (Redis TIME of each grant) it replays
// each key's bucket and checks that no grant was ever made without room,
// and that the grants used at least 90% of what the buckets refilled.
//
// The buckets are emptied first (through the header correction), so the
// run measures steady-state pacing rather than the initial burst of a full
// bucket, which would otherwise dwarf two seconds of refill.
func TestLimitsHoldAcrossProcesses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		rpm, tpm int
		est      func(i int) int // tokens to reserve on the i-th call
		tokens   bool            // replay the token bucket, else the request bucket
	}{
		// 6000 RPM: 100 requests per second per key.
		{name: "rpm", rpm: 6000, tpm: 1_000_000_000, est: func(int) int { return 0 }},
		// 600000 TPM: 10000 tokens per second per key; 50..149 tokens a call.
		{name: "tpm", rpm: 1_000_000, tpm: 600000, est: func(i int) int { return 50 + (i*37)%100 }, tokens: true},
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
			drain(t, pools[0], haiku, !tt.tokens, tt.tokens)

			// Start state of each bucket, read from Redis.
			type start struct{ level, ts float64 }
			starts := map[string]start{}
			for _, k := range cfg.Keys {
				field := "rl"
				if tt.tokens {
					field = "tl"
				}
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
				mu     sync.Mutex
				grants []grant
				wg     sync.WaitGroup
				errs   = make(chan error, procs*perProc)
			)
			for _, p := range pools {
				for range perProc {
					wg.Go(func() {
						var mine []grant
						defer func() {
							mu.Lock()
							grants = append(grants, mine...)
							mu.Unlock()
						}()
						for i := 0; ctx.Err() == nil; i++ {
							est := tt.est(i)
							l, err := p.Acquire(ctx, haiku, est)
							var ee *ExhaustedError
							switch {
							case err == nil:
								cost := 1.0
								if tt.tokens {
									cost = float64(est)
								}
								mine = append(mine, grant{l.KeyID, l.GrantedAt.UnixMicro(), cost})
								if err := p.Success(ctx, l, llm.Usage{InputTokens: est}, llm.RateLimit{}); err != nil {
									errs <- err
									return
								}
							case errors.As(err, &ee):
								timer := time.NewTimer(ee.RetryAfter)
								select {
								case <-timer.C:
								case <-ctx.Done():
									timer.Stop()
								}
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

			rate := float64(tt.rpm) / 60e6 // per µs
			capacity := float64(tt.rpm)
			if tt.tokens {
				rate, capacity = float64(tt.tpm)/60e6, float64(tt.tpm)
			}
			for _, k := range cfg.Keys {
				var mine []grant
				for _, g := range grants {
					if g.key == k.ID {
						mine = append(mine, g)
					}
				}
				slices.SortFunc(mine, func(a, b grant) int { return int(a.at - b.at) })
				st := starts[k.ID]
				level, ts := st.level, st.ts
				var used float64
				for i, g := range mine {
					require.GreaterOrEqual(t, float64(g.at), st.ts, "grant before the drain")
					level = min(capacity, level+(float64(g.at)-ts)*rate) - g.cost
					ts = float64(g.at)
					if level < -1e-6 {
						t.Fatalf("key %s: grant %d at %d overdrew the bucket to %.6f", k.ID, i, g.at, level)
					}
					used += g.cost
				}
				refilled := (float64(end.UnixMicro()) - st.ts) * rate
				ratio := used / refilled
				t.Logf("key %s: %d grants, %.0f of %.0f refilled (%.1f%%)", k.ID, len(mine), used, refilled, 100*ratio)
				require.GreaterOrEqual(t, ratio, 0.9, fmt.Sprintf("key %s paced below 90%% of its capacity", k.ID))
				require.LessOrEqual(t, ratio, 1.0+1e-9)
			}
		})
	}
}
