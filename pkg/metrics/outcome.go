package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"

	"bulwark/pkg/llm"
)

// Values of the outcome label of bulwark_provider_calls_total: a closed
// vocabulary, so that an unexpected error can never mint a new series.
const (
	OutcomeOK          = "ok"
	OutcomeRateLimited = "rate_limited"
	// OutcomeCapacityFull: a provisioned deployment's 429 (an Azure PTU
	// fully used, llm.CodeCapacityFull), by design, not a limit overrun:
	// kept out of rate_limited so the 429 alerts stay about overruns.
	OutcomeCapacityFull = "capacity_full"
	OutcomeQuota        = "quota"
	OutcomeOverloaded   = "overloaded"
	OutcomeServerError  = "server_error"
	OutcomeTimeout      = "timeout"
	OutcomeAuth         = "auth"
	OutcomeBadRequest   = "bad_request"
	// OutcomeModelUnavailable: the provider does not serve the model.
	OutcomeModelUnavailable = "model_unavailable"
)

// Outcomes lists every value Outcome returns.
var Outcomes = []string{
	OutcomeOK, OutcomeRateLimited, OutcomeCapacityFull, OutcomeQuota, OutcomeOverloaded,
	OutcomeServerError, OutcomeTimeout, OutcomeAuth, OutcomeBadRequest, OutcomeModelUnavailable,
}

// Outcome maps the error of a provider call to the outcome label.
//
// nil is "ok". An *llm.Error maps by class: rate_limited (capacity_full
// for a provisioned deployment's 429), quota, overloaded and auth keep
// their names; permanent is "bad_request"; transient is
// "timeout" when a deadline or a network timeout caused it (or the provider
// answered 408 or 504), else "server_error". An error that is not an
// *llm.Error (a deadline on our side, a bug) is "timeout" when it is a
// timeout and "server_error" otherwise, so the vocabulary stays closed;
// callers should not record calls that they cancelled themselves.
func Outcome(err error) string {
	if err == nil {
		return OutcomeOK
	}
	var pe *llm.Error
	if !errors.As(err, &pe) {
		if isTimeout(err) {
			return OutcomeTimeout
		}
		return OutcomeServerError
	}
	switch pe.Class {
	case llm.ClassRateLimited:
		if pe.Code == llm.CodeCapacityFull {
			return OutcomeCapacityFull
		}
		return OutcomeRateLimited
	case llm.ClassQuota:
		return OutcomeQuota
	case llm.ClassOverloaded:
		return OutcomeOverloaded
	case llm.ClassAuth:
		return OutcomeAuth
	case llm.ClassPermanent:
		return OutcomeBadRequest
	case llm.ClassModelUnavailable:
		return OutcomeModelUnavailable
	case llm.ClassTransient:
		if isTimeout(pe.Err) || pe.Status == http.StatusRequestTimeout || pe.Status == http.StatusGatewayTimeout {
			return OutcomeTimeout
		}
		return OutcomeServerError
	default:
		return OutcomeServerError
	}
}

// isTimeout reports whether err was caused by a deadline: a context
// deadline, a socket deadline, or a net.Error that says it timed out.
func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Price is what a model tier costs, in US dollars per million tokens.
type Price struct {
	InputPerMTok  float64
	OutputPerMTok float64
}

// Cost returns the price in US dollars of usage u at price p.
func Cost(p Price, u llm.Usage) float64 {
	return (float64(u.InputTokens)*p.InputPerMTok + float64(u.OutputTokens)*p.OutputPerMTok) / 1e6
}
