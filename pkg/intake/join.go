package intake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
)

// A compat call is answered in its response and carries no id the caller
// could ask for again, so a caller that stopped waiting resends it: the
// SDKs retry a 429, a 5xx and a connection cut twice by default, and their
// own per-request timeout cuts a call too. Each resend used to be a new
// request, with a new id and a new place at the back of the line; with
// the cache bypassed, a new provider call. A resend that arrives while the
// call it repeats has not ended now joins it (job.Job.JoinKey): it gets
// that request's id, place and answer, and nothing new is stored, queued
// or called. The window runs from the original's acceptance until its
// answer reached a caller (the compat endpoint unjoins it then): a retry
// whose caller never got the answer gets it even after the end, for as
// long as the ended record is kept (5 minutes, job.EndedEventsTTL), while
// a deliberate repeat after an answer (another sample with the cache
// bypassed) is a new request.
//
// What makes two calls "the same" is everything that shapes the answer or
// its handling: the tenant and the whole normalised request (pkg/llm's
// form, so both dialects agree, with the default max_tokens applied), its
// route, priority, case, cache layer, tool-results scope, metadata and
// cache and compression settings. An SDK's retry repeats all of them; two
// callers of one tenant who send exactly the same call at the same time
// share one answer, as coalescing would give them anyway. A call with an
// Idempotency-Key is found by its key instead (and kept longer).

// joinIdentity is what a join key hashes; its JSON is deterministic (a
// struct, and map keys sorted by encoding/json).
type joinIdentity struct {
	Version         string            `json:"v"`
	Tenant          string            `json:"tenant"`
	Priority        priority.Priority `json:"priority"`
	Route           llm.Route         `json:"route"`
	Request         llm.Request       `json:"request"`
	CaseID          string            `json:"case_id"`
	Layer           string            `json:"layer"`
	ToolResultsHash string            `json:"tool_results_hash"`
	Metadata        map[string]string `json:"metadata"`
	CacheRead       bool              `json:"cache_read"`
	CacheWrite      bool              `json:"cache_write"`
	NoCompress      bool              `json:"no_compress"`
}

// joinKey returns j's join key: 32 hex digits (128 bits) of the SHA-256 of
// its identity.
func joinKey(j *job.Job) string {
	h := sha256.New()
	_ = json.NewEncoder(h).Encode(joinIdentity{Version: "bulwark.join.v1", Tenant: j.Tenant, Priority: j.Priority,
		Route: j.Route, Request: j.Request, CaseID: j.CaseID, Layer: j.Layer, ToolResultsHash: j.ToolResultsHash,
		Metadata: j.Metadata, CacheRead: j.CacheRead, CacheWrite: j.CacheWrite, NoCompress: j.NoCompress})
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// RunAlone gives request id, which joined an identical request that then
// ended for a reason of its own (its caller cancelled it, its deadline
// passed), a call of its own at once: what the sweep would do once the
// request is OrphanAge old, so its caller does not wait out that age. A
// request that ended, or follows no other, is left as it is; the sweep
// doing the same meanwhile is harmless (the same state, one task).
func (in *Intake) RunAlone(ctx context.Context, id string) error {
	rec, err := in.jobs.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("intake: run %s alone: %w", id, err)
	}
	if rec.Status.Terminal() || rec.State.CoalescedInto == "" {
		return nil
	}
	st := rec.State
	st.CoalescedInto, st.Cached = "", ""
	if _, err := in.jobs.Apply(ctx, id, job.Change{State: &st, Tenant: rec.Job.Tenant}); err != nil {
		if errors.Is(err, job.ErrTerminal) {
			return nil
		}
		return fmt.Errorf("intake: run %s alone: %w", id, err)
	}
	if err := in.queue.Enqueue(ctx, id, rec.Job.Priority, 0); err != nil && !queue.Duplicate(err) {
		return fmt.Errorf("intake: run %s alone: %w", id, err)
	}
	return nil
}
