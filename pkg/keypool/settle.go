package keypool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"bulwark/pkg/llm"
)

// settle operations (settleLua ARGV[5]).
const (
	opOK   = "ok"   // success: reset the 429 count
	opCool = "cool" // 429: escalate the cooldown
	opOff  = "off"  // quota/auth: disable the key
	opNone = "none" // no change to the 429 state
)

type settleArgs struct {
	tokensBack     int // returned to the token bucket; negative charges more
	remReq, remTok int // provider's remaining counts, -1 when unknown
	op             string
	retryAfter     time.Duration
	reason         string // for opOff
}

type settleResult struct {
	live         bool // the lease was still in the in-flight set
	consecutive  int64
	coolingUntil time.Time
	lowered      bool
	registered   bool
}

// Success settles a lease after a successful call: the token reservation is
// corrected to usage.Total() (refund or charge; a zero usage means the
// provider did not report it and the estimate stands), the key's
// consecutive 429 count is reset, the in-flight slot is freed, and if rl
// says the provider has fewer requests or tokens left than our buckets hold,
// the buckets are lowered to match (never raised). A cooldown in progress is
// left to run out.
//
// It returns ErrSettled if the lease was already settled.
func (p *Pool) Success(ctx context.Context, l *Lease, usage llm.Usage, rl llm.RateLimit) error {
	back := 0
	if t := usage.Total(); t > 0 {
		back = l.EstTokens - t
	}
	remReq, remTok := remaining(rl)
	_, err := p.settle(ctx, "success", l, true, settleArgs{tokensBack: back, remReq: remReq, remTok: remTok, op: opOK})
	return err
}

// Failure settles a lease after a failed call, by the failure's llm.Class:
//
//   - rate_limited: the key cools for min(CooldownBase·2^n, CooldownMax),
//     never less than the provider's Retry-After, n being the consecutive
//     429s counting this one; the reservation stays spent (the provider
//     counted the call). A 429 on a lease granted before the key's last
//     escalation does not escalate again (it is the same overload seen by a
//     call already in flight) but still honours its Retry-After.
//   - quota, auth: the key is disabled with the class and provider code as
//     reason until Enable; the tokens are refunded.
//   - overloaded, transient, permanent, and any error that is not an
//     *llm.Error (a bug or a cancellation on our side): no cooldown, the
//     tokens are refunded. The request stays counted: the provider may have
//     seen it.
//
// Any rate-limit headers on the error lower the buckets as in Success. The
// in-flight slot is always freed. It returns ErrSettled if the lease was
// already settled.
func (p *Pool) Failure(ctx context.Context, l *Lease, callErr error) error {
	a := settleArgs{remReq: -1, remTok: -1, op: opNone, tokensBack: 0}
	var pe *llm.Error
	if errors.As(callErr, &pe) {
		a.remReq, a.remTok = remaining(pe.RateLimit)
	}
	class, _ := llm.ClassOf(callErr)
	switch class {
	case llm.ClassRateLimited:
		a.op = opCool
		a.retryAfter = pe.RetryAfter
	case llm.ClassQuota, llm.ClassAuth:
		a.op = opOff
		a.reason = string(class)
		if pe.Code != "" {
			a.reason += " (" + pe.Code + ")"
		}
		a.tokensBack = l.EstTokens
	default:
		a.tokensBack = l.EstTokens
	}
	res, err := p.settle(ctx, "failure", l, true, a)
	if err != nil {
		return err
	}
	switch a.op {
	case opCool:
		p.logger.Warn("keypool: key rate limited, cooling",
			"key", l.KeyID, "route", l.Route.String(), "consecutive_429s", res.consecutive,
			"cooling_until", res.coolingUntil, "retry_after", a.retryAfter)
	case opOff:
		p.logger.Error("keypool: key disabled until an operator enables it",
			"key", l.KeyID, "route", l.Route.String(), "reason", a.reason)
	}
	return nil
}

// Release ends a lease whose call was abandoned before any answer (the
// caller's context was cancelled, or the call was never made): the tokens
// are refunded and the in-flight slot freed; the request stays counted.
// Release after Success or Failure does nothing and returns nil. It runs
// even when ctx is already cancelled.
func (p *Pool) Release(ctx context.Context, l *Lease) error {
	if l == nil {
		return errors.New("keypool: release: nil lease")
	}
	if l.settled.Load() {
		return nil
	}
	_, err := p.settle(ctx, "release", l, false, settleArgs{tokensBack: l.EstTokens, remReq: -1, remTok: -1, op: opNone})
	return err
}

// settle runs settleLua for l. strict makes a second settlement an
// ErrSettled error rather than a no-op.
func (p *Pool) settle(ctx context.Context, op string, l *Lease, strict bool, a settleArgs) (settleResult, error) {
	if l == nil {
		return settleResult{}, fmt.Errorf("keypool: %s: nil lease", op)
	}
	if _, ok := p.byID[l.KeyID]; !ok {
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
	res, err := p.sc.settle.Run(ctx, p.rdb, keys,
		l.ID, a.tokensBack, a.remReq, a.remTok, a.op, l.grantedUS,
		p.cfg.CooldownBase.Microseconds(), p.cfg.CooldownMax.Microseconds(), a.retryAfter.Microseconds(),
		a.reason).Slice()
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

// remaining reads the provider's remaining counts from rl, -1 where it did
// not say. llm.RateLimit uses 0 for "absent", so a remaining of 0 counts
// only when the matching limit header was present; negative values (sent by
// some compatible hosts) are ignored.
func remaining(rl llm.RateLimit) (req, tok int) {
	req, tok = -1, -1
	if !rl.Known {
		return req, tok
	}
	if rl.RequestsRemaining > 0 || (rl.RequestsRemaining == 0 && rl.RequestsLimit > 0) {
		req = rl.RequestsRemaining
	}
	if rl.TokensRemaining > 0 || (rl.TokensRemaining == 0 && rl.TokensLimit > 0) {
		tok = rl.TokensRemaining
	}
	return req, tok
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
