// Package slots is Bulwark's global limit on provider calls in flight
// across every worker process: Total slots, held as leases in Redis, with a
// reserve per priority (priority.Critical … priority.Low) that never wastes
// capacity.
//
// # Use
//
//	slot, err := limiter.Acquire(ctx, p, slots.Waiter{ID: req.ID, Since: req.CreatedAt})
//	if err != nil { ... } // wraps ctx.Err() when ctx ended first
//	defer slot.Release(context.WithoutCancel(ctx))
//	// while the call runs, every LeaseTTL/3:
//	if err := slot.Renew(ctx); errors.Is(err, slots.ErrLost) { ... }
//
// # The rule
//
// A fixed split of the slots by priority leaves most of them idle when only
// one priority has work. The rule here is work-conserving: every priority
// can always get its own reserve, critical's reserve is never lent, and
// every other idle slot goes to whoever waits, most urgent first. Calls are
// never preempted: a borrowed slot comes back when its call ends.
//
// Let used[q] be the live leases of priority q, waiting[q] its live
// waiters, R[q] its reserve, T the total and free = T − Σ used.
//
//   - Critical's unused reserve H1 = max(0, R1 − used1) is never lent:
//     the other priorities see available = free − max(H1, waiting1).
//   - A critical waiter of rank r (1-based, see FIFO below) is granted iff
//     r ≤ free.
//   - For high, normal and low, the owner part o_q = min(waiting_q,
//     max(0, R_q − used_q)) is the waiters entitled to q's own reserve.
//     Claims are served in this order: the owner parts of high, normal,
//     low, then the borrowing remainders (waiting_q − o_q) of high, normal,
//     low. A waiter is granted iff its position in that order ≤ available.
//
// Worked numbers with the defaults of the design (T 20; reserves critical
// 5, high 10, normal 4, low 1):
//
//   - CRITICAL alone may use all 20; any other priority alone 20 − 5 = 15.
//   - HIGH holds 15, more HIGH waits, and one LOW request arrives: LOW
//     waits (available 0). When a HIGH call ends, available is 1 and LOW's
//     owner part (its 1 reserved slot) comes first in the claim order, so
//     LOW gets the slot before every HIGH waiter.
//   - Under any flood of HIGH, NORMAL or LOW, 5 slots stay free: a CRITICAL
//     request gets one at once. CRITICAL holding 2 leaves others 20 − 2 − 3
//     = 15; CRITICAL holding 8 leaves them 12 (its reserve is in use).
//   - HIGH, NORMAL and LOW all flooding settle at 10 / 4 / 1 (each its own
//     reserve); HIGH and NORMAL alone at 11 / 4 (borrowing goes to HIGH).
//
// Reserves may not sum to more than Total (Config validation).
//
// # FIFO by Since
//
// The rule says how many waiters of each priority may go; among waiters of
// one priority the order is (Waiter.Since, Waiter.ID): oldest request
// first, ties broken by ID so that every process agrees. Without an order,
// whoever polls first after a slot frees would win, and Acquire's backoff
// makes a newcomer (polling every 5 ms) beat a long waiter (every 50 ms),
// so under load the oldest request, the one nearest its deadline, could
// starve. Since is the request's creation time, not its arrival here, so a
// request re-enqueued after a worker died keeps its place. Since is only
// compared with other Sinces, never with Redis time, so clock skew between
// API servers shifts the order by the skew and cannot block anyone.
//
// A waiter is registered in the same script that decides, before the
// decision (its rank counts itself). A refused waiter's registration lives
// WaiterTTL (default 1 s) past its last attempt; Acquire renews it on every
// poll (at most every 50 ms), so a waiter whose worker died stops holding
// its place within WaiterTTL. A granted waiter's registration is removed.
//
// # Leases
//
// A slot is a lease that expires LeaseTTL (default 30 s) after it was
// granted or last renewed, so the slots of a SIGKILLed worker come back
// within LeaseTTL without anyone's help. A call may run longer than
// LeaseTTL: its holder renews the lease (Slot.Renew) every LeaseTTL/3 while
// the call runs. Renew on an expired or released lease returns ErrLost.
//
// # Consistency and time
//
// Every decision is one Lua script (drop expired leases and registrations,
// register the asker, count, apply the rule, grant), so it is atomic across
// all processes. Expiries are Redis TIME in Unix milliseconds, so workers
// with skewed clocks agree on when a lease or registration dies.
//
// # Redis keys
//
// With the default prefix "bulwark:{slots}:" (Config.Prefix; key builders
// in keys.go):
//
//	bulwark:{slots}:leases           zset  lease id → expiry (Unix ms)
//	bulwark:{slots}:owners           hash  lease id → priority (1–4)
//	bulwark:{slots}:wait:<name>      zset  waiter id → Since (Unix ms), per
//	                                       priority (wait:critical … wait:low)
//	bulwark:{slots}:wait-exp:<name>  zset  waiter id → registration expiry
//	                                       (Unix ms), per priority
//
// The scripts touch all these keys at once: they must live on one Redis
// server or, in a Redis Cluster, in one hash slot — the "{slots}" hash tag
// of the prefix does that (pkg/config/keys.go).
package slots
