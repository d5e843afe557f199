package keypool

import "bulwark/pkg/llm"

// Redis key builders: every key name the pool uses comes from here, so a
// prefix isolates one pool (or one test) from every other.

// stateKey is the hash holding one provider key's limits and state:
// provider, tier, rpm, tpm, mif, win (µs), pace, itpm, otpm (configuration,
// written at registration), hr, ht (limits the provider reported below ours,
// 0: none), il, ol, hi, ho (input and output levels and reported limits,
// only on a key with that limit),
// f (429 back-off factor), rl, tl, ts (bucket levels and the Redis time in
// µs they were computed at), n (consecutive 429s), cu (cooling until, µs),
// cs (time of the last cooldown escalation, µs), off and off_at (disable
// reason and time). See doc.go, "Redis layout".
func stateKey(prefix, keyID string) string { return prefix + "key:" + keyID }

// leasesKey is the sorted set of one provider key's in-flight lease ids,
// scored by lease expiry (Redis time in µs).
func leasesKey(prefix, keyID string) string { return prefix + "leases:" + keyID }

// lineKey is the sorted set of a route's waiters (see doc.go, "The line"),
// scored by their place: priority, then acceptance time.
func lineKey(prefix string, r llm.Route) string { return prefix + "line:" + r.String() }

// lineExpiryKey scores the same waiters by when their registration lapses
// (Redis time in µs).
func lineExpiryKey(prefix string, r llm.Route) string { return prefix + "line-exp:" + r.String() }

// paceKey is the hash of a route's spacing (see doc.go, "The line"): lg,
// the moment (Redis µs) of its last grant made in line, from which the
// next one is spaced; sat, until when the route counts as saturated.
func paceKey(prefix string, r llm.Route) string { return prefix + "pace:" + r.String() }
