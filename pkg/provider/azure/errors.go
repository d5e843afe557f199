package azure

import (
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/secret"
)

// CodeCapacityFull is the llm.Error.Code of a 429 from a provisioned
// throughput (PTU) deployment: its provisioned capacity is fully used right
// now. The class stays llm.ClassRateLimited, so a consumer that does not
// know the code still does something sound (cool the key, try another);
// one that knows it should instead treat the key as busy for exactly
// RetryAfter (retry-after-ms: "the time until utilization is below 100%",
// usually well under a second to a few seconds) without escalating its
// cooldown, slowing its pace or counting it toward the breaker, and send
// the request to another key at once: Microsoft's advice is to redirect
// such traffic to another deployment (a standard one: spillover) or to
// retry after retry-after-ms. The provider's own code of such a 429 is the
// bare status ("429"), so nothing is lost by replacing it.
const CodeCapacityFull = llm.CodeCapacityFull

// UtilizationHeader is the header in which a provisioned deployment reports
// its utilization ("102.4%"). Microsoft's benchmarking tool for
// provisioned deployments (github.com/Azure/azure-openai-benchmark) reads
// it; standard deployments do not send it, so a 429 carrying it is read as
// CodeCapacityFull even for a key Config.PTUKeys does not name.
const UtilizationHeader = "azure-openai-deployment-utilization"

// IsCapacityFull reports whether err is a PTU deployment's "provisioned
// capacity full" 429 (see CodeCapacityFull).
func IsCapacityFull(err error) bool {
	var pe *llm.Error
	return errors.As(err, &pe) && pe.Class == llm.ClassRateLimited && pe.Code == CodeCapacityFull
}

// retryAfterText finds the wait an Azure 429 message states: "Please retry
// after 2 seconds.", "Please retry after 1 second.", or in milliseconds.
var retryAfterText = regexp.MustCompile(`(?i)\bretry after (\d+(?:\.\d+)?) ?(milliseconds?|ms|seconds?|s)\b`)

// ErrorOf turns a non-2xx reply of an Azure OpenAI deployment into a
// classified *llm.Error of provider p, with every trace of key (the api-key
// or the bearer token sent) and anything else key-shaped removed, read at
// time now. ptu says that the key's deployment is provisioned throughput.
//
// The body is read by openai.ErrorOf (Azure answers in OpenAI's error
// shape, {"error":{"code","message",...}}, with Azure's own codes), whose
// table classifies it; then Azure's specifics:
//
//   - DeploymentNotFound (404, "The API deployment for this resource does
//     not exist") and OperationNotSupported (the deployment's model does not
//     do chat completions): model_unavailable. The request and the key are
//     fine; the route's model is not served there.
//   - content_filter (400, "The response was filtered due to the prompt
//     triggering Azure OpenAI's content management policy"): permanent.
//   - 401 and 403 (Azure's {"error":{"code":"401","message":"Access denied
//     due to invalid subscription key or wrong API endpoint..."}}, a missing
//     RBAC role, a resource firewall): auth, by the status.
//   - 500 and 503: transient, or overloaded when the message says the model
//     is overloaded (openai's table).
//   - 429: rate_limited. Retry-After is retry-after-ms, else retry-after
//     (provider.ParseRetryAfter), else the wait the message states ("Please
//     retry after 45 seconds."), else x-rate-limit-reset-tokens (seconds),
//     which Azure has sent on token-limit 429s instead of retry-after
//     (github.com/openai/openai-python/issues/937); clamped to
//     provider.MaxRetryAfter. On a PTU deployment (ptu, or the reply
//     carries UtilizationHeader) the Code becomes CodeCapacityFull.
func ErrorOf(p llm.Provider, r *provider.Reply, key secret.String, ptu bool, now time.Time) *llm.Error {
	e := openai.ErrorOf(r, key, now)
	e.Provider = p
	e.RateLimit = ParseRateLimit(r.Header, now)
	msg := strings.ToLower(e.Message)
	switch {
	case e.Code == "DeploymentNotFound" || e.Code == "OperationNotSupported" ||
		(r.Status == http.StatusNotFound && strings.Contains(msg, "deployment") && strings.Contains(msg, "does not exist")):
		e.Class = llm.ClassModelUnavailable
	case e.Code == "content_filter":
		e.Class = llm.ClassPermanent
	}
	if r.Status == http.StatusTooManyRequests && e.Class == llm.ClassRateLimited {
		if e.RetryAfter == 0 {
			e.RetryAfter = retryAfterFallback(e.Message, r.Header)
		}
		if ptu || r.Header.Get(UtilizationHeader) != "" {
			e.Code = CodeCapacityFull
		}
	}
	return e
}

// retryAfterFallback is the wait of a 429 without retry-after-ms and
// retry-after: the one its message states, else x-rate-limit-reset-tokens.
func retryAfterFallback(message string, h http.Header) time.Duration {
	if m := retryAfterText.FindStringSubmatch(message); m != nil {
		n, err := strconv.ParseFloat(m[1], 64)
		if err == nil {
			unit := time.Second
			if strings.HasPrefix(strings.ToLower(m[2]), "m") {
				unit = time.Millisecond
			}
			return clamp(n * float64(unit))
		}
	}
	if n, ok := provider.HeaderInt(h, "x-rate-limit-reset-tokens"); ok {
		return clamp(float64(n) * float64(time.Second))
	}
	return 0
}

// clamp converts ns nanoseconds to a duration in [0, provider.MaxRetryAfter].
func clamp(ns float64) time.Duration {
	if ns <= 0 {
		return 0
	}
	if ns >= float64(provider.MaxRetryAfter) {
		return provider.MaxRetryAfter
	}
	return time.Duration(ns)
}

// ParseRateLimit reads Azure OpenAI's rate-limit headers at time now:
// x-ratelimit-remaining-requests and x-ratelimit-remaining-tokens, which
// every answer of a standard deployment carries, and, when present, the
// x-ratelimit-limit-* and x-ratelimit-reset-* headers newer deployments add
// (resets in seconds or as durations), all as openai.ParseRateLimit reads
// them; x-rate-limit-reset-tokens (seconds) stands in for a missing
// x-ratelimit-reset-tokens. A provisioned deployment reports its
// utilization (UtilizationHeader) instead, which has no llm.RateLimit
// field: Known is then false.
func ParseRateLimit(h http.Header, now time.Time) llm.RateLimit {
	rl := openai.ParseRateLimit(h, now)
	if rl.TokensReset.IsZero() {
		if t, ok := provider.HeaderResetIn(h, "x-rate-limit-reset-tokens", now); ok {
			rl.TokensReset, rl.Known = t, true
		}
	}
	return rl
}

// failure is the error of a non-2xx reply to a call with cred. With Entra
// auth a 401 also drops the token source's cached token (see TokenSource);
// a 401 that says the token expired is then transient, since the next call
// carries a fresh token, rather than a fault of the key.
func (c *Client) failure(r *provider.Reply, sent secret.String, cred llm.Credential, now time.Time) error {
	e := ErrorOf(c.cfg.Name, r, sent, cred.KeyID != "" && c.cfg.PTUKeys[cred.KeyID], now)
	if c.cfg.Auth == AuthEntra && r.Status == http.StatusUnauthorized {
		if inv, ok := c.cfg.Token.(interface{ Invalidate() }); ok {
			inv.Invalidate()
		}
		if strings.Contains(strings.ToLower(e.Message), "expired") {
			e.Class = llm.ClassTransient
		}
	}
	return e
}
