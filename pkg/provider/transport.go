package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/secret"
)

// MaxResponseBytes is the largest response body Post reads unless
// Call.MaxResponseBytes says otherwise (32 MiB, the size Anthropic allows
// for a request; no chat answer comes near it). A longer body is an error,
// not a silent truncation.
const MaxResponseBytes = 32 << 20

// errCallTimeout is the cancel cause of Post's own per-call deadline, which
// tells it apart from the caller's context ending.
var errCallTimeout = errors.New("per-call timeout")

// Call is one POST to a provider.
type Call struct {
	// Provider names the provider in the *llm.Error of a transport failure.
	Provider llm.Provider
	// URL is the full endpoint URL.
	URL string
	// Header is sent as is; Post adds Content-Type and Accept when missing.
	Header http.Header
	// Body is the JSON request body.
	Body []byte
	// Timeout bounds the whole exchange, reading the body included. Zero
	// means no deadline beyond the caller's context.
	Timeout time.Duration
	// MaxResponseBytes is the largest response body read; a longer one is
	// a transient *llm.Error. Zero (or less) means MaxResponseBytes, which
	// suits chat answers; a batch of embeddings may need more.
	MaxResponseBytes int
	// Sign, when set, is called with the built request just before it is
	// sent, once every header is on it (Header, and the Content-Type and
	// Accept Post adds), so that a request signature such as AWS SigV4
	// covers them; it may add headers (Authorization, X-Amz-Date). When it
	// fails nothing is sent and Post returns its error: an *llm.Error as it
	// is (an adapter gives a failure that has a class one), anything else
	// wrapped, without a class. Nil sends the request as built.
	Sign func(*http.Request) error
}

// Reply is a provider's HTTP answer, whatever its status.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
	// Latency is the time from sending the request to having read the body.
	Latency time.Duration
}

// Post sends call with hc and reads the whole answer. It never retries.
//
// A reply with any status is returned as a *Reply: classifying it is the
// adapter's job. When no reply could be read, the error is either the
// caller's context error (errors.Is(err, context.Canceled) or
// context.DeadlineExceeded holds, and llm.ClassOf reports false: nobody
// should cool a key because the caller gave up) or an *llm.Error of class
// transient for a connection failure or Post's own call.Timeout, or
// call.Sign's error when it failed.
func Post(ctx context.Context, hc *http.Client, call Call) (*Reply, error) {
	callCtx, cancel := callContext(ctx, call)
	defer cancel()
	resp, start, err := send(ctx, callCtx, hc, call, "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := readBody(ctx, callCtx, call, resp)
	if err != nil {
		return nil, err
	}
	return &Reply{Status: resp.StatusCode, Header: resp.Header, Body: body, Latency: time.Since(start)}, nil
}

// callContext is ctx bounded by call.Timeout, whose expiry has the cause
// errCallTimeout.
func callContext(ctx context.Context, call Call) (context.Context, context.CancelFunc) {
	if call.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, call.Timeout, errCallTimeout)
}

// send builds call's request under callCtx, with accept as its Accept
// header unless call.Header has one, signs it and sends it with hc
// (http.DefaultClient when nil). start is when it was sent. The caller
// closes the response's body.
func send(ctx, callCtx context.Context, hc *http.Client, call Call, accept string) (resp *http.Response, start time.Time, err error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(callCtx, http.MethodPost, call.URL, bytes.NewReader(call.Body))
	if err != nil {
		// Only a malformed URL gets here: a configuration error, not a
		// provider failure, so it carries no class.
		return nil, time.Time{}, fmt.Errorf("%s: build request: %w", call.Provider, err)
	}
	for k, vs := range call.Header {
		req.Header[k] = vs
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", accept)
	}
	if call.Sign != nil {
		if err := call.Sign(req); err != nil {
			var pe *llm.Error
			if errors.As(err, &pe) {
				return nil, time.Time{}, err
			}
			return nil, time.Time{}, fmt.Errorf("%s: sign request: %w", call.Provider, err)
		}
	}
	start = time.Now()
	resp, err = hc.Do(req)
	if err != nil {
		return nil, time.Time{}, transportError(ctx, callCtx, call, "send request", err)
	}
	return resp, start, nil
}

// responseLimit is the largest body read for call.
func responseLimit(call Call) int {
	if call.MaxResponseBytes <= 0 {
		return MaxResponseBytes
	}
	return call.MaxResponseBytes
}

// readBody reads resp's whole body, bounded by the call's limit: a longer
// one is a transient *llm.Error, a failure to read one transportError's.
func readBody(ctx, callCtx context.Context, call Call, resp *http.Response) ([]byte, error) {
	limit := responseLimit(call)
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		return nil, transportError(ctx, callCtx, call, "read response", err)
	}
	if len(body) > limit {
		return nil, tooLong(call, resp.StatusCode, limit)
	}
	return body, nil
}

// tooLong is the error of an answer longer than limit bytes.
func tooLong(call Call, status, limit int) error {
	return &llm.Error{
		Class:    llm.ClassTransient,
		Provider: call.Provider,
		Status:   status,
		Message:  fmt.Sprintf("response body exceeds %d bytes", limit),
	}
}

// transportError turns a failure to send or read into the caller's context
// error or a transient *llm.Error. The *url.Error wrapper is dropped so that
// the URL (which may carry a gateway token in its query) never reaches an
// error string.
func transportError(ctx, callCtx context.Context, call Call, op string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %s: %w", call.Provider, op, ctxErr)
	}
	if errors.Is(context.Cause(callCtx), errCallTimeout) {
		// Our own deadline: transient, and deliberately not wrapping
		// context.DeadlineExceeded, so that errors.Is(err,
		// context.DeadlineExceeded) keeps meaning "the caller's deadline".
		return &llm.Error{
			Class:    llm.ClassTransient,
			Provider: call.Provider,
			Message:  fmt.Sprintf("%s: no answer within %s", op, call.Timeout),
		}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return &llm.Error{
		Class:    llm.ClassTransient,
		Provider: call.Provider,
		Message:  op + " failed",
		Err:      err,
	}
}

// Endpoint joins a configured base URL and an API path such as
// "/v1/messages". The base may carry a path prefix (a gateway's
// "https://gw.example/anthropic"); when it already ends in "/v1" that
// segment is not repeated, so both "https://api.openai.com" and
// "https://api.openai.com/v1" work.
func Endpoint(base, path string) string {
	base = strings.TrimRight(base, "/")
	if strings.HasSuffix(base, "/v1") && strings.HasPrefix(path, "/v1/") {
		path = strings.TrimPrefix(path, "/v1")
	}
	return base + path
}

// ValidateBaseURL reports whether base is an absolute http or https URL,
// naming field in the error.
func ValidateBaseURL(field, base string) error {
	u, err := url.Parse(base)
	if err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s: %q must be an absolute http(s) URL", field, base)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%s: %q must not have a query or fragment", field, base)
	}
	return nil
}

// ClassifyStatus is the class an HTTP status implies on its own. Adapters
// consult it only after their table of provider error codes found nothing,
// because providers reuse statuses for different facts (Anthropic reports a
// spend limit as 400 and 429, OpenAI a billing failure as 429).
//
//   - 401, 403: auth (the key is wrong, revoked or not allowed).
//   - 402: quota (payment required).
//   - 429: rate_limited.
//   - 529: overloaded (Anthropic's provider-wide overload status).
//   - 408, any 5xx, and anything that is neither 2xx nor 4xx: transient.
//   - any other 4xx: permanent (the request itself is wrong).
func ClassifyStatus(status int) llm.Class {
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return llm.ClassAuth
	case status == http.StatusPaymentRequired:
		return llm.ClassQuota
	case status == http.StatusTooManyRequests:
		return llm.ClassRateLimited
	case status == 529:
		return llm.ClassOverloaded
	case status == http.StatusRequestTimeout:
		return llm.ClassTransient
	case status >= 400 && status < 500:
		return llm.ClassPermanent
	default:
		return llm.ClassTransient
	}
}

// NoRedirects returns a copy of hc (http.DefaultClient when nil) that does
// not follow redirects: a redirect answer is returned as it is. net/http
// would otherwise re-send the request, custom key headers such as x-api-key
// included, to whatever host the redirect names, and a re-send is a retry
// Bulwark did not decide. The copy shares hc's Transport.
func NoRedirects(hc *http.Client) *http.Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	c := *hc
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

// UserAgent is the User-Agent adapters send.
const UserAgent = "bulwark"

// CheckKey returns an auth *llm.Error for a key that no header can carry
// (BadHeaderValue), nil otherwise: net/http would refuse to send it with
// an error that looks like a connection failure.
func CheckKey(p llm.Provider, key secret.String) error {
	if BadHeaderValue(key.Reveal()) {
		return &llm.Error{Class: llm.ClassAuth, Provider: p, Message: "the key contains characters a header cannot carry"}
	}
	return nil
}

// Unreadable is the error for a 2xx answer that does not decode: most
// likely a proxy's page or a cut-off answer, so it is transient (another
// attempt may fare better). Its message is redacted.
func Unreadable(p llm.Provider, reply *Reply, err error, key secret.String, rl llm.RateLimit) error {
	return &llm.Error{Class: llm.ClassTransient, Provider: p, Status: reply.Status,
		Message: Redact(err.Error(), key), RateLimit: rl}
}

// BadHeaderValue reports whether v holds a byte that an HTTP header value
// cannot carry (a control character other than tab, e.g. a newline pasted
// with a key). net/http would refuse to send it with an error that looks
// like a connection failure; adapters report it as a bad key instead.
func BadHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return true
		}
	}
	return false
}
