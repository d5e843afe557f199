package keypool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"bulwark/pkg/llm"
)

// settle operations (settleLua ARGV[4]).
const (
	opOK   = "ok"   // success: reset the 429 count
	opCool = "cool" // 429: escalate the cooldown
	opWait = "wait" // capacity full: wait the Retry-After, escalate nothing
	opOff  = "off"  // quota/auth: disable the key
	opNone = "none" // no change to the 429 state
)

// Action is what a failed call does to its key. The caller decides it from
// the failure's class (pkg/dispatch keeps that table); the pool carries it
// out.
type Action int

const (
	// Refund: the key did nothing wrong (overload, a 5xx, a timeout, a bad
	// request, our own cancellation). The tokens are refunded; the request
	// stays counted, since the provider may have seen it.
	Refund Action = iota
	// Cool: a 429. The key cools for min(CooldownBase·2^n, CooldownMax),
	// never less than the provider's Retry-After; its request bucket is
	// emptied (the provider says it is empty) and its pace slowed 10% (at
	// most to half; each success gives back 1%). The reservation stays
	// spent. A 429 on a lease granted before the key's last escalation
	// does not escalate again: it is the same overload seen by a call
	// already in flight, and only extends the cooldown to its Retry-After.
	Cool
	// Disable: the key is unusable until an operator enables it (billing,
	// a revoked credential). The tokens are refunded.
	Disable
	// Full: the key's provisioned capacity is fully used at this moment
	// (an Azure PTU deployment's 429, llm.CodeCapacityFull). That 429 is
	// the deployment working as designed, not a limit the pool overran:
	// the key waits out exactly the provider's Retry-After (CooldownBase
	// when there is none); its 429 count and pace are left alone, and its
	// buckets too but for what rate-limit headers on the reply say (as on
	// any reply), so paid-for capacity is not parked for an escalating
	// cooldown. The tokens are refunded (the call was refused). It is not
	// counted in bulwark_key_cooldowns_total; the call's outcome is
	// capacity_full.
	Full
)

func (a Action) String() string {
	switch a {
	case Refund:
		return "refund"
	case Cool:
		return "cool"
	case Disable:
		return "disable"
	case Full:
		return "full"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

type settleArgs struct {
	tokensBack  int  // returned to the token bucket; negative charges more
	inputBack   int  // returned to the ITPM bucket, if the key has one
	outputBack  int  // returned to the OTPM bucket, if the key has one
	requestBack bool // the call was never made: return the request too
	rl          llm.RateLimit
	op          string
	retryAfter  time.Duration
	reason      string // for opOff
}

type settleResult struct {
	live         bool // the lease was still in the in-flight set
	consecutive  int64
	coolingUntil time.Time
	lowered      bool
	registered   bool
}

// Success settles a lease after a successful call the way the key's
// provider settles it (Key.Metering): with MeterUsage the token
// reservation is corrected to usage.Total() (refund or charge); with
// MeterAdmission only usage above the reservation is charged, and nothing
// is refunded, since the provider keeps counting the max_tokens it admitted.
// A zero usage means the provider did not report it and the estimate
// stands. A key's ITPM and OTPM buckets settle the same way, each to its
// side of the usage (Lease.EstInput to usage.InputTokens, Lease.EstOutput
// to usage.OutputTokens). The key's consecutive 429 count is reset, the in-flight slot is
// freed, and the provider's rate-limit headers correct the key (see
// headerArgs): they only ever lower a level, so a refund never leaves more
// tokens than the provider says are free.
//
// It returns ErrSettled if the lease was already settled.
func (p *Pool) Success(ctx context.Context, l *Lease, usage llm.Usage, rl llm.RateLimit) error {
	a := settleArgs{rl: rl, op: opOK}
	if usage.Total() > 0 && l != nil {
		k := p.keyOf(l)
		admission := k.Metering == MeterAdmission
		used := usage.InputTokens + usage.OutputTokens*max(k.OutputBurndown, 1)
		a.tokensBack = settleTo(l.EstTokens, used, admission)
		a.inputBack = settleTo(l.EstInput, usage.InputTokens, admission)
		a.outputBack = settleTo(l.EstOutput, usage.OutputTokens, admission)
	}
	_, err := p.settle(ctx, "success", l, true, a)
	return err
}

// settleTo is what goes back to a bucket charged est once the call used
// used: the difference (negative: a further charge), or on a key whose
// provider keeps its admission charge only the further charge.
func settleTo(est, used int, admission bool) int {
	back := est - used
	if back > 0 && admission {
		return 0
	}
	return back
}

// keyOf returns the configured key of l; for an unknown key (which settle
// then refuses) the zero Key: MeterAdmission, an output burndown of 1.
func (p *Pool) keyOf(l *Lease) Key {
	if i, ok := p.byID[l.KeyID]; ok {
		return p.cfg.Keys[i]
	}
	return Key{}
}

// Failure settles a lease after a failed call with action a (see Action).
// callErr supplies the provider's Retry-After, error code (for a disable
// reason) and rate-limit headers, which correct the key as in Success. The
// in-flight slot is always freed. It returns ErrSettled if the lease was
// already settled.
func (p *Pool) Failure(ctx context.Context, l *Lease, a Action, callErr error) error {
	args := settleArgs{op: opNone, tokensBack: l.EstTokens, inputBack: l.EstInput, outputBack: l.EstOutput}
	var pe *llm.Error
	if errors.As(callErr, &pe) {
		args.rl = pe.RateLimit
	}
	switch a {
	case Cool:
		args.op, args.tokensBack, args.inputBack, args.outputBack = opCool, 0, 0, 0
		if pe != nil {
			args.retryAfter = pe.RetryAfter
		}
	case Disable:
		args.op, args.reason = opOff, disableReason(pe)
	case Full:
		args.op = opWait
		if pe != nil {
			args.retryAfter = pe.RetryAfter
		}
	}
	res, err := p.settle(ctx, "failure", l, true, args)
	if err != nil {
		return err
	}
	l.consecutive = res.consecutive
	switch args.op {
	case opCool:
		p.logger.Warn("keypool: key rate limited, cooling",
			"key", l.KeyID, "route", l.Route.String(), "consecutive_429s", res.consecutive,
			"cooling_until", res.coolingUntil, "retry_after", args.retryAfter)
	case opWait:
		// Routine on a provisioned deployment at full use: not a warning.
		p.logger.Debug("keypool: key's provisioned capacity full, waiting",
			"key", l.KeyID, "route", l.Route.String(), "cooling_until", res.coolingUntil, "retry_after", args.retryAfter)
	case opOff:
		p.logger.Error("keypool: key disabled until an operator enables it",
			"key", l.KeyID, "route", l.Route.String(), "reason", args.reason)
	}
	return nil
}

// disableReason names why a key was disabled: the class and the provider's
// code, never its message (which may quote an account).
func disableReason(pe *llm.Error) string {
	if pe == nil {
		return "disabled after a failure"
	}
	r := string(pe.Class)
	if pe.Code != "" {
		r += " (" + pe.Code + ")"
	}
	return r
}

// Release ends a lease whose call was abandoned before any answer (the
// caller's context was cancelled mid-call): the in-flight slot is freed and
// the request stays counted. The tokens are refunded on a MeterUsage key
// (nothing was generated); on a MeterAdmission key they stay charged, since
// the provider may have admitted the call and does not refund. An ITPM
// bucket keeps its charge on every key: the provider counted the input
// when it admitted the call; an OTPM bucket is refunded on MeterUsage, as
// Anthropic adjusts its max_tokens estimate to the output produced. Release
// after Success, Failure or Return does nothing and returns nil. It runs
// even when ctx is already cancelled.
func (p *Pool) Release(ctx context.Context, l *Lease) error {
	if l == nil {
		return errors.New("keypool: release: nil lease")
	}
	if l.settled.Load() {
		return nil
	}
	a := settleArgs{tokensBack: l.EstTokens, outputBack: l.EstOutput, op: opNone}
	if p.keyOf(l).Metering == MeterAdmission {
		a.tokensBack, a.outputBack = 0, 0
	}
	_, err := p.settle(ctx, "release", l, false, a)
	return err
}

// Return ends a lease whose call was never made (the caller gave up while
// waiting for NotBefore): the request and the tokens go back to the key.
// Like Release, it is a no-op on a settled lease and runs under a cancelled
// ctx.
func (p *Pool) Return(ctx context.Context, l *Lease) error {
	if l == nil {
		return errors.New("keypool: return: nil lease")
	}
	if l.settled.Load() {
		return nil
	}
	_, err := p.settle(ctx, "return", l, false, settleArgs{tokensBack: l.EstTokens, inputBack: l.EstInput,
		outputBack: l.EstOutput, requestBack: true, op: opNone})
	return err
}

// settle runs settleLua for l. strict makes a second settlement an
// ErrSettled error rather than a no-op.
func (p *Pool) settle(ctx context.Context, op string, l *Lease, strict bool, a settleArgs) (settleResult, error) {
	if l == nil {
		return settleResult{}, fmt.Errorf("keypool: %s: nil lease", op)
	}
	ki, ok := p.byID[l.KeyID]
	if !ok {
		return settleResult{}, fmt.Errorf("keypool: %s key %q: %w", op, l.KeyID, ErrUnknownKey)
	}
	if !l.settled.CompareAndSwap(false, true) {
		if strict {
			return settleResult{}, fmt.Errorf("keypool: %s key %s: %w", op, l.KeyID, ErrSettled)
		}
		return settleResult{}, nil
	}
	// Settling must happen even when the call was cancelled: that is when
	// Release is called at all.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.OpTimeout)
	defer cancel()
	keys := []string{stateKey(p.cfg.Prefix, l.KeyID), leasesKey(p.cfg.Prefix, l.KeyID)}
	reqBack := 0
	if a.requestBack {
		reqBack = 1
	}
	args := []any{l.ID, a.tokensBack, reqBack, a.op, l.grantedUS,
		p.cfg.CooldownBase.Microseconds(), p.cfg.CooldownMax.Microseconds(), a.retryAfter.Microseconds(), a.reason}
	args = append(args, headerArgs(combinedRateLimit(p.cfg.Keys[ki], a.rl), time.Now())...)
	args = append(args, a.inputBack, a.outputBack)
	args = append(args, splitHeaderArgs(a.rl, time.Now())...)
	res, err := p.sc.settle.Run(ctx, p.rdb, keys, args...).Slice()
	if err != nil {
		return settleResult{}, fmt.Errorf("keypool: %s key %s: %w", op, l.KeyID, err)
	}
	var v [6]int64
	for i := range v {
		if v[i], err = replyInt(res, i); err != nil {
			return settleResult{}, fmt.Errorf("keypool: %s key %s: %w", op, l.KeyID, err)
		}
	}
	r := settleResult{live: v[0] == 1, consecutive: v[1], lowered: v[4] == 1, registered: v[5] == 1}
	if v[2] > v[3] {
		r.coolingUntil = timeFromUS(v[2])
	}
	if !r.registered {
		p.logger.Warn("keypool: settled a lease on a key whose state is missing in Redis", "key", l.KeyID)
	}
	if r.lowered {
		p.logger.Debug("keypool: bucket lowered to the provider's remaining count", "key", l.KeyID)
	}
	return r, nil
}

// headerArgs turns the provider's rate-limit headers into settleLua's
// ARGV[10..15]: for requests and tokens, the limit, the remaining count and
// the µs until the provider's bucket is full again, each -1 when the
// provider did not say. The script lowers the effective limit to a smaller
// reported limit, and the bucket to what remaining and reset allow (never
// raising either).
//
// llm.RateLimit uses 0 for "absent", so a remaining of 0 counts only when
// the matching limit header was present; negative values (sent by some
// compatible hosts) and resets in the past are ignored.
func headerArgs(rl llm.RateLimit, now time.Time) []any {
	if !rl.Known {
		return []any{-1, -1, -1, -1, -1, -1}
	}
	one := func(limit, rem int, reset time.Time) []any {
		l, r, d := int64(-1), int64(-1), int64(-1)
		if limit > 0 {
			l = int64(limit)
		}
		if rem > 0 || (rem == 0 && limit > 0) {
			r = int64(rem)
		}
		if limit > 0 && !reset.IsZero() && !reset.Before(now) {
			d = reset.Sub(now).Microseconds()
		}
		return []any{l, r, d}
	}
	return append(one(rl.RequestsLimit, rl.RequestsRemaining, rl.RequestsReset),
		one(rl.TokensLimit, rl.TokensRemaining, rl.TokensReset)...)
}

// combinedRateLimit is what of rl corrects k's one token bucket. On a key
// with both ITPM and OTPM the tokens-* headers are left out: Anthropic's
// tokens-* report the most restrictive of its input and output limits (or
// their sum), each of which k already meters in its own bucket from its
// own headers, and an output limit of 16,000 taken for the key's
// combined limit would pace its input tokens to it too.
func combinedRateLimit(k Key, rl llm.RateLimit) llm.RateLimit {
	if k.ITPM > 0 && k.OTPM > 0 && (splitKnown(rl.InputTokensLimit, rl.InputTokensRemaining, rl.InputTokensReset) ||
		splitKnown(rl.OutputTokensLimit, rl.OutputTokensRemaining, rl.OutputTokensReset)) {
		rl.TokensLimit, rl.TokensRemaining, rl.TokensReset = 0, 0, time.Time{}
	}
	return rl
}

func splitKnown(limit, rem int, reset time.Time) bool { return limit > 0 || rem > 0 || !reset.IsZero() }

// splitHeaderArgs is headerArgs for the input and output token headers
// (settleLua ARGV[18..23]).
func splitHeaderArgs(rl llm.RateLimit, now time.Time) []any {
	in := llm.RateLimit{Known: rl.Known, TokensLimit: rl.InputTokensLimit, TokensRemaining: rl.InputTokensRemaining,
		TokensReset: rl.InputTokensReset}
	out := llm.RateLimit{Known: rl.Known, TokensLimit: rl.OutputTokensLimit, TokensRemaining: rl.OutputTokensRemaining,
		TokensReset: rl.OutputTokensReset}
	return append(headerArgs(in, now)[3:], headerArgs(out, now)[3:]...)
}

// Disable takes a key out of the pool, in every process, until Enable.
// reason is shown in Snapshot (it must not contain a secret); empty means
// "disabled by operator". Leases already granted stay valid.
func (p *Pool) Disable(ctx context.Context, keyID, reason string) error {
	if reason == "" {
		reason = "disabled by operator"
	}
	if err := p.toggle(ctx, "disable", keyID, reason); err != nil {
		return err
	}
	p.logger.Warn("keypool: key disabled", "key", keyID, "reason", reason)
	return nil
}

// Enable puts a disabled key back into the pool. Its buckets, cooldown and
// 429 count are left as they are.
func (p *Pool) Enable(ctx context.Context, keyID string) error {
	if err := p.toggle(ctx, "enable", keyID, ""); err != nil {
		return err
	}
	p.logger.Info("keypool: key enabled", "key", keyID)
	return nil
}

func (p *Pool) toggle(ctx context.Context, op, keyID, reason string) error {
	if _, ok := p.byID[keyID]; !ok {
		return fmt.Errorf("keypool: %s key %q: %w", op, keyID, ErrUnknownKey)
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
	defer cancel()
	res, err := p.sc.toggle.Run(ctx, p.rdb, []string{stateKey(p.cfg.Prefix, keyID)}, reason).Result()
	if err != nil {
		return fmt.Errorf("keypool: %s key %s: %w", op, keyID, err)
	}
	if _, ok := res.(int64); !ok {
		return fmt.Errorf("keypool: %s key %s: unexpected reply %T", op, keyID, res)
	}
	return nil
}
