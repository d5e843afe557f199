package keypool

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"bulwark/pkg/llm"
)

// KeyState is the admin view of one key. It carries no credential.
type KeyState struct {
	ID          string       `json:"id"`
	Provider    llm.Provider `json:"provider"`
	Tier        string       `json:"model_tier"`
	RPM         int          `json:"rpm_limit"`
	TPM         int          `json:"tpm_limit"`
	MaxInFlight int          `json:"max_in_flight,omitempty"`
	// ITPM and OTPM are the key's input and output tokens-per-minute
	// limits (Anthropic); 0 when it has none.
	ITPM int `json:"itpm_limit,omitempty"`
	OTPM int `json:"otpm_limit,omitempty"`
	// RequestsAvailable and TokensAvailable are the bucket levels now (a
	// negative value is a debt still to refill, e.g. calls reserved ahead).
	RequestsAvailable float64 `json:"requests_available"`
	TokensAvailable   float64 `json:"tokens_available"`
	// RequestsCapacity and TokensCapacity are what the buckets hold when
	// full: the burst window's share of the effective limits.
	RequestsCapacity float64 `json:"requests_capacity"`
	TokensCapacity   float64 `json:"tokens_capacity"`
	// InputTokensAvailable, OutputTokensAvailable and their capacities are
	// the ITPM and OTPM buckets, like the token bucket's; 0 for a key
	// without that limit.
	InputTokensAvailable  float64 `json:"input_tokens_available,omitempty"`
	OutputTokensAvailable float64 `json:"output_tokens_available,omitempty"`
	InputTokensCapacity   float64 `json:"input_tokens_capacity,omitempty"`
	OutputTokensCapacity  float64 `json:"output_tokens_capacity,omitempty"`
	// EffectiveRPM and EffectiveTPM are the rates the pool paces the key
	// to: the configured limits, lowered to what the provider's headers
	// reported, times the pace and the 429 back-off factor.
	EffectiveRPM float64 `json:"effective_rpm"`
	EffectiveTPM float64 `json:"effective_tpm"`
	// RPMUtilisation and TPMUtilisation are 1 - level/capacity, clamped to
	// [0, 1]: 0 is an idle key, 1 an empty bucket.
	RPMUtilisation float64 `json:"rpm_utilisation"`
	TPMUtilisation float64 `json:"tpm_utilisation"`
	// InFlight counts live (unexpired) leases.
	InFlight int `json:"in_flight"`
	// CoolingUntil is the end of the current cooldown, zero when not cooling.
	CoolingUntil    time.Time `json:"cooling_until,omitzero"`
	Consecutive429s int       `json:"consecutive_429s"`
	Disabled        bool      `json:"disabled"`
	DisabledReason  string    `json:"disabled_reason,omitempty"`
	// Registered is false when Redis holds no state for the key (it was
	// flushed); the next Acquire registers it again.
	Registered bool `json:"registered"`
}

// Available reports whether the key can be chosen at all now: enabled and
// not cooling (its buckets may still be short).
func (s KeyState) Available(now time.Time) bool {
	return s.Registered && !s.Disabled && !s.CoolingUntil.After(now)
}

// Snapshot returns every configured key's state at one Redis instant, in
// configuration order. The limits shown are those stored in Redis (the last
// registration wins).
func (p *Pool) Snapshot(ctx context.Context) ([]KeyState, error) {
	_, states, err := p.snapshot(ctx)
	return states, err
}

// Available returns, for every configured route, how many keys are enabled
// and not cooling: the figure behind the "available keys < 2" alert.
func (p *Pool) Available(ctx context.Context) (map[llm.Route]int, error) {
	now, states, err := p.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[llm.Route]int, len(p.routes))
	for r := range p.routes {
		out[r] = 0
	}
	for _, s := range states {
		if s.Available(now) {
			out[llm.Route{Provider: s.Provider, Tier: s.Tier}]++
		}
	}
	return out, nil
}

func (p *Pool) snapshot(ctx context.Context) (time.Time, []KeyState, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.OpTimeout)
	defer cancel()
	res, err := p.sc.snapshot.Run(ctx, p.rdb, p.allKeys).Slice()
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("keypool: snapshot: %w", err)
	}
	nowUS, err := replyInt(res, 0)
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("keypool: snapshot: %w", err)
	}
	if len(res) != 1+len(p.cfg.Keys) {
		return time.Time{}, nil, fmt.Errorf("keypool: snapshot: reply has %d elements, want %d", len(res), 1+len(p.cfg.Keys))
	}
	now := timeFromUS(nowUS)
	out := make([]KeyState, len(p.cfg.Keys))
	for i, k := range p.cfg.Keys {
		s, err := parseKeyState(k, res[i+1], nowUS)
		if err != nil {
			return time.Time{}, nil, fmt.Errorf("keypool: snapshot key %s: %w", k.ID, err)
		}
		out[i] = s
	}
	return now, out, nil
}

// parseKeyState reads one snapshotLua row (see its reply).
func parseKeyState(k Key, row any, nowUS int64) (KeyState, error) {
	v, ok := row.([]any)
	if !ok {
		return KeyState{}, fmt.Errorf("unexpected row %T", row)
	}
	s := KeyState{ID: k.ID, Provider: k.Provider, Tier: k.Tier}
	if len(v) == 0 {
		// Not registered: report the configured limits, nothing else known.
		s.RPM, s.TPM, s.ITPM, s.OTPM, s.MaxInFlight = k.RPM, k.TPM, k.ITPM, k.OTPM, k.MaxInFlight
		return s, nil
	}
	const fields = 19
	if len(v) != fields {
		return KeyState{}, fmt.Errorf("row has %d fields, want %d", len(v), fields)
	}
	var f [fields]float64
	for j := range fields {
		str, ok := v[j].(string)
		if !ok {
			return KeyState{}, fmt.Errorf("field %d is %T, want string", j, v[j])
		}
		if j == 11 { // off: the disable reason, empty when enabled
			s.Disabled, s.DisabledReason = str != "", str
			continue
		}
		x, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return KeyState{}, fmt.Errorf("field %d: %w", j, err)
		}
		f[j] = x
	}
	s.Registered = true
	s.RPM, s.TPM, s.MaxInFlight = int(f[0]), int(f[1]), int(f[2])
	s.RequestsAvailable, s.TokensAvailable = f[3], f[4]
	s.RequestsCapacity, s.TokensCapacity = f[5], f[6]
	s.EffectiveRPM, s.EffectiveTPM = f[7], f[8]
	s.RPMUtilisation = utilisation(f[3], f[5])
	s.TPMUtilisation = utilisation(f[4], f[6])
	s.Consecutive429s = int(f[9])
	if cu := int64(f[10]); cu > nowUS {
		s.CoolingUntil = timeFromUS(cu)
	}
	s.InFlight = int(f[12])
	s.ITPM, s.OTPM = int(f[13]), int(f[14])
	s.InputTokensAvailable, s.OutputTokensAvailable = f[15], f[16]
	s.InputTokensCapacity, s.OutputTokensCapacity = f[17], f[18]
	return s, nil
}

func utilisation(level, capacity float64) float64 {
	if capacity <= 0 {
		return 0
	}
	return min(max(1-level/capacity, 0), 1)
}
