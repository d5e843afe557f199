// Package keypool is layer 3 of Bulwark's 429 defense: the pool of provider
// keys that every worker process, on every machine, shares through Redis.
// All state lives in Redis; a Pool value holds only its configuration and
// the credentials, so any number of processes may build one over the same
// keys and they behave as one pool.
//
// # Use
//
//	est := llm.EstimateRequest(req) // prompt, max_tokens
//	lease, err := pool.Acquire(ctx, route, est.Total(), keypool.Split(est.Input, est.Output),
//		keypool.Within(2*time.Second))
//	// *ExhaustedError: wait RetryAfter or fall back; ErrTooLarge: give up.
//	// Wait lease.Delay() (or give the lease back with pool.Return).
//	defer pool.Release(ctx, lease) // no-op once settled
//	res, err := client.Complete(ctx, lease.Cred, req)
//	if err != nil {
//		pool.Failure(ctx, lease, action, err) // Refund, Cool or Disable
//	} else {
//		pool.Success(ctx, lease, res.Response.Usage, res.RateLimit)
//	}
//
// # Bucket model
//
// Each key has two continuous token buckets, the way Anthropic, OpenAI and
// Bulwark's mock provider meter: one for requests and one for tokens. They
// do not hold a minute of the per-minute limits: providers enforce them in
// short windows ("60,000 requests/minute may be enforced as 1,000
// requests/second"; "60 RPM may be enforced as 1 request per second"), so
// a pool that lets the 120 calls of a 120-RPM key go at once gets 429s for
// most of them. A bucket holds the burst window's share of its limit
// (Config.Window, default 1 s; Key.Window overrides it) and refills at the
// per-minute rate:
//
//	request bucket: capacity max(1, RPM'·Window/1m), refill RPM'/60 per second
//	token bucket:   capacity TPM'·Window/1m,         refill TPM'/60 per second
//
// A key with Anthropic's separate input and output limits (Key.ITPM,
// Key.OTPM) has an input and an output token bucket besides, built the
// same way from ITPM' and OTPM' (see "Token metering"); a key without them
// has just the two.
//
// RPM' and TPM' are the effective limits: the configured limit, lowered to
// a smaller limit the provider's headers reported, times Config.Pace
// (default 0.98) and times the key's back-off factor f (1 until a 429, see
// "Cooldown rule"). A bucket is stored as a level and the Redis time (µs)
// it was computed at; its level now is min(capacity, level + elapsed·rate).
// One Lua function reads it for every script, so acquire, settle and
// Snapshot cannot disagree about the model.
//
// Why the pace margin: a provider quantizes, and it meters by its own
// clock when our call arrives, not by ours when we granted it. Paced
// exactly at the limit, every call lands on the instant the provider's
// bucket refills to one request; the next call, held up 1 ms less between
// our grant and the provider than the previous one (scheduling, network),
// finds that 1-s bucket 0.002 of a request short (at 120 RPM) and gets a
// 429. Spending 98% of each limit leaves 2% of every interval (10 ms at
// 120 RPM) for that jitter, and builds a reserve at the provider over
// time. But a burst starts from full buckets on both sides, with no
// reserve yet: the third call of a 120-RPM key then had only 20 ms of
// slack against the first one (the storms saw the rare 429 from it). So a
// grant also leaves Config.Jitter (50 ms) of refill in the request bucket
// as headroom, at most what the bucket holds beyond one request: a call
// may then reach the provider up to 50 ms earlier, relative to an earlier
// call, than their grants were apart. Headroom delays a burst's second
// call, never the sustained rate. So with the defaults a 120-RPM key
// holds 1.96 requests: one call at once, the second 70 ms later, then one
// every 510 ms; with Pace 1 and NoJitter, two at once, then one every
// 500 ms. A bucket with no room for headroom (under two requests) spaces
// its grants Jitter more than one refill instead, at that cost in rate.
//
// Acquire takes 1 request and the estimated tokens (prompt plus
// max_tokens; on an input or output bucket, the prompt or max_tokens
// part, see Split). A request needs a level of 1, and est tokens or a full
// token bucket, whichever is less, in each token bucket: an estimate above a window's tokens
// (but within TPM) is admitted from a full bucket and leaves a debt, a
// negative level that later requests wait out, as the providers do (a
// 5,000-token call on a 1,000-token window: the next call waits 4 s).
// What happens to that charge after the call is the provider's business
// (see "Token metering"); a charge above the estimate may take a level
// negative there too.
//
// The provider's rate-limit headers correct the model after each call,
// answer or error. A reported limit below the configured one becomes the
// key's limit (capacity and refill follow); a report at or above the
// configured limit ends that correction, and a key is never paced above its
// configuration. A reported remaining count bounds the bucket (a remaining
// of 0 empties it), and so does a reset: the provider's per-minute bucket
// refills at limit per minute and is full after reset, so it holds
// limit − reset·limit/1m now (a reset over a minute fits no per-minute
// bucket and is ignored). These only ever lower a level, never raise it:
// our model already counts calls the provider has not seen yet.
//
// # Token metering
//
// Token limits are charged the provider's way, not ours; a pool that
// settles more generously than its provider believes in tokens the
// provider still counts, and its next calls get 429s. Each key has a
// Metering, which pkg/config derives from its provider's kind:
//
//   - OpenAI (MeterAdmission): the rate limit is calculated from
//     max_tokens and the estimated tokens of the request, so a call counts
//     prompt + max_tokens against TPM when it is admitted, and no refund of
//     the unused part is documented ("Reduce the max_tokens to match the
//     size of your completions", OpenAI rate limits guide,
//     https://platform.openai.com/docs/guides/rate-limits). Its
//     x-ratelimit-remaining-tokens says what is left.
//   - Azure OpenAI (MeterAdmission): "TPM rate limits are based on the
//     maximum number of tokens that are estimated to be processed by a
//     request at the time the request is received", from the prompt,
//     max_tokens and best_of; not the billed count (Azure OpenAI "Manage
//     quota", learn.microsoft.com azure/ai-services/openai/how-to/quota).
//   - Anthropic (MeterUsage): requests, input tokens (ITPM) and output
//     tokens (OTPM) are limited separately, each a continuously refilled
//     token bucket ("60 RPM may be enforced as 1 request per second").
//     Input tokens count when a request is admitted: input_tokens and
//     cache_creation_input_tokens, and on most models not
//     cache_read_input_tokens (cache-aware ITPM). Output tokens are
//     estimated from max_tokens at the beginning of each request and the
//     estimate is adjusted at its end to the output actually produced
//     (hence its advice to lower max_tokens when OTPM binds early). Each
//     limit has its headers,
//     anthropic-ratelimit-input-tokens-{limit,remaining,reset} and
//     -output-tokens-*, besides -tokens-*, the most restrictive token limit
//     in effect (Claude API docs, "Rate limits",
//     https://platform.claude.com/docs/en/api/rate-limits). A key with
//     Key.ITPM and Key.OTPM (config itpm_limit, otpm_limit) imitates this:
//     Acquire charges the prompt's estimate to the input bucket and
//     max_tokens to the output bucket (Split), Success settles each to
//     usage.InputTokens and usage.OutputTokens, and each bucket follows
//     its own headers down; tokens-* then lowers nothing (an output limit
//     of 16,000 read as the key's combined limit would pace its input to
//     it). The adapter's InputTokens include cache reads, so on a cached
//     prompt the input bucket settles higher than Anthropic counts: the
//     safe side. Without ITPM and OTPM the key's one token bucket (Key.TPM)
//     covers input and output together: set tpm_limit to what both allow
//     together; the headers' tighter token bucket lowers it.
//   - Bedrock (MeterUsage): one tokens-per-minute quota counts input and
//     output together; a call reserves input + max_tokens of it at its
//     start and is adjusted to its real usage at its end ("How tokens are
//     counted in Amazon Bedrock", AWS Bedrock user guide,
//     quotas-token-burndown). Bedrock has no separate input and output
//     limits and sends no rate-limit headers, so its keys have no ITPM or
//     OTPM (pkg/config refuses them) and nothing corrects them. For
//     Claude 4-series models each output token uses up 5 tokens of the
//     quota at that adjustment (the "token burndown rate"): such a key's
//     Key.OutputBurndown (output_burndown: 5) settles its output tokens
//     five times over.
//   - A local server (MeterUsage) meters nothing; its estimate settles to
//     usage.
//
// So Acquire charges prompt + max_tokens on every key, and Success
// settles it: a MeterUsage key to the real usage (refund or charge), a
// MeterAdmission key only upwards (usage above the estimate is charged,
// the unused max_tokens stays spent). Release (a call abandoned
// mid-flight) refunds on MeterUsage only: an OpenAI call may have been
// admitted; an input bucket keeps its charge even there, since Anthropic
// counted the input when it admitted the call, and the output bucket is
// refunded as Anthropic adjusts its max_tokens estimate. Return (never
// called) and the refunding failures give the tokens back on every key and
// bucket. Whatever a settlement leaves, the provider's
// headers then only ever lower it: the pool never holds more tokens than
// the provider's x-ratelimit-remaining-tokens (or Anthropic's tightest
// remaining, or its input and output remaining for those buckets) says
// are free.
//
// # Reservations
//
// With Within(d), Acquire may reserve a key whose buckets have room within
// d instead of now. The reservation is taken at once (the level goes
// negative) and the lease's NotBefore is the moment the bucket would have
// held it; the caller waits Delay() and calls then. Each reservation
// deepens the debt, so the next caller gets the next moment: callers are
// served first come, first served, at exactly the key's pace, with one
// round trip each and no polling (pollers retrying at RetryAfter are
// served by luck, and load Redis in proportion to their number). A caller
// that stops waiting gives its reservation back with Return. A cooling key
// or one at MaxInFlight is never reserved ahead: its end is not a refill
// the pool can promise.
//
// # The line
//
// Reservations alone serve whoever asks first. Under load that is not the
// order a fleet operator wants: a CRITICAL request that got its global
// slot would wait for a key behind every LOW request that asked before it,
// and a request polling at the wrong moment would be overtaken by younger
// ones. So an ask may carry a Waiter (InLine): its request id, priority
// and acceptance time. The route's line is a sorted set scored by place =
// priority·10^13 + acceptance time (ms): most urgent first, then oldest.
// Each ask registers (or refreshes) its waiter, then counts the grants the
// route's keys can make within the reservation horizon (for each key not
// cooling and under its in-flight cap: floor(requests level + horizon ·
// rate), fewer when any of its token buckets, input and output ones
// included, runs out first). The waiter is granted only
// when its rank in the line is within that count, and then leaves the
// line; so a waiter that asks early cannot take the turn of one ahead of
// it, and the grant order is the line's order up to the horizon. A refused
// waiter is told when its turn is likely: the first moment beyond the
// horizon, plus one refill of the route (the keys' summed rate) per
// waiter between it and that moment, or sooner when a cooling key frees.
// Grants made in line are also spaced: on a saturated route (more
// waiters in line than keys that may serve, or less than one request
// ready per key, now or in the last 2 s) they are spread one route
// interval apart (one minute over the summed request
// rate of the keys that may serve), from the route's last grant. Keys
// drained together (a storm's first burst) otherwise refill together and
// serve in bursts a whole key interval apart: four 120-RPM keys serve 4
// at once, then nothing for half a second, and a CRITICAL request that
// arrives in between waits for the next burst. The second sign of
// saturation catches a storm's start, whose asks each find the line
// short. CRITICAL waiters are not spaced: they take a request a key
// holds ready at once (most urgent first, so still in the line's order);
// held back for spacing, two CRITICAL requests arriving together waited
// two route intervals. A key that holds a request
// beyond this one (burst room), or would overflow within the interval, is
// not held back, so spacing never costs the keys' capacity; and a route
// the keys keep up with is not spaced at all, since there the interval
// would only lengthen how long a request holds its slot.
// A registration lapses Config.LineTTL after its last ask, so a dead
// worker's waiter holds the others back for at most that long; a waiter
// that stops asking calls Leave. Asks without a Waiter ignore the line.
//
// # Headroom rule
//
// Acquire considers the route's keys that are enabled, not cooling and
// under MaxInFlight, and whose buckets hold the request now or, with
// Within(d), within d. The key with room earliest wins, so a key free now
// always beats a reservation. Among keys free at the same time, the one
// with the largest headroom wins: the smallest fraction of any of its
// limits left after this reservation,
//
//	min((requests-1)/requestCapacity, (tokens-est)/max(tokenCapacity, est), (MaxInFlight-inflight-1)/MaxInFlight)
//
// (the last term only with a MaxInFlight; an input or output bucket adds
// its own term like the token bucket's, with its part of est); ties go to the earlier key in
// the configuration, so equal idle keys alternate. This is the design's
// "lowest RPM utilisation" extended to the token and concurrency limits,
// so one nearly spent limit cannot hide behind a fresh one.
//
// When no key qualifies, Acquire returns an *ExhaustedError whose
// RetryAfter is, over the keys, the smallest of each key's longest wait:
// the time for its buckets to hold the request (a full token bucket for an
// estimate above a window), the end of its cooldown, or the expiry of its
// oldest lease when it is at MaxInFlight. Disabled keys never count. An
// estimate larger than every key's configured TPM (or with an input or
// output part larger than its ITPM or OTPM) fails with ErrTooLarge
// instead: no wait would admit it.
//
// # Cooldown rule
//
// The caller decides what a failed call does to its key, from the
// failure's class (pkg/dispatch keeps that table), and passes an Action to
// Failure:
//
//   - Cool (a 429, rate_limited): the key's consecutive 429 count n rises
//     and the key cools for min(CooldownBase·2^n, CooldownMax), by default
//     the design's min(2^n, 120) seconds (2, 4, 8, … 64, 120), and never
//     less than the provider's Retry-After. Its request bucket is emptied
//     (a level above 0 drops to 0; a debt of reservations stays), since the
//     provider says it is empty. And its back-off factor f drops 10%, to
//     0.5 at most: a key that gets 429s although the pool paced it meters
//     tighter than configured. Each Success adds 0.01 back to f, up to 1
//     (additive increase, multiplicative decrease). The reservation stays
//     spent: the provider counted the call.
//   - Full (llm.CodeCapacityFull: a provisioned deployment, e.g. an Azure
//     PTU, fully used at this moment): the key waits exactly the
//     provider's Retry-After (CooldownBase without one) and nothing else
//     changes: no count, no slower pace, no emptied bucket (the reply's
//     rate-limit headers still correct the key, as on any reply). Such a 429 is
//     the deployment working as designed; escalating would park paid-for
//     capacity for up to CooldownMax. The tokens are refunded.
//   - Disable (quota, auth): the key is out, with the reason, until Enable;
//     the tokens are refunded.
//   - Refund (overloaded, transient, permanent, our own cancellation): the
//     tokens are refunded; the request stays counted, since the provider
//     may have seen it; nothing else changes.
//
// Only a lease granted after the key's last escalation escalates (n and
// f) again: the calls already in flight when the first 429 came back
// report the same overload and only extend the cooldown to their
// Retry-After. Success resets n to 0 (a running cooldown ends on its own).
//
// # Leases
//
// Every grant adds a lease id to the key's lease set, scored by its expiry
// (NotBefore + LeaseTTL). Success, Failure, Release and Return remove it.
// Acquire drops the expired ones of every key with a MaxInFlight before
// counting them, and of the key it grants on, so a SIGKILLed worker's
// slots come back after LeaseTTL at most and no set grows without bound.
// (Sets of keys without a MaxInFlight decide nothing, so Acquire does not
// spend a command per key on them; Snapshot counts only unexpired leases.)
// The set itself expires a second after its last lease. An expired lease's
// reservation stays spent, since its call may have reached the provider;
// only Return, for a call never made, gives the request back.
//
// # Redis layout
//
// With prefix P (default "bulwark:{keypool}:"; in a Redis Cluster the
// "{keypool}" hash tag keeps every key below in one slot, as acquire and
// the snapshot read several keys in one script):
//
//	P key:<id>     hash, one per provider key:
//	                 provider, tier, rpm, tpm, mif, win (µs), pace,
//	                 itpm, otpm (0: none)
//	                   configuration, written by every New (the last
//	                   process to start wins)
//	                 hr, ht   requests and tokens limits the provider
//	                          reported below ours (0: none)
//	                 f        back-off factor, 0.5..1
//	                 rl, tl, ts  request level, token level, their Redis
//	                          time (µs)
//	                 il, ol, hi, ho  input and output levels (same time)
//	                          and limits the provider reported below
//	                          itpm, otpm; only with that limit
//	                 n        consecutive 429s
//	                 cu, cs   cooling until, last escalation (µs)
//	                 off, off_at  disable reason and time
//	P leases:<id>  sorted set: lease id → expiry (µs); expires itself when idle
//	P line:<route>     sorted set: waiter id → place (priority, acceptance ms)
//	P line-exp:<route> sorted set: waiter id → registration expiry (µs);
//	                   both expire a second after the last ask
//	P pace:<route>     hash: lg, the moment (µs) of the route's last grant
//	                   in line; sat, until when its line counts as
//	                   saturated (2 s after it last was); expires after a
//	                   minute
//
// The credential is never written: it stays in the Pool's memory and is
// looked up by key id. A key's state outlives restarts of the workers
// (their registration never refills a bucket, only clamps it to a smaller
// capacity); if Redis loses it, the next Acquire registers the configured
// keys again with full buckets, which the first response headers then
// correct.
//
// Acquire, the settlements, Disable/Enable and Snapshot are each one Lua
// script: one round trip, atomic across processes. The scripts name every
// key they touch in KEYS; on Redis Cluster a prefix with a hash tag (e.g.
// "bulwark:{keypool}:") keeps a pool in one slot.
package keypool
