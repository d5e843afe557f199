package service

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/alert"
	"bulwark/pkg/cache"
	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
)

// cachedAnswer is what the semantic cache stores for a request.
type cachedAnswer struct {
	Route    llm.Route     `json:"route"`
	Response *llm.Response `json:"response"`
}

// cacheAdapter is layer 1 as intake and the worker see it.
type cacheAdapter struct {
	c *cache.Cache
	m *metrics.Metrics
}

func cacheKey(j *job.Job) cache.Key {
	ctx, prompt := splitPrompt(&j.Request)
	return cache.Key{Tenant: j.Tenant, Tier: j.Route.String(), Layer: j.Layer, ToolResultsHash: j.ToolResultsHash,
		CaseID: j.CaseID, Context: ctx, Prompt: prompt}
}

// splitPrompt separates what is embedded (the last user turn: the
// question) from its context (system prompt, tool definitions, earlier
// turns), which only scopes the entry. Embedding the context too would
// let a long shared system prompt make unrelated questions look alike
// (two different questions under a 1,500-character system prompt score
// 0.997): the context must match exactly, the question closely.
func splitPrompt(r *llm.Request) (context, question string) {
	var b strings.Builder
	b.WriteString("system: " + r.System + "\n")
	// Every parameter that changes the answer scopes it: a request with a
	// smaller max_tokens, another temperature, stop sequence or tool choice
	// must not be handed another's answer (by the cache or by coalescing).
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

// Key implements intake.Cache.
func (a cacheAdapter) Key(j *job.Job) string {
	k := cacheKey(j)
	return a.c.Scope(k) + ":" + cache.PromptHash(cache.Normalise(k.Prompt))
}

// Lookup implements intake.Cache. The cache embeds the question only after
// an exact miss; the vector is kept on the job for the write after the
// provider answers, so a request is embedded at most once.
func (a cacheAdapter) Lookup(ctx context.Context, j *job.Job) (intake.Hit, error) {
	h, err := a.c.Lookup(ctx, cacheKey(j), j.Embedding)
	if h.Embedding != nil {
		j.Embedding = h.Embedding
	}
	return a.hit(h, err)
}

// LookupExact implements intake.Cache: the exact entry only.
func (a cacheAdapter) LookupExact(ctx context.Context, j *job.Job) (intake.Hit, error) {
	h, err := a.c.LookupExact(ctx, cacheKey(j))
	return a.hit(h, err)
}

// hit turns the cache's answer into intake's.
func (a cacheAdapter) hit(h cache.Hit, err error) (intake.Hit, error) {
	if err != nil {
		a.m.CacheUnavailable.Inc()
		return intake.Hit{}, err
	}
	if h.Kind == cache.KindNone {
		return intake.Hit{Kind: "none"}, nil
	}
	var ans cachedAnswer
	if err := json.Unmarshal(h.Response, &ans); err != nil || ans.Response == nil {
		return intake.Hit{Kind: "none"}, nil
	}
	return intake.Hit{Kind: string(h.Kind), Similarity: h.Similarity, Age: h.Age, Response: ans.Response, Route: ans.Route}, nil
}

// Store writes a final answer (dispatch.Cache). Only complete answers of
// requests that allow it are cached: never errors, and not a truncated
// (max_tokens) answer, which is partial.
func (a cacheAdapter) Store(ctx context.Context, rec *job.Record) error {
	if !rec.Job.CacheWrite || rec.Job.CacheKey == "" {
		return nil
	}
	st := rec.State
	if st.Result == nil || st.ServedRoute == nil || st.Result.StopReason == llm.StopMaxTokens {
		return nil
	}
	body, err := json.Marshal(cachedAnswer{Route: *st.ServedRoute, Response: st.Result})
	if err != nil {
		return err
	}
	return a.c.Store(ctx, cacheKey(&rec.Job), rec.Job.Embedding, body)
}

// coalescer claims in-flight identical requests in Redis, so identical
// requests on any API process attach to the first.
type coalescer struct {
	rdb    *redis.Client
	prefix string
}

func (c coalescer) key(k string) string { return c.prefix + "inflight:" + k }

// Claim implements intake.Coalescer.
func (c coalescer) Claim(ctx context.Context, key, id string, ttl time.Duration) (string, error) {
	leader, err := c.rdb.SetArgs(ctx, c.key(key), id, redis.SetArgs{Mode: "NX", Get: true, TTL: ttl}).Result()
	if err == redis.Nil {
		return id, nil
	}
	if err != nil {
		return "", fmt.Errorf("coalesce: claim: %w", err)
	}
	return leader, nil
}

// releaseScript deletes KEYS[1] only if it still names ARGV[1].
var releaseScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0`)

// Release implements intake.Coalescer.
func (c coalescer) Release(ctx context.Context, key, id string) error {
	if err := releaseScript.Run(ctx, c.rdb, []string{c.key(key)}, id).Err(); err != nil {
		return fmt.Errorf("coalesce: release: %w", err)
	}
	return nil
}

func (b *Base) price(r llm.Route) metrics.Price {
	p := b.Cfg.Prices[r.String()]
	return metrics.Price{InputPerMTok: p.Input, OutputPerMTok: p.Output}
}

// tenantLimiter bounds a tenant's submissions with GCRA (go-redis/redis_rate).
type tenantLimiter struct {
	l      *redis_rate.Limiter
	prefix string
}

func (t tenantLimiter) Allow(ctx context.Context, tenant string, perMinute int) (bool, time.Duration, error) {
	res, err := t.l.Allow(ctx, t.prefix+"tenant:"+tenant, redis_rate.PerMinute(perMinute))
	if err != nil {
		return false, 0, fmt.Errorf("tenant limit: %w", err)
	}
	return res.Allowed > 0, res.RetryAfter, nil
}

// readState gathers the shared state gauges for a scrape.
func (b *Base) readState(ctx context.Context) (metrics.State, error) {
	var s metrics.State
	depth, err := b.Queue.Depth(ctx)
	if err != nil {
		return s, err
	}
	used, err := b.Slots.InUse(ctx)
	if err != nil {
		return s, err
	}
	avail, err := b.Pool.Available(ctx)
	if err != nil {
		return s, err
	}
	brs, err := b.Breakers.List(ctx)
	if err != nil {
		return s, err
	}
	oldest, err := b.Queue.OldestPending(ctx)
	if err != nil {
		return s, err
	}
	backlog, err := b.History.Backlog(ctx)
	if err != nil {
		return s, err
	}
	s.HistoryBacklog = int(backlog)
	s.QueueDepth, s.SlotsInUse, s.OldestWaitSeconds = map[string]int{}, map[string]int{}, map[string]float64{}
	for _, p := range priority.All {
		s.QueueDepth[p.String()] = depth[p]
		s.SlotsInUse[p.String()] = used[p]
		s.OldestWaitSeconds[p.String()] = 0
		if id, ok := oldest[p]; ok {
			if rec, err := b.Jobs.Get(ctx, id); err == nil {
				s.OldestWaitSeconds[p.String()] = time.Since(rec.Job.CreatedAt).Seconds()
			}
		}
	}
	s.KeysAvailable, s.KeysTotal = map[string]int{}, map[string]int{}
	for r, n := range b.Pool.Routes() {
		s.KeysTotal[r.String()] = n
		s.KeysAvailable[r.String()] = avail[r]
	}
	s.BreakerState = map[string]int{}
	for _, st := range brs {
		v, _ := metrics.BreakerStateValue(string(st.State))
		s.BreakerState[st.Name] = v
	}
	return s, nil
}

// keyAdmin is the key pool as the admin endpoints see it: re-enabling a
// key is announced like its disabling was.
type keyAdmin struct{ b *Base }

func (k keyAdmin) Snapshot(ctx context.Context) ([]keypool.KeyState, error) {
	return k.b.Pool.Snapshot(ctx)
}

func (k keyAdmin) Disable(ctx context.Context, keyID, reason string) error {
	return k.b.Pool.Disable(ctx, keyID, reason)
}

func (k keyAdmin) Enable(ctx context.Context, keyID string) error {
	if err := k.b.Pool.Enable(ctx, keyID); err != nil {
		return err
	}
	ev := alert.Event{Kind: alert.KindKeyEnabled, Subject: keyID, Summary: fmt.Sprintf("key %s re-enabled by an operator", keyID)}
	if err := k.b.Notifier.Notify(context.WithoutCancel(ctx), ev); err != nil {
		k.b.Logger.Warn("alert: key enabled", "key_id", keyID, "err", err)
	}
	return nil
}

// promoter moves a shared call to a more urgent priority: its slot wait,
// and its task while that is still pending in a less urgent queue (it may
// have been promoted once already, so each is tried).
type promoter struct{ b *Base }

func (pr promoter) Promote(ctx context.Context, rec *job.Record, p priority.Priority) error {
	if err := pr.b.Slots.Promote(ctx, rec.Job.ID, p, pr.b.Cfg.Queue.MaxWait); err != nil {
		return err
	}
	for from := rec.Job.Priority; from > p; from-- {
		moved, err := pr.b.Queue.Promote(ctx, rec.Job.ID, from, p)
		if err != nil || moved {
			return err
		}
	}
	return nil
}
