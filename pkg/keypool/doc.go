// Package keypool is layer 3 of Bulwark's 429 defense: the pool of provider
// keys that every worker process, on every machine, shares through Redis.
// All state lives in Redis; a Pool value holds only its configuration and
// the credentials, so any number of processes may build one over the same
// keys and they behave as one pool.
//
// # Use
//
//	lease, err := pool.Acquire(ctx, route, promptTokens+req.MaxTokens)
//	// *ExhaustedError: wait RetryAfter or fall back; ErrTooLarge: give up.
//	defer pool.Release(ctx, lease) // no-op once settled
//	res, err := client.Complete(ctx, lease.APIKey, req)
//	if err != nil {
//		pool.Failure(ctx, lease, err)
//	} else {
//		pool.Success(ctx, lease, res.Response.Usage, res.RateLimit)
//	}
//
// # Bucket model
//
// Each key has two continuous token buckets, the way Anthropic, OpenAI and
// Bulwark's mock provider meter: a request bucket of capacity RPM refilling
// RPM/60 per second, and a token bucket of capacity TPM refilling TPM/60
// per second. A bucket is stored as a level and the Redis time (µs) it was
// computed at; its level now is min(capacity, level + elapsed·rate). Acquire
// takes 1 request and the estimated tokens (prompt plus max_tokens); Success
// gives back or charges the difference to the real usage, so a level can go
// negative (a debt that must refill before the next grant). All time is
// Redis TIME read inside the scripts, never a worker's clock.
//
// Provider headers correct the model: when a response says fewer requests
// or tokens remain than a bucket holds, the bucket is lowered to that
// count. It is never raised above our own model, which already counts
// calls the provider has not seen yet.
//
// # Headroom rule
//
// Acquire considers the route's keys that are enabled, not cooling, under
// MaxInFlight, and have at least 1 request and the estimated tokens in
// their buckets. Each one's headroom is the smallest fraction of any of its
// limits left after this reservation:
//
//	min((requests-1)/RPM, (tokens-est)/TPM, (MaxInFlight-inflight-1)/MaxInFlight)
//
// (the last term only with a MaxInFlight). The key with the largest headroom
// wins; ties go to the earlier key in the configuration, so equal idle keys
// alternate. This is the design's "lowest RPM utilisation" extended to the
// token and concurrency limits, so one nearly spent limit cannot hide
// behind a fresh one.
//
// When no key qualifies, Acquire returns an *ExhaustedError whose
// RetryAfter is, over the keys, the smallest of each key's longest wait:
// the time for its request or token bucket to refill enough, the end of
// its cooldown, or the expiry of its oldest lease when it is at
// MaxInFlight. Disabled keys never count. An estimate larger than every
// key's TPM fails with ErrTooLarge instead: no wait would admit it.
//
// # Cooldown rule
//
// A rate_limited failure raises the key's consecutive 429 count n and cools
// the key for min(CooldownBase·2^n, CooldownMax), by default the design's
// min(2^n, 120) seconds (2, 4, 8, … 64, 120), and never less than the
// provider's Retry-After. Only a lease granted after the key's last
// escalation escalates again: the calls already in flight when the first
// 429 came back report the same overload and only extend the cooldown to
// their Retry-After. Success resets n to 0 (a running cooldown ends on its
// own). quota and auth failures disable the key, with the reason, until
// Enable; overloaded, transient and permanent failures cool nothing and
// refund the tokens. A 429's reservation stays spent: the provider counted
// the call.
//
// # Leases
//
// Every grant adds a lease id to the key's lease set, scored by its expiry
// (Redis time + LeaseTTL). Success, Failure and Release remove it. Acquire
// drops the expired ones of every key with a MaxInFlight before counting
// them, and of the key it grants on, so a SIGKILLed worker's slots come
// back after LeaseTTL at most and no set grows without bound. (Sets of keys
// without a MaxInFlight decide nothing, so Acquire does not spend a command
// per key on them; Snapshot counts only unexpired leases.) An expired
// lease's reservation stays spent, since its call may have reached the
// provider.
//
// # Redis layout
//
// With prefix P (default "bulwark:keypool:"):
//
//	P key:<id>     hash: provider, tier, rpm, tpm, mif (limits, written by
//	               every New: the last process to start wins); rl, tl, ts
//	               (request level, token level, their time in µs); n
//	               (consecutive 429s); cu (cooling until, µs); cs (last
//	               escalation, µs); off, off_at (disable reason and time)
//	P leases:<id>  sorted set: lease id → expiry (µs); expires itself when idle
//
// The credential is never written: it stays in the Pool's memory and is
// looked up by key id. A key's state outlives restarts of the workers
// (their registration never refills a bucket); if Redis loses it, the next
// Acquire registers the configured keys again with full buckets, which the
// first response headers then correct.
//
// Acquire, the settlements, Disable/Enable and Snapshot are each one Lua
// script: one round trip, atomic across processes. The scripts name every
// key they touch in KEYS; on Redis Cluster a prefix with a hash tag (e.g.
// "bulwark:{keypool}:") keeps a pool in one slot.
package keypool
