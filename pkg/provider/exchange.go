package provider

import (
	"context"
	"net/http"
	"time"

	"bulwark/pkg/llm"
)

// Wire is what an adapter supplies to Do to read its provider's replies:
// everything that differs between providers once a call is signed and
// sent. With Call (URL, headers, signing), it is the whole adapter.
type Wire struct {
	// Failure classifies a reply outside 2xx, read at now: an *llm.Error
	// from the provider's error table.
	Failure func(r *Reply, now time.Time) error
	// RateLimit reads a 2xx reply's rate-limit headers; nil when the
	// provider sends none (Bedrock).
	RateLimit func(h http.Header, now time.Time) llm.RateLimit
	// Decode reads a 2xx reply's body into the neutral model.
	Decode func(body []byte) (*llm.Response, error)
	// Redact removes from a message whatever signed the call (a key, a
	// token, AWS credentials): a decoder's error may quote the body.
	Redact func(msg string) string
}

// Do sends call (Post, which never retries) and reads the reply with w:
// the answer with its rate-limit headers and latency, w.Failure's error
// for a status outside 2xx, or a transient *llm.Error for a 2xx body that
// does not decode (most likely a proxy's page or a cut-off answer: another
// attempt may fare better), its message redacted.
func Do(ctx context.Context, hc *http.Client, call Call, w Wire) (*llm.Result, error) {
	reply, err := Post(ctx, hc, call)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if reply.Status < 200 || reply.Status > 299 {
		return nil, w.Failure(reply, now)
	}
	var rl llm.RateLimit
	if w.RateLimit != nil {
		rl = w.RateLimit(reply.Header, now)
	}
	resp, err := w.Decode(reply.Body)
	if err != nil {
		return nil, &llm.Error{Class: llm.ClassTransient, Provider: call.Provider, Status: reply.Status,
			Message: w.Redact(err.Error()), RateLimit: rl}
	}
	return &llm.Result{Response: resp, RateLimit: rl, Latency: reply.Latency}, nil
}
