package httpapi

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/finish"
	"bulwark/pkg/history"
	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/progress"
	"bulwark/pkg/queue"
)

// submitBody is POST /v1/requests.
type submitBody struct {
	Provider    llm.Provider    `json:"provider"`
	ModelTier   string          `json:"model_tier"`
	Messages    []wireMessage   `json:"messages"`
	System      string          `json:"system"`
	MaxTokens   int             `json:"max_tokens"`
	Temperature *float64        `json:"temperature"`
	Tools       []llm.Tool      `json:"tools"`
	ToolChoice  *llm.ToolChoice `json:"tool_choice"`
	Stop        []string        `json:"stop_sequences"`
	// Priority is decoded in submit: a well-formed body naming an unknown
	// priority is a 422 on "priority", not malformed JSON.
	Priority   json.RawMessage   `json:"priority"`
	CaseID     string            `json:"case_id"`
	CacheLayer string            `json:"cache_layer"`
	Metadata   map[string]string `json:"metadata"`
	// CacheRead and CacheWrite default to true; false bypasses the cache.
	CacheRead  *bool `json:"cache_read"`
	CacheWrite *bool `json:"cache_write"`
	// Compress defaults to true: where prompt compression is on, false
	// sends this request's prompt as written.
	Compress *bool `json:"compress"`
	// Stream adds "delta" events, the answer's pieces as the provider
	// writes them, to GET /v1/requests/{id}/events.
	Stream bool `json:"stream"`
}

// wireMessage accepts content as a string or as an array of blocks.
type wireMessage struct {
	Role    llm.Role        `json:"role"`
	Content json.RawMessage `json:"content"`
}

func (m wireMessage) toLLM(i int) (llm.Message, error) {
	out := llm.Message{Role: m.Role}
	c := bytes.TrimSpace(m.Content)
	switch {
	case len(c) == 0 || string(c) == "null":
		return out, fmt.Errorf("messages[%d].content: is required", i)
	case c[0] == '"':
		var s string
		if err := json.Unmarshal(c, &s); err != nil {
			return out, fmt.Errorf("messages[%d].content: %v", i, err)
		}
		if s == "" {
			return out, fmt.Errorf("messages[%d].content: must not be empty", i)
		}
		out.Content = []llm.Block{{Type: llm.BlockText, Text: s}}
	case c[0] == '[':
		if err := json.Unmarshal(c, &out.Content); err != nil {
			return out, fmt.Errorf("messages[%d].content: %v", i, err)
		}
	default:
		return out, fmt.Errorf("messages[%d].content: must be a string or an array of blocks", i)
	}
	return out, nil
}

// decodeJSON reads a JSON body strictly and answers 400/413 itself.
func decodeJSON(c *gin.Context, v any) bool {
	body, err := io.ReadAll(c.Request.Body) // bounded by limitBody
	if err == nil {
		err = checkUTF8(body)
	}
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
		if err == nil && len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
			err = errors.New("unexpected data after the JSON object")
		}
	}
	switch {
	case err == nil:
		return true
	case isBodyTooLarge(err):
		apiError(c, http.StatusRequestEntityTooLarge, "body_too_large", "", "request body exceeds the limit")
	case errors.Is(err, io.EOF):
		apiError(c, http.StatusBadRequest, "invalid_json", "", "request body is empty")
	case errors.Is(err, errNotUTF8):
		apiError(c, http.StatusBadRequest, "invalid_json", "", err.Error())
	default:
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := cmp.Or(te.Field, "the body")
			apiError(c, http.StatusBadRequest, "invalid_type", te.Field,
				fmt.Sprintf("%s must be %s, not %s", field, jsonKind(te.Type), te.Value))
			return false
		}
		apiError(c, http.StatusBadRequest, "invalid_json", "", "malformed JSON: "+err.Error())
	}
	return false
}

// errNotUTF8 refuses a body that is not UTF-8, as JSON must be (RFC
// 8259): decoding would turn each stray byte into U+FFFD, three bytes,
// and store the request three times its size.
var errNotUTF8 = errors.New("request body is not valid UTF-8")

// checkUTF8 returns errNotUTF8, with where, for a body that is not UTF-8.
func checkUTF8(body []byte) error {
	if utf8.Valid(body) {
		return nil
	}
	n := 0
	for n < len(body) {
		r, size := utf8.DecodeRune(body[n:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		n += size
	}
	return fmt.Errorf("%w (at byte %d)", errNotUTF8, n)
}

// jsonKind names what JSON a Go type decodes from, for error messages
// (never the Go type's own name).
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	default:
		return "a number"
	}
}

func (s *Server) submit(c *gin.Context) {
	var b submitBody
	if !decodeJSON(c, &b) {
		return
	}
	if b.Provider == "" || b.ModelTier == "" {
		apiError(c, http.StatusUnprocessableEntity, "invalid_request", "model_tier", "provider and model_tier are required")
		return
	}
	sub := intake.Submission{
		Route: llm.Route{Provider: b.Provider, Tier: b.ModelTier},
		Request: llm.Request{System: b.System, MaxTokens: b.MaxTokens, Temperature: b.Temperature,
			Tools: b.Tools, ToolChoice: b.ToolChoice, StopSequences: b.Stop},
		CaseID: b.CaseID, Layer: b.CacheLayer, Metadata: b.Metadata,
		NoCacheRead:    b.CacheRead != nil && !*b.CacheRead,
		NoCacheWrite:   b.CacheWrite != nil && !*b.CacheWrite,
		NoCompress:     b.Compress != nil && !*b.Compress,
		Stream:         b.Stream,
		IdempotencyKey: c.GetHeader("Idempotency-Key"),
		Lang:           progress.Lang(c.GetHeader("Accept-Language")),
	}
	if len(b.Priority) > 0 && string(b.Priority) != "null" {
		if err := json.Unmarshal(b.Priority, &sub.Priority); err != nil {
			apiError(c, http.StatusUnprocessableEntity, "invalid_request", "priority", err.Error())
			return
		}
	}
	for i, m := range b.Messages {
		lm, err := m.toLLM(i)
		if err != nil {
			apiError(c, http.StatusBadRequest, "invalid_request", fmt.Sprintf("messages[%d].content", i), err.Error())
			return
		}
		sub.Request.Messages = append(sub.Request.Messages, lm)
	}
	a, err := s.d.Intake.Submit(c.Request.Context(), tenantOf(c), sub)
	if err != nil {
		s.submitError(c, err)
		return
	}
	c.Set(ctxRequestID, a.ID)
	s.accepted(c, a, sub.Lang)
}

// retryShortly is the Retry-After (seconds) of a submission refused for a
// passing cause on our side (Redis unreachable, replicas not confirming in
// time): the official SDKs retry a 503 and honour it.
const retryShortly = "1"

// retryLater sets the headers of a submission refused with 503: when
// and, for a request stored and running but not confirmed durable, which
// request it is.
func retryLater(c *gin.Context, err error) {
	c.Header("Retry-After", retryShortly)
	if ue, ok := errors.AsType[*intake.UnconfirmedError](err); ok {
		c.Header("X-Bulwark-Request-Id", ue.ID)
	}
}

// rejection is how a refused submission is answered, in any dialect: the
// one map from intake's errors to HTTP.
type rejection struct {
	status     int
	code       string
	field      string // the request field at fault, when there is one
	msg        string
	retryAfter time.Duration // 0: none to give
	internal   bool          // Bulwark's fault, not the caller's: logged, Retry-After shortly
}

func rejectionOf(err error) rejection {
	if ie, ok := errors.AsType[*intake.InputError](err); ok {
		return rejection{status: ie.Status, code: ie.Code, field: ie.Field, msg: ie.Message}
	}
	if tf, ok := errors.AsType[*intake.TenantFullError](err); ok {
		return rejection{status: http.StatusTooManyRequests, code: "tenant_queue_full", msg: tf.Error(), retryAfter: tf.RetryAfter}
	}
	if be, ok := errors.AsType[*job.BudgetError](err); ok {
		after := max(time.Second, time.Until(be.FreedAt))
		return rejection{status: http.StatusTooManyRequests, code: "tenant_storage_full", retryAfter: after,
			msg: fmt.Sprintf("this tenant's stored requests and results hold %s of its %s Redis budget and this request needs %s more; "+
				"results are kept result_ttl after they end; retry after %d seconds",
				mib(be.Used), mib(be.Budget), mib(be.Need), ceilSeconds(after))}
	}
	if full, ok := errors.AsType[*queue.FullError](err); ok {
		return rejection{status: http.StatusTooManyRequests, code: "queue_full", retryAfter: full.RetryAfter,
			msg: fmt.Sprintf("the queue is full (%d requests waiting); retry after %d seconds", full.Depth, ceilSeconds(full.RetryAfter))}
	}
	if rl, ok := errors.AsType[*intake.RateLimitError](err); ok {
		return rejection{status: http.StatusTooManyRequests, code: "tenant_rate_limited", msg: rl.Error(), retryAfter: rl.RetryAfter}
	}
	return rejection{status: http.StatusServiceUnavailable, code: "unavailable", internal: true,
		msg: "could not accept the request; retry shortly"}
}

// reject sets a rejection's headers (Retry-After, and the request id of a
// submission whose fate is unknown) and logs Bulwark's own failures; the
// caller writes the body in its dialect.
func (s *Server) reject(c *gin.Context, err error) rejection {
	r := rejectionOf(err)
	switch {
	case r.internal:
		s.d.Logger.Error("submit failed", "path", c.FullPath(), "err", err)
		retryLater(c, err)
	case r.retryAfter > 0:
		setRetryAfter(c, r.retryAfter)
	}
	return r
}

// submitError answers a refused submission of the native API.
func (s *Server) submitError(c *gin.Context, err error) {
	r := s.reject(c, err)
	if r.code == "queue_full" {
		c.AbortWithStatusJSON(r.status, gin.H{"error": gin.H{"type": r.code, "message": r.msg},
			"retry_after_seconds": ceilSeconds(r.retryAfter)})
		return
	}
	apiError(c, r.status, r.code, r.field, r.msg)
}

// mib writes n bytes in MiB, for messages.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func ceilSeconds(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }

// accepted writes the design document's 4.3 (queued) or 7.3 (degraded)
// answer, or the result of a cache hit.
func (s *Server) accepted(c *gin.Context, a *intake.Accepted, lang string) {
	switch {
	case a.Status == job.StatusCompleted && a.Result != nil:
		c.JSON(http.StatusOK, gin.H{"id": a.ID, "status": a.Status, "result": a.Result})
	case a.Degraded:
		c.Header("Retry-After", strconv.Itoa(ceilSeconds(a.RetryAfter)))
		c.JSON(http.StatusAccepted, gin.H{"id": a.ID, "status": "service_degraded", "message": a.Message,
			"retry_after_seconds": ceilSeconds(a.RetryAfter), "queue_position": a.Position,
			"suggestion": progress.DegradedSuggestion(lang)})
	default:
		body := gin.H{"id": a.ID, "status": a.Status, "queue_position": a.Position,
			"estimated_wait_seconds": progress.WaitSeconds(a.ETA), "estimated_wait_ms": a.ETA.Milliseconds(),
			"message": a.Message}
		if a.CoalescedInto != "" {
			body["coalesced"] = true
		}
		c.JSON(http.StatusAccepted, body)
	}
}

// view is GET /v1/requests/{id}.
type view struct {
	ID                   string            `json:"id"`
	Status               job.Status        `json:"status"`
	Priority             priority.Priority `json:"priority"`
	CreatedAt            time.Time         `json:"created_at"`
	QueuePosition        int               `json:"queue_position,omitempty"`
	EstimatedWaitSeconds *int              `json:"estimated_wait_seconds,omitempty"`
	EstimatedWaitMS      *int64            `json:"estimated_wait_ms,omitempty"`
	RetryAt              *time.Time        `json:"retry_at,omitempty"`
	Attempts             int               `json:"attempts"`
	Result               *job.Result       `json:"result,omitempty"`
	Error                string            `json:"error,omitempty"`
}

// lookup finds a tenant's request, following a coalesced request to the
// one it joined. Another tenant's request is "not found": its existence is
// not revealed.
func (s *Server) lookup(c *gin.Context) (own *job.Record, effective *job.Record, ok bool) {
	id := c.Param("id")
	c.Set(ctxRequestID, id)
	rec, err := s.d.Jobs.Get(c.Request.Context(), id)
	if errors.Is(err, job.ErrNotFound) {
		return nil, nil, false
	}
	if err != nil {
		apiError(c, http.StatusServiceUnavailable, "unavailable", "", "request store unavailable")
		c.Abort()
		return nil, nil, false
	}
	if rec.Job.Tenant != tenantOf(c).Name {
		return nil, nil, false
	}
	eff := rec
	if leader := rec.State.CoalescedInto; leader != "" && !rec.Status.Terminal() {
		// Follow the leader while it runs and when its ending is ours too;
		// a leader cancelled or expired for its own reason leaves this
		// request queued for a call of its own (the sweep enqueues it).
		if l, err := s.d.Jobs.Get(c.Request.Context(), leader); err == nil && (!l.Status.Terminal() || l.SharedEnding()) {
			eff = l
		}
	}
	return rec, eff, true
}

func (s *Server) get(c *gin.Context) {
	own, rec, ok := s.lookup(c)
	if c.IsAborted() {
		return
	}
	if !ok {
		s.getFromHistory(c)
		return
	}
	v := view{ID: own.Job.ID, Status: rec.Status, Priority: own.Job.Priority, CreatedAt: own.Job.CreatedAt,
		Attempts: rec.State.Attempts, Result: job.ResultOf(rec.State), Error: rec.Reason}
	if own != rec && v.Result != nil {
		v.Result.Cached = job.CachedCoalesced
	}
	if own.Status == job.StatusCancelled {
		v.Status, v.Error, v.Result = own.Status, own.Reason, nil
	}
	if !rec.State.RetryAt.IsZero() && rec.Status == job.StatusWaiting {
		v.RetryAt = &rec.State.RetryAt
	}
	if rec.Status == job.StatusQueued {
		if sp, err := s.d.Queue.SpotOf(c.Request.Context(), rec.Job.ID); err == nil && sp.Position > 0 {
			secs, ms := progress.WaitSeconds(sp.ETA), sp.ETA.Milliseconds()
			v.QueuePosition, v.EstimatedWaitSeconds, v.EstimatedWaitMS = sp.Position, &secs, &ms
		}
	}
	c.JSON(http.StatusOK, v)
}

func (s *Server) getFromHistory(c *gin.Context) {
	id := c.Param("id")
	if s.d.History == nil {
		apiError(c, http.StatusNotFound, "not_found", "id", "no request "+id)
		return
	}
	row, err := s.d.History.Get(c.Request.Context(), id)
	if err != nil || row.Tenant != tenantOf(c).Name {
		if err != nil && !errors.Is(err, history.ErrNotFound) {
			s.d.Logger.Warn("history lookup", "request_id", id, "err", err)
		}
		apiError(c, http.StatusNotFound, "not_found", "id", "no request "+id)
		return
	}
	v := view{ID: row.ID, Status: row.Status, Priority: row.Priority, CreatedAt: row.CreatedAt, Error: row.Error}
	if !row.Status.Terminal() {
		// History saw it accepted, but its live record, which is stored
		// first and kept past its deadline, is gone: Redis lost it and
		// nothing will run it (or, once the record expired, history never
		// got its ending: the outbox was full). Never "queued" for ever.
		v.Status, v.Error = job.StatusFailed, job.LostReason
	}
	if row.Response != nil {
		st := job.State{Result: row.Response, ServedRoute: row.ServedRoute, Cached: row.Cached}
		v.Result = job.ResultOf(st)
	}
	c.JSON(http.StatusOK, v)
}

func (s *Server) cancel(c *gin.Context) {
	own, _, ok := s.lookup(c)
	if c.IsAborted() {
		return
	}
	if !ok {
		apiError(c, http.StatusNotFound, "not_found", "id", "no request "+c.Param("id"))
		return
	}
	err := s.d.Intake.Cancel(c.Request.Context(), own)
	if errors.Is(err, finish.ErrEnded) {
		apiError(c, http.StatusConflict, "already_finished", "id", "the request has already ended")
		return
	}
	if err != nil {
		apiError(c, http.StatusServiceUnavailable, "unavailable", "", "request store unavailable")
		return
	}
	c.JSON(http.StatusOK, gin.H{"id": own.Job.ID, "status": job.StatusCancelled})
}
