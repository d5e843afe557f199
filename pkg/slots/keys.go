package slots

import "bulwark/pkg/priority"

// Redis key builders: every key name the limiter uses comes from here, so a
// prefix isolates one limiter (or one test) from every other.

// leasesKey is the sorted set of live lease ids, scored by expiry (Unix ms,
// Redis time).
func leasesKey(prefix string) string { return prefix + "leases" }

// ownersKey is the hash from lease id to the priority (1–4) holding it.
func ownersKey(prefix string) string { return prefix + "owners" }

// acquiredKey is the sorted set of live lease ids scored by when they were
// granted (Unix ms, Redis time): the ages of the slots in use, from which
// the queue estimates when the next ones free up.
func acquiredKey(prefix string) string { return prefix + "acquired" }

// promotedKey is the hash from a waiter id to the more urgent priority it
// was promoted to (Promote): a request others now wait on too.
func promotedKey(prefix string) string { return prefix + "promoted" }

// promotedExpiryKey is the sorted set of promoted waiter ids scored by when
// the promotion lapses (Unix ms, Redis time).
func promotedExpiryKey(prefix string) string { return prefix + "promoted-exp" }

// waitKey is the sorted set of p's registered waiters, scored by Since
// (Unix ms); equal scores sort by id, which gives the FIFO order.
func waitKey(prefix string, p priority.Priority) string { return prefix + "wait:" + p.String() }

// waitExpiryKey is the sorted set of p's registered waiters, scored by the
// registration's expiry (Unix ms, Redis time).
func waitExpiryKey(prefix string, p priority.Priority) string {
	return prefix + "wait-exp:" + p.String()
}

// waitKeys returns the waiter sets of priorities 1..4, then their expiry
// sets: the layout the acquire and waiting scripts index by priority.
func waitKeys(prefix string) []string {
	keys := make([]string, 0, 2*len(priority.All))
	for _, p := range priority.All {
		keys = append(keys, waitKey(prefix, p))
	}
	for _, p := range priority.All {
		keys = append(keys, waitExpiryKey(prefix, p))
	}
	return keys
}
