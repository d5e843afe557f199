package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	// ReadStream reads a 2xx reply's event stream into the neutral model
	// for DoStream, calling emit with each delta as it arrives (see
	// llm.Streamer), and returns the assembled answer once the stream's
	// end event came. An error event of the provider's is an *ErrorEvent;
	// any other error means the stream is malformed, cut off or could
	// not be read. Nil for an adapter that does not stream.
	ReadStream func(body io.Reader, emit func(llm.Delta)) (*llm.Response, error)
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

// ErrorEvent is what a Wire.ReadStream returns for an error the provider
// sent in the stream after a 2xx status (Anthropic's "event: error",
// OpenAI's "data: {"error":…}"). DoStream classifies Body with
// Wire.Failure as a reply of the stream's status and headers, so that a
// mid-stream overloaded_error means what a 529 with that body means.
type ErrorEvent struct {
	// Body is the event's data, the provider's error object.
	Body []byte
}

// Error does not quote Body, which only Wire.Failure may read (and
// redact).
func (e *ErrorEvent) Error() string { return "the provider sent an error event" }

// DoStream is Do for a streamed answer: it sends call as Post does
// (signing, headers, Accept: text/event-stream, call.Timeout bounding the
// whole exchange, the stream included) and reads the reply with w. A
// status outside 2xx is read whole and classified by w.Failure, exactly
// as Do would. A 2xx reply's rate-limit headers are read, then its body
// goes to w.ReadStream, which calls emit (never concurrently) with each
// delta as it arrives; the answer it assembles is returned with the
// rate-limit headers and the latency until the stream's end.
//
// When the stream fails, the error is the caller's context error when ctx
// ended (errors.Is(err, context.Canceled) or DeadlineExceeded, and not an
// *llm.Error), w.Failure's *llm.Error for an ErrorEvent, and otherwise a
// transient *llm.Error: as Post's for a connection lost while reading or
// for call.Timeout, as Do's for a stream that is malformed or ends before
// its end event (its message redacted with w.Redact). emit may have been
// called before any of these failures.
func DoStream(ctx context.Context, hc *http.Client, call Call, w Wire, emit func(llm.Delta)) (*llm.Result, error) {
	if w.ReadStream == nil {
		return nil, fmt.Errorf("%s: stream: the adapter reads no event streams", call.Provider)
	}
	if emit == nil {
		emit = func(llm.Delta) {}
	}
	callCtx, cancel := callContext(ctx, call)
	defer cancel()
	resp, start, err := send(ctx, callCtx, hc, call, "text/event-stream")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, err := readBody(ctx, callCtx, call, resp)
		if err != nil {
			return nil, err
		}
		reply := &Reply{Status: resp.StatusCode, Header: resp.Header, Body: body, Latency: time.Since(start)}
		return nil, w.Failure(reply, time.Now())
	}
	now := time.Now()
	var rl llm.RateLimit
	if w.RateLimit != nil {
		rl = w.RateLimit(resp.Header, now)
	}
	body := &streamBody{r: resp.Body, limit: responseLimit(call)}
	out, err := w.ReadStream(body, emit)
	if err != nil {
		return nil, streamFailure(ctx, callCtx, call, w, resp, body, rl, err)
	}
	return &llm.Result{Response: out, RateLimit: rl, Latency: time.Since(start)}, nil
}

// streamFailure is the error of a 2xx stream whose reader failed with err.
// The body's own record comes first: whatever a format's reader made of a
// failed read, the connection (or ctx, or the call's deadline) failed, not
// the provider's answer.
func streamFailure(ctx, callCtx context.Context, call Call, w Wire, resp *http.Response, body *streamBody, rl llm.RateLimit, err error) error {
	if body.over {
		return tooLong(call, resp.StatusCode, body.limit)
	}
	if body.err != nil {
		return transportError(ctx, callCtx, call, "read response", body.err)
	}
	var ev *ErrorEvent
	if errors.As(err, &ev) {
		return w.Failure(&Reply{Status: resp.StatusCode, Header: resp.Header, Body: ev.Body}, time.Now())
	}
	return &llm.Error{Class: llm.ClassTransient, Provider: call.Provider, Status: resp.StatusCode,
		Message: w.Redact(err.Error()), RateLimit: rl}
}

// errStreamTooLong is what a streamBody returns past its limit.
var errStreamTooLong = errors.New("response body exceeds the limit")

// streamBody is a stream's body as a format's reader sees it: bounded by
// limit bytes, and remembering its first read failure so that a lost
// connection is told apart from a malformed stream.
type streamBody struct {
	r     io.Reader
	limit int
	n     int   // bytes read so far
	over  bool  // more than limit bytes came
	err   error // the first read error other than io.EOF
}

func (b *streamBody) Read(p []byte) (int, error) {
	if b.over {
		return 0, errStreamTooLong
	}
	// One byte past the limit tells a body of exactly limit bytes from a
	// longer one.
	p = p[:min(len(p), b.limit+1-b.n)]
	n, err := b.r.Read(p)
	b.n += n
	if b.n > b.limit {
		b.over = true
		return 0, errStreamTooLong
	}
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}
