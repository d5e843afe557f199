// Package job holds the live record of every request Bulwark accepted: what
// was asked (Job), where it stands (State), and its event stream. All of it
// lives in Redis, so any API process can answer for a request any worker is
// running, and a PostgreSQL outage loses nothing.
//
// Redis layout (prefix p, default "bulwark:"):
//
//	p job:{id}     hash: "job" (Job JSON, immutable), "status", "state" (State JSON, written by the worker),
//	               "reason" and "code" (why it ended, written with terminal statuses),
//	               "detail" (what happened, for operators only)
//	p live         sorted set: id → creation (Unix ms) of every request not ended yet,
//	               so a sweep can find one whose task was lost
//	p ev:{id}      stream of events (field "e": Event JSON); the stream ID is the SSE event id
//	p events       pub/sub channel: "{id} {streamID} {event JSON}" for every event
//	p idem:{tenant}:{key}  idempotency key → job id
//	p join:{join key}      a compat call's Job.JoinKey → its job id, until its answer is delivered
//	p bytes-of:{tenant}, p expiry-of:{tenant}  what the tenant's requests hold, against its budget (budget.go)
//
// Every status change is one Lua script that checks the current status,
// writes the new one, appends the event and publishes it, so a cancelled or
// finished request can never be overwritten and no event is lost between
// the write and the notification.
package job

import (
	"strconv"
	"time"

	"bulwark/pkg/compactjson"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

// Status of a request.
type Status string

const (
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusWaiting   Status = "waiting" // every route exhausted: re-enqueued with a delay
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// Code says, in a closed vocabulary, why a request failed or was
// cancelled. HTTP answers and metrics switch on it; Record.Reason is the
// text for the tenant, Record.Detail for operators.
type Code string

const (
	// CodeDeadline: the request did not start (or could not get capacity)
	// within queue_max_wait.
	CodeDeadline Code = "deadline_exceeded"
	// CodeProviderError: the provider refused the request itself (a 4xx
	// that is the request's fault, a prompt larger than any key's TPM).
	CodeProviderError Code = "provider_error"
	// CodeProviderUnavailable: transient provider failures outlasted the
	// retries.
	CodeProviderUnavailable Code = "provider_unavailable"
	// CodeNoRoute: no key is configured for the route or its fallback.
	CodeNoRoute Code = "no_route"
	// CodeCancelled: the caller cancelled it.
	CodeCancelled Code = "cancelled"
	// CodeLost: Bulwark lost the request's task (a crash between storing
	// and enqueueing, a task archived after its retries) and could not
	// run it again.
	CodeLost Code = "lost"
	// CodeInterrupted: the provider's answer broke off after it had begun
	// to stream to the caller (a mid-stream error, a worker that died).
	// It is not tried again: a second call would write a different
	// answer after the part the caller already has.
	CodeInterrupted Code = "stream_interrupted"
)

// LostReason is what a caller and history read about a request whose live
// record is gone with no ending recorded: Redis lost it (a failover, a
// restart without persistence) and nothing will run it.
const LostReason = "lost: the request's live record is gone and no ending was recorded (Redis lost it in a failover or a restart); submit it again if you still need it"

// Terminal reports whether s is final.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Job is what was asked. It never changes after submission.
type Job struct {
	ID       string            `json:"id"`
	Tenant   string            `json:"tenant"`
	Priority priority.Priority `json:"priority"`
	Route    llm.Route         `json:"route"`
	Request  llm.Request       `json:"request"`
	CaseID   string            `json:"case_id,omitempty"`
	Layer    string            `json:"cache_layer,omitempty"`
	// ToolResultsHash scopes cache entries to the tool results they saw.
	ToolResultsHash string            `json:"tool_results_hash,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	// CacheRead and CacheWrite are false when the caller bypasses the cache.
	CacheRead  bool `json:"cache_read"`
	CacheWrite bool `json:"cache_write"`
	// NoCompress is set when the caller opted out of prompt compression
	// (which runs only where the configuration turns it on).
	NoCompress bool `json:"no_compress,omitempty"`
	// CacheKey identifies identical requests (scope + prompt hash) for
	// coalescing and the cache write; empty when the cache is off.
	CacheKey string `json:"cache_key,omitempty"`
	// Embedding of the prompt, computed once at the cache lookup and
	// reused for the cache write.
	Embedding []float32 `json:"embedding,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Deadline is when a request that has not started fails
	// (created_at + queue_max_wait).
	Deadline time.Time `json:"deadline"`
	// KeepEnded is how long the record stays once ended (Change.Keep);
	// 0: the store's result TTL. Intake sets EndedEventsTTL for a caller
	// that takes the answer in its response without an Idempotency-Key (a
	// compat call): nothing will look for the record but by id, which
	// history answers.
	KeepEnded time.Duration `json:"keep_ended,omitempty"`
	// IdempotencyKey is the caller's Idempotency-Key ("" for none): the
	// key names the request until its record goes, and no longer
	// (Change.Idem).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Stream asks the worker to stream the answer: its deltas become
	// EventDelta events as the provider writes them (a streaming compat
	// call, or stream on the async API).
	Stream bool `json:"stream,omitempty"`
	// JoinKey names what the request asked, for a compat call without an
	// Idempotency-Key (intake computes it from the tenant and the whole
	// request, cache settings included): a resend of it — an SDK's
	// automatic retry, or its own timeout and retry — arriving before the
	// answer reached a caller joins this request instead of becoming a
	// request of its own (Store.Joinable, Store.Unjoin). "" for the others.
	JoinKey string `json:"join_key,omitempty"`
}

// Cached says where a request's answer came from: its own provider call
// (CachedNone), the semantic cache (CachedExact, CachedSemantic), or an
// identical request in flight it joined (CachedCoalesced). The values are
// those of the API's "cached" field, the X-Bulwark-Cache header, the
// requests.cached column and the cache-lookup metric's result label.
type Cached string

// Where an answer came from.
const (
	CachedNone      Cached = "none"
	CachedExact     Cached = "exact"
	CachedSemantic  Cached = "semantic"
	CachedCoalesced Cached = "coalesced"
)

// OrNone is c, or CachedNone for a request not answered yet ("").
func (c Cached) OrNone() Cached {
	if c == "" {
		return CachedNone
	}
	return c
}

// FromCache reports whether the answer came from the semantic cache.
func (c Cached) FromCache() bool { return c == CachedExact || c == CachedSemantic }

// Shared reports whether the answer was not this request's own provider
// call (a cache hit or a coalesced answer): it costs nothing.
func (c Cached) Shared() bool { return c.OrNone() != CachedNone }

// State is where a request stands. The worker owns it.
type State struct {
	Attempts    int           `json:"attempts"`
	ServedRoute *llm.Route    `json:"served_route,omitempty"`
	KeyID       string        `json:"key_id,omitempty"`
	Cached      Cached        `json:"cached,omitempty"`
	Similarity  float64       `json:"similarity,omitempty"`
	CacheAge    time.Duration `json:"cache_age,omitempty"`
	// TokensSaved is what prompt compression took off the request's
	// estimated input tokens (0 when it did not run).
	TokensSaved int           `json:"tokens_saved,omitempty"`
	Result      *llm.Response `json:"result,omitempty"`
	StartedAt   time.Time     `json:"started_at,omitzero"`
	FinishedAt  time.Time     `json:"finished_at,omitzero"`
	// RetryAt is when a waiting request will be tried again.
	RetryAt time.Time `json:"retry_at,omitzero"`
	// CoalescedInto is the id of the identical request this one attached to.
	CoalescedInto string `json:"coalesced_into,omitempty"`
	// Streamed is set with the first delta of a streamed answer: from
	// then on the caller holds part of an answer, and the request is not
	// called again (CodeInterrupted) should its call break off.
	Streamed bool `json:"streamed,omitempty"`
	// MaxTokensClamped is set when the call that answered was sent with
	// fewer max_tokens than the request asked: the route that answered (a
	// fallback) has a smaller model. The compat endpoints say so in
	// X-Bulwark-Max-Tokens-Clamped, the async API in the result.
	MaxTokensClamped *Clamp `json:"max_tokens_clamped,omitempty"`
}

// Clamp is a max_tokens lowered for the route that answered: From the
// request's, To its model's maximum.
type Clamp struct {
	From int `json:"from"`
	To   int `json:"to"`
}

// String returns "from->to", the form of X-Bulwark-Max-Tokens-Clamped.
func (c Clamp) String() string { return strconv.Itoa(c.From) + "->" + strconv.Itoa(c.To) }

// Record is a request's whole live record.
type Record struct {
	Job    Job
	Status Status
	State  State
	// Code and Reason say why a request failed or was cancelled: Code for
	// programs, Reason for the tenant. Reason is the fixed text of Code
	// (pkg/finish writes it) and never quotes a provider or an error, so
	// every path that shows it (GET, events, compat error bodies, history)
	// is safe to show.
	Code   Code
	Reason string
	// Detail is what happened, for operators: the provider's answer or
	// the error, redacted (provider.Redact). No tenant-facing view reads
	// it; operators find it in the worker's log line for the failure and
	// in the record's "detail" field while the record lives.
	Detail string
}

// EventType names an event. Each status change has one; "queued" also
// reports position changes.
type EventType string

const (
	EventQueued    EventType = "queued"
	EventStarted   EventType = "started"
	EventRetrying  EventType = "retrying"
	EventFallback  EventType = "fallback"
	EventWaiting   EventType = "waiting"
	EventCompleted EventType = "completed"
	EventFailed    EventType = "failed"
	EventCancelled EventType = "cancelled"
	// EventDelta carries pieces of an answer being streamed (Job.Stream):
	// the provider's deltas as they arrived, a few at a time.
	EventDelta EventType = "delta"
)

// Event is one step of a request's life, as streamed to the caller.
type Event struct {
	// ID is the Redis stream ID, also the SSE event id; empty for
	// ephemeral position updates that are not stored.
	ID        string    `json:"-"`
	Type      EventType `json:"type"`
	RequestID string    `json:"request_id"`
	Status    Status    `json:"status"`
	At        time.Time `json:"at"`
	// Queue position and ETA (queued, degraded).
	QueuePosition        int `json:"queue_position,omitempty"`
	EstimatedWaitSeconds int `json:"estimated_wait_seconds,omitempty"`
	// EstimatedWaitMS is the same estimate to the millisecond.
	EstimatedWaitMS int64  `json:"estimated_wait_ms,omitempty"`
	Message         string `json:"message,omitempty"`
	// Code says why a request failed or was cancelled (failed, cancelled).
	Code Code `json:"code,omitempty"`
	// RetryAfterSeconds (waiting, degraded).
	RetryAfterSeconds int `json:"retry_after_seconds,omitempty"`
	// Provider and tier involved (started, fallback, completed).
	Provider llm.Provider `json:"provider,omitempty"`
	Tier     string       `json:"model_tier,omitempty"`
	From     string       `json:"from,omitempty"` // fallback: the exhausted route
	Attempt  int          `json:"attempt,omitempty"`
	Error    string       `json:"error,omitempty"`
	// Result on completion.
	Result *Result `json:"result,omitempty"`
	// Delta holds the answer's next pieces (delta), in order.
	Delta []llm.Delta `json:"delta,omitempty"`
}

// Result is the answer as the caller sees it.
type Result struct {
	Content    string       `json:"content"`
	Blocks     []llm.Block  `json:"blocks,omitempty"`
	StopReason string       `json:"stop_reason,omitempty"`
	Provider   llm.Provider `json:"provider"`
	Tier       string       `json:"model_tier"`
	Model      string       `json:"model,omitempty"`
	Usage      llm.Usage    `json:"usage"`
	Cached     Cached       `json:"cached"`
	Similarity float64      `json:"similarity,omitempty"`
	// CacheAgeSeconds is the age of the cache entry that answered.
	CacheAgeSeconds float64 `json:"cache_age_seconds,omitempty"`
	// MaxTokensClamped is set when the answer's call was sent with fewer
	// max_tokens than asked (State.MaxTokensClamped).
	MaxTokensClamped *Clamp `json:"max_tokens_clamped,omitempty"`
}

// ResultOf builds the caller's view of a finished request.
func ResultOf(st State) *Result {
	if st.Result == nil {
		return nil
	}
	r := &Result{
		Content:          st.Result.Text(),
		StopReason:       string(st.Result.StopReason),
		Model:            st.Result.Model,
		Usage:            st.Result.Usage,
		Cached:           st.Cached.OrNone(),
		Similarity:       st.Similarity,
		CacheAgeSeconds:  st.CacheAge.Seconds(),
		MaxTokensClamped: st.MaxTokensClamped,
	}
	for _, b := range st.Result.Content {
		if b.Type != llm.BlockText {
			r.Blocks = st.Result.Content
			break
		}
	}
	if st.ServedRoute != nil {
		r.Provider, r.Tier = st.ServedRoute.Provider, st.ServedRoute.Tier
	}
	return r
}

// mustJSON is v as the store keeps it: compact, so that a stored request
// costs what its content does (pkg/compactjson).
func mustJSON(v any) string {
	b, err := compactjson.Marshal(v)
	if err != nil {
		panic(err) // only our own plain structs are marshalled here
	}
	return string(b)
}

// sharedCode reports whether a failure with code c is the request's own,
// so that identical requests coalesced with it fail the same way: the
// provider refused the request itself. A deadline, a cancellation or a lost
// task belong to one caller; the others get a call of their own.
func sharedCode(c Code) bool {
	return c == CodeProviderError || c == CodeProviderUnavailable || c == CodeNoRoute || c == ""
}

// SharedEnding reports whether the ending of r, a request others were
// coalesced with, is theirs too: its answer, or a failure of the request
// itself.
func (r *Record) SharedEnding() bool {
	switch r.Status {
	case StatusCompleted:
		return r.State.Result != nil
	case StatusFailed:
		return sharedCode(r.Code)
	}
	return false
}

// SharedEnding reports whether e, the terminal event of a request others
// were coalesced with, ends them too (see Record.SharedEnding).
func (e Event) SharedEnding() bool {
	switch e.Type {
	case EventCompleted:
		return true
	case EventFailed:
		return sharedCode(e.Code)
	}
	return false
}
