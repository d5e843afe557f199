package llm

import (
	"errors"
	"fmt"
	"time"
)

// Class is the closed classification of a provider failure. Every consumer
// (key pool, breaker, fallback, retries, metrics) branches on it, never on
// status codes or provider strings.
type Class string

const (
	// ClassRateLimited: the key is over its RPM/TPM (429 rate_limit_error,
	// rate_limit_exceeded). Cool the key, honour Retry-After, try another.
	ClassRateLimited Class = "rate_limited"
	// ClassQuota: billing or spend cap (insufficient_quota,
	// enforced_spend_limit_reached). Waiting does not help: disable the key
	// until an operator re-enables it, and alert.
	ClassQuota Class = "quota"
	// ClassOverloaded: the provider is overloaded for everyone (Anthropic
	// 529). Another key of the same provider would fare no better: fail over
	// to the other provider, do not cool the key.
	ClassOverloaded Class = "overloaded"
	// ClassTransient: 5xx, timeouts, connection errors. Another key, with
	// jittered backoff.
	ClassTransient Class = "transient"
	// ClassAuth: the key is wrong or revoked (401/403). Disable the key.
	ClassAuth Class = "auth"
	// ClassPermanent: the request itself is wrong (other 4xx). Fail at once;
	// the provider's message is for the operators' log, not the caller.
	ClassPermanent Class = "permanent"
	// ClassModelUnavailable: the provider does not serve the route's model
	// (not found, retired, not enabled for the account). The request is
	// fine and so is the key: the equivalent model of the other provider
	// answers instead.
	ClassModelUnavailable Class = "model_unavailable"
)

// Classes lists every class, for metrics and tests.
var Classes = []Class{ClassRateLimited, ClassQuota, ClassOverloaded, ClassTransient, ClassAuth, ClassPermanent, ClassModelUnavailable}

// CodeCapacityFull is the Error.Code of a rate_limited answer from
// provisioned capacity (an Azure PTU deployment) that is fully used right
// now: the key is busy for RetryAfter, not at fault, and the provider is
// not refusing (pkg/provider/azure sets it; pkg/dispatch acts on it).
const CodeCapacityFull = "provisioned_capacity_full"

// Error is a classified provider failure.
type Error struct {
	Class    Class
	Provider Provider
	// Status is the HTTP status, 0 when none was received.
	Status int
	// Code is the provider's error type/code, e.g. "rate_limit_error".
	Code string
	// Message is the provider's message with anything secret-looking removed.
	Message string
	// RetryAfter is the provider's Retry-After (clamped), 0 when absent.
	RetryAfter time.Duration
	// RateLimit is what the provider's headers said.
	RateLimit RateLimit
	// Err is the underlying transport error, if any.
	Err error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s", e.Provider, e.Class)
	if e.Status != 0 {
		s += fmt.Sprintf(" (HTTP %d", e.Status)
		if e.Code != "" {
			s += " " + e.Code
		}
		s += ")"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// ClassOf returns the class of err, and false when err is not a provider
// error (a bug or a context cancellation on our side).
func ClassOf(err error) (Class, bool) {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Class, true
	}
	return "", false
}
