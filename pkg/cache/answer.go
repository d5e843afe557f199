package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
)

// Answer is what the cache keeps for a request: the provider's answer and
// the route that gave it (which may be the fallback's).
type Answer struct {
	Route    llm.Route     `json:"route"`
	Response *llm.Response `json:"response"`
}

// Found is the outcome of looking up a request's answer.
type Found struct {
	// Kind is job.CachedExact or job.CachedSemantic on a hit, else
	// job.CachedNone.
	Kind       job.Cached
	Similarity float64
	Age        time.Duration
	Answer     Answer
	// Embedding is the question's vector when the lookup computed one (an
	// exact miss), hit or miss: the caller keeps it in job.Job.Embedding
	// for StoreAnswer, so a request is embedded at most once.
	Embedding []float32
}

// KeyOf returns the cache key of a request. What is embedded is the last
// user turn (the question); everything else that changes the answer —
// system prompt, tool definitions, earlier turns and the sampling
// parameters — is its Context, which must match exactly. Embedding the
// context too would let a long shared system prompt make unrelated
// questions look alike (two different questions under a 1,500-character
// system prompt score 0.997).
func KeyOf(j *job.Job) Key {
	ctx, question := splitPrompt(&j.Request)
	return Key{Tenant: j.Tenant, Tier: j.Route.String(), Layer: j.Layer, ToolResultsHash: j.ToolResultsHash,
		CaseID: j.CaseID, Context: ctx, Prompt: question}
}

// Ref returns the name of a request's exact entry: its scope and prompt
// hash. Identical requests, and only they, share it, so it is also the
// key under which requests in flight are coalesced (job.Job.CacheKey).
func (c *Cache) Ref(j *job.Job) string {
	k := KeyOf(j)
	return c.Scope(k) + ":" + PromptHash(Normalise(k.Prompt))
}

// AnswerFor looks up j's answer, exactly then by similarity, reusing
// j.Embedding when it has one. The question is embedded only after an
// exact miss; the vector comes back in Found.Embedding, hit or miss. j is
// not changed.
func (c *Cache) AnswerFor(ctx context.Context, j *job.Job) (Found, error) {
	h, err := c.Lookup(ctx, KeyOf(j), j.Embedding)
	f, ferr := found(h, err)
	f.Embedding = h.Embedding
	return f, ferr
}

// ExactAnswerFor looks up j's exact entry only: one indexed query.
func (c *Cache) ExactAnswerFor(ctx context.Context, j *job.Job) (Found, error) {
	return found(c.LookupExact(ctx, KeyOf(j)))
}

// found decodes a hit's stored Answer; one that does not decode is a miss.
func found(h Hit, err error) (Found, error) {
	if err != nil || h.Kind == job.CachedNone {
		return Found{Kind: job.CachedNone}, err
	}
	var a Answer
	if err := json.Unmarshal(h.Response, &a); err != nil || a.Response == nil {
		return Found{Kind: job.CachedNone}, nil
	}
	return Found{Kind: h.Kind, Similarity: h.Similarity, Age: h.Age, Answer: a}, nil
}

// StoreAnswer keeps the final answer of rec when the request allows it,
// then calls then (which may be nil). Only complete answers are kept:
// never errors, and not a truncated (max_tokens) answer, which is partial.
// While the answer writer runs (Start), the entry is written in its next
// batch and then runs after that write; otherwise now. An error is
// returned only for an answer that cannot be stored (then has run).
func (c *Cache) StoreAnswer(ctx context.Context, rec *job.Record, then func()) error {
	if then == nil {
		then = func() {}
	}
	if !rec.Job.CacheWrite || rec.Job.CacheKey == "" {
		then()
		return nil
	}
	st := rec.State
	if st.Result == nil || st.ServedRoute == nil || st.Result.StopReason == llm.StopMaxTokens {
		then()
		return nil
	}
	body, err := json.Marshal(Answer{Route: *st.ServedRoute, Response: st.Result})
	if err != nil {
		then()
		return fmt.Errorf("cache: encode answer of %s: %w", rec.Job.ID, err)
	}
	args, err := c.storeArgs(ctx, KeyOf(&rec.Job), rec.Job.Embedding, body)
	if err != nil {
		then()
		return err
	}
	if c.queueAnswer(pendingAnswer{args: args, then: then}) {
		return nil
	}
	defer then()
	qctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	defer cancel()
	return c.insert(qctx, args)
}

// splitPrompt separates what is embedded (the last turn: the question)
// from its context, which only scopes the entry. Every parameter that
// changes the answer is part of the context: a request with a smaller
// max_tokens, another temperature, stop sequence or tool choice must not
// be handed another's answer (by the cache or by coalescing).
func splitPrompt(r *llm.Request) (context, question string) {
	var b strings.Builder
	b.WriteString("system: " + r.System + "\n")
	fmt.Fprintf(&b, "max_tokens: %d\n", r.MaxTokens)
	if r.Temperature != nil {
		fmt.Fprintf(&b, "temperature: %g\n", *r.Temperature)
	}
	if len(r.StopSequences) > 0 {
		fmt.Fprintf(&b, "stop: %q\n", r.StopSequences)
	}
	if r.ToolChoice != nil {
		fmt.Fprintf(&b, "tool_choice: %+v\n", *r.ToolChoice)
	}
	for _, t := range r.Tools {
		fmt.Fprintf(&b, "tool %s: %s %s\n", t.Name, t.Description, t.InputSchema)
	}
	last := len(r.Messages) - 1
	for i, m := range r.Messages {
		if i == last {
			break
		}
		writeTurn(&b, m)
	}
	var q strings.Builder
	if last >= 0 {
		writeTurn(&q, r.Messages[last])
	}
	return b.String(), q.String()
}

func writeTurn(b *strings.Builder, m llm.Message) {
	for _, bl := range m.Content {
		switch bl.Type {
		case llm.BlockText:
			fmt.Fprintf(b, "%s: %s\n", m.Role, bl.Text)
		case llm.BlockToolUse:
			fmt.Fprintf(b, "%s calls %s %s\n", m.Role, bl.ToolName, bl.Input)
		case llm.BlockToolResult:
			fmt.Fprintf(b, "%s result %s (error=%v): %s\n", m.Role, bl.ToolUseID, bl.IsError, bl.Text)
		}
	}
}
