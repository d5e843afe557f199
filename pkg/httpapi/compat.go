package httpapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/progress"
	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/provider/openai"
	"bulwark/pkg/queue"
)

// The compat endpoints speak the OpenAI Chat Completions, OpenAI Responses
// (its stateless subset) and Anthropic Messages APIs, so an existing SDK
// adopts Bulwark by changing its base URL. They run the same five layers
// as the async API and answer synchronously: they wait up to SyncTimeout
// for the result (by default as long as the request may wait in line,
// and its call take); past it they answer 429 still_queued with
// Retry-After and the request id in X-Bulwark-Request-Id. The caller may
// fetch the result (GET /v1/requests/{id}) or simply resend the call, as
// the SDKs' own retries do: a resend while the request has not ended
// joins it (pkg/intake, join.go) and waits for the same answer. Bulwark's
// own knobs travel in headers:
//
//	X-Bulwark-Priority         critical|high|normal|low or 1-4
//	X-Bulwark-Case-Id          diagnosis case (cache invalidation)
//	X-Bulwark-Cache-Layer      router|agent|synthesizer
//	X-Bulwark-Tool-Results-Hash  scope of the cache entry
//	X-Bulwark-Cache            "bypass" (no read, no write), "no-store", "no-read"
//	Idempotency-Key            same key, same request
//
// Answers carry X-Bulwark-Request-Id, X-Bulwark-Provider,
// X-Bulwark-Model-Tier and X-Bulwark-Cache (none|exact|semantic|coalesced):
// which provider answered is visible only to a caller who looks. An
// answer from a route whose model gives fewer output tokens than the call
// asked (a fallback) also carries X-Bulwark-Max-Tokens-Clamped:
// "64000->16384", the max_tokens asked and the one sent.
//
// max_tokens is checked against the asked route's model (its tier's
// max_output_tokens): above it, the call is refused as that dialect's
// provider refuses it. An OpenAI call without max_tokens gets the model's
// maximum, as OpenAI does; an Anthropic call must give it, as Anthropic
// requires.

// dialect is one compat API's wire format.
type dialect struct {
	name string
	// idPrefix of answer ids: the provider's own id would tell which
	// provider answered.
	idPrefix string
	decode   func(body []byte) (answering, *llm.Request, error)
	// itemRefs resolves the Responses API's item_reference input items
	// from the tenant's earlier answers before decode (itemref.go).
	itemRefs bool
	// modelMaxTokens gives a call without max_tokens its model's maximum
	// (intake.Submission.ModelMaxTokens).
	modelMaxTokens bool
	// tooManyTokens is the provider's own 400 for a max_tokens above the
	// model's maximum.
	tooManyTokens func(a answering, e *intake.OutputLimitError) []byte
	encode        func(resp *llm.Response, model string) ([]byte, error)
	// stream starts writing answer id as the dialect's event stream.
	stream func(w io.Writer, id string, a answering) streamWriter
	error  func(status int, code, msg string) []byte
	// event is the SSE event name of an error inside a stream ("" for a
	// bare data line): OpenAI sends its error object as data mid-stream,
	// Anthropic an "error" event.
	event string
}

// streamWriter writes one answer as an event stream: the deltas as they
// come, then the end, with what of the answer no delta carried (all of it
// for an answer that was not streamed: a cache hit, a provider without a
// streaming adapter).
type streamWriter interface {
	Delta(d llm.Delta) error
	End(resp *llm.Response) error
}

// countingWriter counts the deltas written to a stream.
type countingWriter struct {
	streamWriter
	n int
}

func (w *countingWriter) Delta(d llm.Delta) error {
	w.n++
	return w.streamWriter.Delta(d)
}

// answering is how a compat call asked to be answered, in any dialect:
// under the model name it gave, streamed or not, and (OpenAI's
// stream_options.include_usage) with a usage chunk.
type answering struct {
	model  string
	stream bool
	usage  bool
	// maxTokensParam is the field max_tokens came in (OpenAI has two).
	maxTokensParam string
}

var openAIDialect = dialect{
	name:     "openai",
	idPrefix: "chatcmpl-",
	decode: func(body []byte) (answering, *llm.Request, error) {
		info, req, err := openai.DecodeRequest(body)
		if err != nil {
			return answering{}, nil, err
		}
		return answering{model: info.Model, stream: info.Stream, usage: info.IncludeUsage,
			maxTokensParam: cmp.Or(info.MaxTokensParam, "max_tokens")}, req, nil
	},
	modelMaxTokens: true,
	tooManyTokens: func(a answering, e *intake.OutputLimitError) []byte {
		return openai.EncodeMaxTokensError(a.maxTokensParam, e.Asked, e.Limit)
	},
	encode: openai.EncodeResponse,
	stream: func(w io.Writer, id string, a answering) streamWriter {
		return openai.NewStreamWriter(w, id, a.model, openai.WithUsage(a.usage))
	},
	error: openai.EncodeError,
}

var anthropicDialect = dialect{
	name:     "anthropic",
	idPrefix: "msg_",
	decode: func(body []byte) (answering, *llm.Request, error) {
		info, req, err := anthropic.DecodeRequest(body)
		if err != nil {
			return answering{}, nil, err
		}
		return answering{model: info.Model, stream: info.Stream}, req, nil
	},
	tooManyTokens: func(a answering, e *intake.OutputLimitError) []byte {
		return anthropic.EncodeMaxTokensError(e.Asked, e.Limit, a.model)
	},
	encode: anthropic.EncodeResponse,
	stream: func(w io.Writer, id string, a answering) streamWriter {
		return anthropic.NewStreamWriter(w, id, a.model)
	},
	error: anthropic.EncodeError,
	event: "error",
}

// responsesDialect is OpenAI's Responses API, stateless (see
// openai.DecodeResponsesRequest): its answers are response objects, its
// streams named events, its errors those of Chat Completions.
var responsesDialect = dialect{
	name:     "responses",
	idPrefix: "resp_",
	itemRefs: true,
	decode: func(body []byte) (answering, *llm.Request, error) {
		info, req, err := openai.DecodeResponsesRequest(body)
		if err != nil {
			return answering{}, nil, err
		}
		return answering{model: info.Model, stream: info.Stream, maxTokensParam: "max_output_tokens"}, req, nil
	},
	modelMaxTokens: true,
	tooManyTokens: func(a answering, e *intake.OutputLimitError) []byte {
		return openai.EncodeMaxTokensError(a.maxTokensParam, e.Asked, e.Limit)
	},
	encode: openai.EncodeResponsesResponse,
	stream: func(w io.Writer, id string, a answering) streamWriter {
		return openai.NewResponsesStreamWriter(w, id, a.model)
	},
	error: openai.EncodeError,
	event: "error",
}

func openAIError(c *gin.Context, status int, code, msg string) {
	c.Data(status, "application/json", openai.EncodeError(status, code, msg))
	c.Abort()
}

func anthropicError(c *gin.Context, status int, code, msg string) {
	c.Data(status, "application/json", anthropic.EncodeError(status, code, msg))
	c.Abort()
}

func (s *Server) openAIChat(c *gin.Context)        { s.compat(c, openAIDialect) }
func (s *Server) anthropicMessages(c *gin.Context) { s.compat(c, anthropicDialect) }
func (s *Server) openAIResponses(c *gin.Context)   { s.compat(c, responsesDialect) }

// streamFailer is a stream writer that ends its stream on an error in a
// shape of its own (the Responses API's error and response.failed events
// are numbered in the stream's sequence), rather than as the dialect's
// error object in a data line.
type streamFailer interface {
	Fail(code, message string) error
}

// ctxStream holds the streamWriter of a streaming compat call, for fail.
const ctxStream = "bulwark.stream"

func (d dialect) fail(c *gin.Context, status int, code, msg string) {
	if c.Writer.Written() {
		// A stream already under way (its headers went out while the
		// request waited): the error ends it, as the provider's own
		// streams end on an error.
		if sw, ok := c.Get(ctxStream); ok {
			if f, ok := sw.(streamFailer); ok {
				_ = f.Fail(code, msg) // the caller may be gone; nothing else to tell it
				c.Writer.Flush()
				c.Abort()
				return
			}
		}
		d.failStream(c.Writer, status, code, msg)
		c.Abort()
		return
	}
	c.Data(status, "application/json", d.error(status, code, msg))
	c.Abort()
}

// failStream writes an error as the dialect's streams carry one.
func (d dialect) failStream(w gin.ResponseWriter, status int, code, msg string) {
	if d.event != "" {
		_, _ = fmt.Fprintf(w, "event: %s\n", d.event)
	}
	_, _ = fmt.Fprintf(w, "data: %s\n\n", d.error(status, code, msg))
	w.Flush()
}

// readBody reads a compat request's body, answering in d's dialect when
// it cannot (too large, broken off).
func (s *Server) readBody(c *gin.Context, d dialect) ([]byte, bool) {
	body, err := io.ReadAll(c.Request.Body)
	switch {
	case isBodyTooLarge(err):
		d.fail(c, http.StatusRequestEntityTooLarge, "body_too_large",
			fmt.Sprintf("request body exceeds the limit of %d bytes", s.cfg.MaxBodyBytes))
		return nil, false
	case err != nil:
		d.fail(c, http.StatusBadRequest, "invalid_body", "could not read the request body")
		return nil, false
	}
	return body, true
}

func (s *Server) compat(c *gin.Context, d dialect) {
	body, ok := s.readBody(c, d)
	if !ok {
		return
	}
	if err := checkUTF8(body); err != nil {
		d.fail(c, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if d.itemRefs {
		var err error
		if body, err = s.resolveItemRefs(c.Request.Context(), tenantOf(c).Name, body); err != nil {
			d.fail(c, http.StatusBadRequest, "invalid_request", err.Error())
			return
		}
	}
	ans, req, err := d.decode(body)
	if err != nil {
		d.fail(c, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	model := ans.model
	route, ok := s.d.Models.Resolve(model)
	if !ok {
		d.fail(c, http.StatusNotFound, "model_not_found", fmt.Sprintf("unknown model %q", model))
		return
	}
	sub, err := compatSubmission(c, route, req)
	sub.Stream, sub.ModelMaxTokens = ans.stream, d.modelMaxTokens
	if err != nil {
		d.fail(c, http.StatusBadRequest, "invalid_header", err.Error())
		return
	}
	t := tenantOf(c)
	if !s.waits.enter(t.Name, t.MaxSyncWaits) {
		c.Header("Retry-After", "5")
		d.fail(c, http.StatusTooManyRequests, "too_many_waits", fmt.Sprintf(
			"this tenant already has %d requests waiting for their answers on this API process; retry later, or submit to POST /v1/requests and follow its events",
			t.MaxSyncWaits))
		return
	}
	defer s.waits.leave(t.Name)
	ctx := c.Request.Context()
	a, err := s.d.Intake.Submit(ctx, t, sub)
	if err != nil {
		s.compatSubmitError(c, d, ans, err)
		return
	}
	c.Set(ctxRequestID, a.ID)
	c.Header("X-Bulwark-Request-Id", a.ID)
	var sw *countingWriter
	if ans.stream {
		inner := d.stream(c.Writer, d.idPrefix+followed(a), ans)
		c.Set(ctxStream, inner)
		sw = &countingWriter{streamWriter: inner}
	}
	wait := func(a *intake.Accepted) (*job.Record, error) {
		if sw != nil && a.Ended == nil {
			return s.awaitStreaming(c, a, sw)
		}
		return s.await(ctx, a)
	}
	rec, err := wait(a)
	if err == nil && a.CoalescedInto != "" && rec.Job.ID != a.ID && !rec.SharedEnding() {
		// The request this one joined ended for a reason of its own (its
		// caller cancelled it, its deadline passed): this one gets a call
		// of its own at once (the sweep would, once it is OrphanAge old),
		// and this caller waits for that. Unless part of the other
		// answer was streamed to it already: a second answer would not
		// continue the first.
		if sw != nil && sw.n > 0 {
			d.fail(c, http.StatusBadGateway, "stream_interrupted",
				"the identical request this call joined ended before its answer was complete; send the request again")
			return
		}
		if err := s.d.Intake.RunAlone(ctx, a.ID); err != nil {
			s.d.Logger.Warn("compat: could not run a joined request alone; the sweep will", "request_id", a.ID, "err", err)
		}
		own := *a
		own.CoalescedInto = ""
		rec, err = wait(&own)
	}
	switch {
	case errors.Is(err, progress.ErrNotEnded):
		if !c.Writer.Written() {
			setRetryAfter(c, s.retryHint(ctx, a))
		}
		d.fail(c, http.StatusTooManyRequests, "still_queued", fmt.Sprintf(
			"the request has not finished within %s; resend the same call (it joins request %s and waits for its answer) or fetch it with GET /v1/requests/%s",
			s.cfg.SyncTimeout, a.ID, a.ID))
		return
	case err != nil:
		if ctx.Err() == nil {
			d.fail(c, http.StatusServiceUnavailable, "unavailable", "request store unavailable")
		}
		return
	}
	switch {
	case a.CoalescedInto != "" && rec.Job.ID != a.ID:
		rec.State.Cached = job.CachedCoalesced
	case a.Existing && a.JoinKey != "" && !rec.State.Cached.Shared():
		// A resend that joined the request it repeats (or another caller's
		// identical call): the provider call was shared, not made for it.
		rec.State.Cached = job.CachedCoalesced
	}
	if ctx.Err() != nil {
		// The caller has gone (its SDK gave up): the answer is not written
		// and the request stays joinable, so the resend gets it.
		return
	}
	if a.JoinKey != "" {
		// The answer goes to a caller now: a resend from now on is a call
		// of its own (until now it joined this request, pkg/intake
		// join.go). Before the answer is written, so that a caller who
		// sends the same call again as soon as it has the answer never
		// finds this request still named.
		if err := s.d.Jobs.Unjoin(context.WithoutCancel(ctx), a.JoinKey, a.ID); err != nil {
			s.d.Logger.Warn("compat: unjoin", "request_id", a.ID, "err", err)
		}
	}
	var out streamWriter
	if sw != nil {
		out = sw
	}
	s.compatAnswer(c, d, rec, ans, out)
}

// compatSubmission reads Bulwark's headers.
func compatSubmission(c *gin.Context, route llm.Route, req *llm.Request) (intake.Submission, error) {
	r := *req
	r.Model = "" // the route's configured model is used
	sub := intake.Submission{Route: route, Request: r,
		CaseID: c.GetHeader("X-Bulwark-Case-Id"), Layer: c.GetHeader("X-Bulwark-Cache-Layer"),
		ToolResultsHash: c.GetHeader("X-Bulwark-Tool-Results-Hash"),
		IdempotencyKey:  c.GetHeader("Idempotency-Key"), Lang: progress.Lang(c.GetHeader("Accept-Language")),
		Waited: true}
	if p := c.GetHeader("X-Bulwark-Priority"); p != "" {
		v, err := priority.Parse(p)
		if err != nil {
			return sub, fmt.Errorf("X-Bulwark-Priority: %w", err)
		}
		sub.Priority = v
	}
	switch strings.ToLower(c.GetHeader("X-Bulwark-Cache")) {
	case "":
	case "bypass":
		sub.NoCacheRead, sub.NoCacheWrite = true, true
	case "no-store":
		sub.NoCacheWrite = true
	case "no-read":
		sub.NoCacheRead = true
	default:
		return sub, fmt.Errorf("X-Bulwark-Cache: want bypass, no-store or no-read")
	}
	switch strings.ToLower(c.GetHeader("X-Bulwark-Compress")) {
	case "", "on":
	case "off":
		sub.NoCompress = true
	default:
		return sub, fmt.Errorf("X-Bulwark-Compress: want on or off")
	}
	return sub, nil
}

// compatSubmitError answers a refused compat submission in d's dialect; a
// max_tokens above the model's maximum as the dialect's provider words it.
func (s *Server) compatSubmitError(c *gin.Context, d dialect, ans answering, err error) {
	if e, ok := errors.AsType[*intake.OutputLimitError](err); ok {
		c.Data(http.StatusBadRequest, "application/json", d.tooManyTokens(ans, e))
		c.Abort()
		return
	}
	r := s.reject(c, err)
	if r.status == http.StatusUnprocessableEntity {
		r.status = http.StatusBadRequest // both SDKs treat 400 as the caller's fault
	}
	msg := r.msg
	if r.field != "" {
		msg = r.field + ": " + msg // the dialects' errors have no field of their own
	}
	d.fail(c, r.status, r.code, msg)
}

// await waits for a request (or the one it coalesced into) to end, up to
// SyncTimeout (progress.ErrNotEnded after that).
func (s *Server) await(ctx context.Context, a *intake.Accepted) (*job.Record, error) {
	if a.Ended != nil {
		return a.Ended, nil // answered at submission: nothing to wait for or read
	}
	return s.d.Hub.WaitEnd(ctx, followed(a), s.cfg.SyncTimeout, s.d.Jobs, progress.Watch{})
}

// awaitStreaming is await for a streaming call: the stream's headers go
// out at once and a comment line every KeepAlive while the request waits
// (the SDKs skip comments), so that no proxy's idle timeout cuts a call
// that is queued or waiting for a key; the answer's deltas are written to
// sw as the worker streams them (pkg/dispatch, stream.go), from the first
// for a caller that joins late. Which provider answered and whether the
// cache did are then sent as trailers (X-Bulwark-Provider,
// X-Bulwark-Model-Tier, X-Bulwark-Cache, X-Bulwark-Max-Tokens-Clamped),
// the headers being gone.
//
// Each write has WriteTimeout to go out (writeDeadlines): a caller that
// reads slower than that is dropped (the worker never waits for it;
// pkg/progress replays the deltas a busy stream missed from the request's
// events, which job.MaxEvents bounds).
func (s *Server) awaitStreaming(c *gin.Context, a *intake.Accepted, sw streamWriter) (*job.Record, error) {
	w := c.Writer
	w.Header().Set("Trailer", "X-Bulwark-Provider, X-Bulwark-Model-Tier, X-Bulwark-Cache, X-Bulwark-Max-Tokens-Clamped")
	startSSE(w)
	w.Flush()
	keepAlive := func() error {
		if _, err := fmt.Fprint(w, ": waiting\n\n"); err != nil {
			return err
		}
		w.Flush()
		return nil
	}
	deltas := func(ev job.Event) error {
		if ev.Type != job.EventDelta {
			return nil
		}
		for _, dl := range ev.Delta {
			if err := sw.Delta(dl); err != nil {
				return err
			}
		}
		w.Flush()
		return nil
	}
	return s.d.Hub.WaitEnd(c.Request.Context(), followed(a), s.cfg.SyncTimeout, s.d.Jobs,
		progress.Watch{Every: s.cfg.KeepAlive, Idle: keepAlive, Event: deltas})
}

// followed is the request whose ending answers a: a itself, or the one it
// coalesced into.
func followed(a *intake.Accepted) string {
	if a.CoalescedInto != "" {
		return a.CoalescedInto
	}
	return a.ID
}

// retryHint is when a request that has not ended is worth asking for
// again. A resend joins it and waits SyncTimeout anew, so the wait is the
// time until there is room for it: while it is queued (it, or the request
// it coalesced into), its measured ETA, never past its deadline (MaxWait
// after its creation: it has started or failed by then); once it runs,
// queue.MinRetryAfter.
func (s *Server) retryHint(ctx context.Context, a *intake.Accepted) time.Duration {
	follow := followed(a)
	sp, err := s.d.Queue.SpotOf(ctx, follow)
	if err != nil || sp.Position == 0 {
		return queue.MinRetryAfter
	}
	until := s.cfg.MaxWait
	if created, ok := job.IDTime(follow); ok {
		until = time.Until(created.Add(s.cfg.MaxWait))
	}
	return min(sp.ETA, until)
}

// setRetryAfter tells a caller when to come back: Retry-After in whole
// seconds (rounded up) and Retry-After-Ms, which both official SDKs read
// before it; never sooner than queue.MinRetryAfter. Both SDKs wait what
// they are told before their next retry (openai-go gives up at once on
// more than 2 minutes), so it must be the real wait, or they spend their
// retries (two by default) against a full queue in seconds.
func setRetryAfter(c *gin.Context, d time.Duration) {
	d = max(d, queue.MinRetryAfter)
	c.Header("Retry-After", strconv.Itoa(ceilSeconds(d)))
	c.Header("Retry-After-Ms", strconv.FormatInt(d.Milliseconds(), 10))
}

// compatAnswer writes rec's ending in d's dialect; sw is the stream of a
// streaming call (nil for the others), perhaps with deltas written.
func (s *Server) compatAnswer(c *gin.Context, d dialect, rec *job.Record, ans answering, sw streamWriter) {
	st := rec.State
	if rec.Status != job.StatusCompleted || st.Result == nil {
		status, code := failureStatus(rec)
		d.fail(c, status, code, rec.Reason)
		return
	}
	if st.ServedRoute != nil {
		c.Header("X-Bulwark-Provider", string(st.ServedRoute.Provider))
		c.Header("X-Bulwark-Model-Tier", st.ServedRoute.Tier)
	}
	c.Header("X-Bulwark-Cache", string(st.Cached.OrNone()))
	if st.MaxTokensClamped != nil {
		c.Header("X-Bulwark-Max-Tokens-Clamped", st.MaxTokensClamped.String())
	}
	resp := *st.Result
	resp.ID = d.idPrefix + rec.Job.ID
	if sw != nil {
		if !c.Writer.Written() {
			startSSE(c.Writer)
		}
		if err := sw.End(&resp); err != nil {
			s.d.Logger.Warn("compat: stream", "err", err)
		}
		c.Writer.Flush()
		return
	}
	body, err := d.encode(&resp, ans.model)
	if err != nil {
		d.fail(c, http.StatusInternalServerError, "encode_failed", "could not encode the answer")
		return
	}
	c.Data(http.StatusOK, "application/json", body)
}

// failureStatus is the HTTP status and error code of a request that ended
// without an answer, by its typed job.Code.
func failureStatus(rec *job.Record) (int, string) {
	if rec.Status == job.StatusCancelled {
		return http.StatusConflict, "cancelled"
	}
	switch rec.Code {
	case job.CodeDeadline:
		return http.StatusServiceUnavailable, "deadline_exceeded"
	case job.CodeProviderError:
		return http.StatusBadRequest, "provider_rejected"
	case job.CodeNoRoute:
		return http.StatusBadRequest, "no_route"
	case job.CodeInterrupted:
		return http.StatusBadGateway, "stream_interrupted"
	default: // provider_unavailable, lost, and records older than codes
		return http.StatusBadGateway, "upstream_failed"
	}
}
