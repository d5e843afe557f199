package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotFound is returned for an unknown (or expired) request id.
var ErrNotFound = errors.New("job: request not found")

// ErrTerminal is returned when a change is refused because the request has
// already ended.
var ErrTerminal = errors.New("job: request already ended")

// Redis is the narrow client the store needs.
type Redis interface {
	redis.Scripter
	HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd
	HGet(ctx context.Context, key, field string) *redis.StringCmd
	ZRangeByScore(ctx context.Context, key string, opt *redis.ZRangeBy) *redis.StringSliceCmd
	ZRem(ctx context.Context, key string, members ...any) *redis.IntCmd
	XRange(ctx context.Context, stream, start, stop string) *redis.XMessageSliceCmd
	Get(ctx context.Context, key string) *redis.StringCmd
}

// Store reads and writes live request records. It is safe for concurrent use.
type Store struct {
	rdb    Redis
	prefix string
	ttl    time.Duration // kept after a request ends
	budget BudgetFunc    // nil: no tenant has a budget
}

// BudgetFunc returns a tenant's Redis budget in bytes (<= 0: none) and
// what the tenant holds in Redis outside the store (the history outbox),
// which counts against the budget too.
type BudgetFunc func(ctx context.Context, tenant string) (budget, held int64)

// WithBudgets makes each create check its tenant's budget (budget.go).
// Call it before the store is used.
func (s *Store) WithBudgets(f BudgetFunc) *Store {
	s.budget = f
	return s
}

// MaxEvents bounds one request's stream. A request has a handful of
// events, a streamed one also its deltas (at most one event per
// DeltaEvery: 100 s of an answer streamed at full speed); past the bound
// the oldest events go, which only a stream replaying from its start
// would miss.
const MaxEvents = 10000

// DeltaEvery is the least time between two delta events of one request:
// deltas that arrive closer together go out in one event, so a fast
// provider costs at most 100 Redis writes a second per streamed answer
// while a caller sees each delta at most this much later.
const DeltaEvery = 10 * time.Millisecond

// EndedEventsTTL is how long an ended request's event stream is kept (at
// most as long as its record): long enough for a client that lost its
// stream to reconnect with Last-Event-ID and get what it missed. After it,
// a stream opened on the request gets its terminal event rebuilt from the
// record. A stream of three events takes about 4.8 KB of Redis, more than
// the record itself: kept for the record's whole TTL, it was most of what
// an ended request held.
const EndedEventsTTL = 5 * time.Minute

// keep is how long an ending c keeps the record: c.Keep, or the store's
// result TTL.
func (s *Store) keep(c Change) time.Duration {
	if c.Keep > 0 {
		return c.Keep
	}
	return s.ttl
}

// eventsTTL is EndedEventsTTL in seconds, never past keep, the record's.
func eventsTTL(keep time.Duration) int {
	return max(1, int(min(EndedEventsTTL, keep).Seconds()))
}

// NewStore returns a store using keys under prefix ("bulwark:{job}:") that
// keeps finished records for ttl. Its scripts touch several of these keys
// at once: in a Redis Cluster the prefix must carry a hash tag
// (pkg/config/keys.go).
func NewStore(rdb Redis, prefix string, ttl time.Duration) *Store {
	return &Store{rdb: rdb, prefix: prefix, ttl: ttl}
}

func (s *Store) jobKey(id string) string            { return s.prefix + "job:" + id }
func (s *Store) liveKey() string                    { return s.prefix + "live" }
func (s *Store) streamKey(id string) string         { return s.prefix + "ev:" + id }
func (s *Store) tenantLiveKey(tenant string) string { return s.prefix + "live-of:" + tenant }
func (s *Store) idemKey(tenant, key string) string {
	return s.prefix + "idem:" + tenant + ":" + key
}
func (s *Store) joinKey(key string) string { return s.prefix + "join:" + key }

// Channel is the pub/sub channel every event is published on.
func (s *Store) Channel() string { return s.prefix + "events" }

// createScript stores a new job with its first event, unless its tenant
// already has its limit of requests not ended.
//
// KEYS[1] job hash, KEYS[2] event stream, KEYS[3] idempotency key (KEYS[1]
// again for none: a key in the same hash slot, as Redis Cluster requires),
// KEYS[4] live set, KEYS[5] the tenant's live set, KEYS[6] join key
// (Job.JoinKey; KEYS[1] again for none)
// ARGV[1] job JSON, ARGV[2] status, ARGV[3] event JSON, ARGV[4] channel,
// ARGV[5] id, ARGV[6] ttl of the idempotency key and an abandoned record (s),
// ARGV[7] max events, ARGV[8] creation time (Unix ms), ARGV[9] the tenant's
// limit (0: none), ARGV[10] the prompt's embedding ("" none; see encodeVector),
// ARGV[11] terminal status for a request that ends as it is stored ("" none:
// it is queued), ARGV[12] its state JSON, ARGV[13] its event JSON, ARGV[14]
// ttl of the ended record (s), ARGV[15] reason, ARGV[16] code, ARGV[17] detail,
// ARGV[18] ttl of the ended request's event stream (s), ARGV[19] the
// tenant's Redis budget (bytes; 0 none), ARGV[20] what the tenant holds
// outside the store (bytes: the history outbox), ARGV[21] RecordOverhead,
// ARGV[22] StreamOverhead, ARGV[23] EventOverhead; KEYS[7] and KEYS[8] the tenant's budget keys
// (budget.go)
// Reply: {1, streamID of the last event} created; {0, existingID}
// idempotency key or join key already used; {2, count} the tenant is at
// its limit; {3, "used,need,freed at (Unix ms)"} the tenant's budget is
// spent.
var createScript = redis.NewScript(budgetLua + `
if KEYS[3] ~= KEYS[1] then
  local prev = redis.call("GET", KEYS[3])
  if prev then return {0, prev} end
end
if KEYS[6] ~= KEYS[1] then
  local prev = redis.call("GET", KEYS[6])
  if prev then return {0, prev} end
end
local limit = tonumber(ARGV[9])
if limit > 0 then
  -- The tenant's set keeps ids until found ended here: each is dropped
  -- once, so the scan stays about the size of the limit.
  local n = 0
  for _, id in ipairs(redis.call("ZRANGE", KEYS[5], 0, -1)) do
    if redis.call("ZSCORE", KEYS[4], id) then n = n + 1 else redis.call("ZREM", KEYS[5], id) end
  end
  if n >= limit then return {2, tostring(n)} end
end
local now = nowms()
local ended = ARGV[11] ~= ""
local recBytes = cost(#ARGV[1] + #ARGV[10]) + tonumber(ARGV[21])
local evBytes = cost(#ARGV[3]) + tonumber(ARGV[22]) + tonumber(ARGV[23])
if ended then
  recBytes = cost(#ARGV[1] + #ARGV[12] + #ARGV[15] + #ARGV[16] + #ARGV[17]) + tonumber(ARGV[21])
  evBytes = evBytes + cost(#ARGV[13]) + tonumber(ARGV[23])
end
local budget = tonumber(ARGV[19])
-- Release what has expired; past the budget, keep releasing (a tenant
-- back after a quiet hour has a backlog) before refusing.
local used = 0
for _ = 1, 20 do
  local freed = release(KEYS[7], KEYS[8], now, 256)
  used = tonumber(redis.call("HGET", KEYS[7], "=") or "0") + tonumber(ARGV[20])
  if freed < 256 or budget <= 0 or used + recBytes + evBytes <= budget then break end
end
if budget > 0 and used + recBytes + evBytes > budget then
  local first = redis.call("ZRANGE", KEYS[8], 0, 0, "WITHSCORES")
  return {3, used .. "," .. (recBytes + evBytes) .. "," .. (first[2] or "0")}
end
if KEYS[3] ~= KEYS[1] then
  -- Named as long as the record: a request ended as it is stored keeps
  -- its record the ended TTL.
  local ittl = ARGV[6]
  if ARGV[11] ~= "" then ittl = ARGV[14] end
  redis.call("SET", KEYS[3], ARGV[5], "EX", ittl)
end
if KEYS[6] ~= KEYS[1] and ARGV[11] == "" then redis.call("SET", KEYS[6], ARGV[5], "EX", ARGV[6]) end
-- One HSET with every field: queued, or already ended (a cache hit).
local fields = {"job", ARGV[1], "status", ARGV[2], "state", "{}"}
if ARGV[11] ~= "" then fields[4], fields[6] = ARGV[11], ARGV[12] end
for _, f in ipairs({{"emb", ARGV[10]}, {"reason", ARGV[15]}, {"code", ARGV[16]}, {"detail", ARGV[17]}}) do
  if f[2] ~= "" then fields[#fields + 1] = f[1]; fields[#fields + 1] = f[2] end
end
redis.call("HSET", KEYS[1], unpack(fields))
local ttl = ARGV[6]
if ARGV[11] == "" then
  redis.call("ZADD", KEYS[4], ARGV[8], ARGV[5])
  if limit > 0 then
    -- Only a limited tenant's set is kept: nothing would prune an
    -- unlimited one's.
    redis.call("ZADD", KEYS[5], ARGV[8], ARGV[5])
    redis.call("EXPIRE", KEYS[5], ARGV[6])
  end
else
  -- Ended as it is stored (a cache hit): never live, kept as any ended one.
  ttl = ARGV[14]
end
redis.call("EXPIRE", KEYS[1], ttl)
local sid = redis.call("XADD", KEYS[2], "MAXLEN", "~", ARGV[7], "*", "e", ARGV[3])
if ARGV[11] == "" then
  redis.call("PUBLISH", ARGV[4], ARGV[5] .. " " .. sid .. " " .. ARGV[3])
else
  -- Ended as stored: its events go to the stream only. Nobody follows a
  -- request whose id is being created, and every API's hub would receive
  -- both messages only to drop them (two per cache hit, per API process).
  sid = redis.call("XADD", KEYS[2], "MAXLEN", "~", ARGV[7], "*", "e", ARGV[13])
  ttl = ARGV[18]
end
redis.call("EXPIRE", KEYS[2], ttl)
local recTTL = tonumber(redis.call("TTL", KEYS[1]))
charge(KEYS[7], KEYS[8], ARGV[5], recBytes, now + recTTL * 1000, recTTL)
charge(KEYS[7], KEYS[8], ARGV[5] .. ":ev", evBytes, now + tonumber(ttl) * 1000, recTTL)
return {1, sid}
`)

// ErrTenantFull is returned by Create when the tenant already has its
// limit of requests not ended.
var ErrTenantFull = errors.New("job: the tenant has its limit of requests in flight")

// Create stores a new job in status queued with its first event. With an
// idempotency key already used by the tenant, or a Job.JoinKey that still
// names a request (Joinable), it stores nothing and returns the earlier
// request's id and created=false; otherwise the join key names j from now
// until Unjoin, or until j's record goes. With maxLive > 0 and that
// many of the tenant's requests not ended yet, it stores nothing and
// returns ErrTenantFull (the idempotency key is looked up first: a retry of
// an accepted request gets its id back even then).
func (s *Store) Create(ctx context.Context, j *Job, ev Event, idemKey string, maxLive int) (id string, created bool, err error) {
	return s.create(ctx, j, ev, idemKey, maxLive, nil)
}

// CreateEnded stores a new job that ends as it is stored, as end (whose
// Status must be terminal) says: its queued event, then end's, in one
// script (a cache hit is answered with one Redis round trip, not a create
// and then an ending). The events go to its stream but are not published:
// nobody can be following an id not created yet. The idempotency key
// works as for Create; no tenant limit applies (the request holds no share
// of the queue).
func (s *Store) CreateEnded(ctx context.Context, j *Job, ev Event, idemKey string, end Change) (id string, created bool, err error) {
	if !end.Status.Terminal() || end.State == nil || end.Event == nil {
		return "", false, fmt.Errorf("job: create %s ended: a terminal status, a state and an event are required", j.ID)
	}
	return s.create(ctx, j, ev, idemKey, 0, &end)
}

func (s *Store) create(ctx context.Context, j *Job, ev Event, idemKey string, maxLive int, end *Change) (id string, created bool, err error) {
	ik := s.jobKey(j.ID) // none; not "", whose slot differs (createScript)
	if idemKey != "" {
		ik = s.idemKey(j.Tenant, idemKey)
	}
	ev.RequestID, ev.Status = j.ID, StatusQueued
	if ev.At.IsZero() {
		ev.At = time.Now()
	}
	// A queued record lives at least as long as its deadline plus the result TTL.
	ttl := time.Until(j.Deadline) + s.ttl
	// The embedding goes to a field of its own, which only GetWithEmbedding
	// reads: as JSON it was most of the record, decoded on every Get.
	bare := *j
	bare.Embedding = nil
	emb := encodeVector(j.Embedding)
	if end != nil {
		emb = "" // ended as stored: no call will write the cache
	}
	args := []any{mustJSON(&bare), string(StatusQueued), mustJSON(ev), s.Channel(), j.ID, int(ttl.Seconds()) + 1, MaxEvents,
		j.CreatedAt.UnixMilli(), max(0, maxLive), emb}
	if end != nil {
		keep := s.keep(*end)
		args = append(args, string(end.Status), mustJSON(end.State), s.event(j.ID, *end), max(1, int(keep.Seconds())),
			end.Reason, string(end.Code), end.Detail, eventsTTL(keep))
	} else {
		args = append(args, "", "", "", 0, "", "", "", 0)
	}
	var budget, held int64
	if s.budget != nil {
		budget, held = s.budget(ctx, j.Tenant)
	}
	args = append(args, max(0, budget), held, RecordOverhead, StreamOverhead, EventOverhead)
	jk := s.jobKey(j.ID) // none, as ik
	if j.JoinKey != "" && end == nil {
		jk = s.joinKey(j.JoinKey)
	}
	res, err := createScript.Run(ctx, s.rdb,
		[]string{s.jobKey(j.ID), s.streamKey(j.ID), ik, s.liveKey(), s.tenantLiveKey(j.Tenant), jk,
			s.bytesKey(j.Tenant), s.expiryKey(j.Tenant)}, args...).Slice()
	if err != nil {
		return "", false, fmt.Errorf("job: create %s: %w", j.ID, err)
	}
	ok, other, err := pair(res)
	if err != nil {
		return "", false, fmt.Errorf("job: create %s: %w", j.ID, err)
	}
	switch ok {
	case 0:
		return other, false, nil
	case 2:
		return "", false, fmt.Errorf("%w (%s of %d)", ErrTenantFull, other, maxLive)
	case 3:
		return "", false, overBudget(other, budget)
	}
	return j.ID, true, nil
}

// transitionScript changes a request's status and appends its event.
//
// KEYS[1] job hash, KEYS[2] event stream, KEYS[3] live set, KEYS[4] the
// request's join key and KEYS[5] its idempotency key, which an ending
// makes go with the record (KEYS[1] again for none)
// ARGV[1] new status ("" keeps it), ARGV[2] state JSON ("" keeps it),
// ARGV[3] event JSON ("" for none), ARGV[4] channel, ARGV[5] id,
// ARGV[6] ttl seconds to set when the new status is terminal (0 none),
// ARGV[7] reason ("" none), ARGV[8] max events, ARGV[9] code ("" none),
// ARGV[10] detail ("" none), ARGV[11] ttl seconds of the event stream once
// terminal, ARGV[12] EventOverhead; KEYS[6] and KEYS[7] the tenant's budget
// keys (KEYS[1] again for none: nothing is charged)
// Reply: {1, streamID or ""} done; {0, current status} refused (ended or missing).
var transitionScript = redis.NewScript(budgetLua + `
local cur = redis.call("HGET", KEYS[1], "status")
if not cur then
  redis.call("ZREM", KEYS[3], ARGV[5])
  return {0, ""}
end
if cur == "completed" or cur == "failed" or cur == "cancelled" then return {0, cur} end
-- grow is what the record's fields grow by: a field replaced costs the
-- difference.
local grow = 0
local function set(field, v)
  if v == "" then return end
  grow = grow + #v - redis.call("HSTRLEN", KEYS[1], field)
  redis.call("HSET", KEYS[1], field, v)
end
set("status", ARGV[1])
set("state", ARGV[2])
set("reason", ARGV[7])
set("code", ARGV[9])
set("detail", ARGV[10])
local sid = ""
if ARGV[3] ~= "" then
  sid = redis.call("XADD", KEYS[2], "MAXLEN", "~", ARGV[8], "*", "e", ARGV[3])
  redis.call("PUBLISH", ARGV[4], ARGV[5] .. " " .. sid .. " " .. ARGV[3])
end
local terminal = tonumber(ARGV[6]) > 0
if terminal then
  -- Ended: the prompt's embedding served the call's cache write, which has
  -- it already; the record is kept without it.
  grow = grow - redis.call("HSTRLEN", KEYS[1], "emb")
  redis.call("HDEL", KEYS[1], "emb")
  redis.call("EXPIRE", KEYS[1], ARGV[6])
  redis.call("EXPIRE", KEYS[2], ARGV[11])
  redis.call("ZREM", KEYS[3], ARGV[5])
  if KEYS[4] ~= KEYS[1] and redis.call("GET", KEYS[4]) == ARGV[5] then redis.call("EXPIRE", KEYS[4], ARGV[6]) end
  if KEYS[5] ~= KEYS[1] and redis.call("GET", KEYS[5]) == ARGV[5] then redis.call("EXPIRE", KEYS[5], ARGV[6]) end
end
-- Charged only while the charge is held: one released (or never made)
-- would never be released again.
if KEYS[6] ~= KEYS[1] and redis.call("ZSCORE", KEYS[7], ARGV[5]) then
  local evRef = ARGV[5] .. ":ev"
  if grow ~= 0 then charge(KEYS[6], KEYS[7], ARGV[5], grow > 0 and cost(grow) or grow) end
  if ARGV[3] ~= "" then charge(KEYS[6], KEYS[7], evRef, cost(#ARGV[3]) + tonumber(ARGV[12])) end
  if terminal then
    local now = nowms()
    expire(KEYS[7], ARGV[5], now + tonumber(ARGV[6]) * 1000)
    expire(KEYS[7], evRef, now + tonumber(ARGV[11]) * 1000)
  end
end
return {1, sid}
`)

// Change is one update of a request.
type Change struct {
	Status Status // "" keeps the status
	State  *State // nil keeps the state
	Event  *Event // nil appends no event
	Reason string // why it failed or was cancelled, for the tenant
	Code   Code   // why it failed or was cancelled, for programs
	Detail string // what happened, for operators (see Record.Detail)
	// Keep is how long an ending keeps the record (0: the store's result
	// TTL); its event stream goes after EndedEventsTTL at the most.
	Keep time.Duration
	// Join is the request's Job.JoinKey: an ending keeps it only as long
	// as the record (Keep), for a resend whose caller never got the
	// answer. "" for none.
	Join string
	// Tenant is the request's tenant, whose Redis budget the change is
	// charged to (budget.go); required.
	Tenant string
	// Idem is the request's Job.IdempotencyKey: an ending keeps the key
	// only as long as the record, so that a retry with it never finds an
	// id whose record is gone. "" for none.
	Idem string
}

// Apply applies c unless the request has ended. It returns the event's
// stream id, ErrTerminal when refused, ErrNotFound when unknown.
func (s *Store) Apply(ctx context.Context, id string, c Change) (string, error) {
	if c.Tenant == "" {
		return "", fmt.Errorf("job: update %s: the change names no tenant to charge", id)
	}
	state, event, ttl := "", s.event(id, c), 0
	if c.State != nil {
		state = mustJSON(c.State)
	}
	keep := s.keep(c)
	if c.Status.Terminal() {
		ttl = max(1, int(keep.Seconds()))
	}
	jk, ik := s.jobKey(id), s.jobKey(id) // none
	if c.Join != "" && c.Status.Terminal() {
		jk = s.joinKey(c.Join)
	}
	if c.Idem != "" && c.Status.Terminal() {
		ik = s.idemKey(c.Tenant, c.Idem)
	}
	bk, ek := s.jobKey(id), s.jobKey(id) // none
	if c.Tenant != "" {
		bk, ek = s.bytesKey(c.Tenant), s.expiryKey(c.Tenant)
	}
	res, err := transitionScript.Run(ctx, s.rdb, []string{s.jobKey(id), s.streamKey(id), s.liveKey(), jk, ik, bk, ek},
		string(c.Status), state, event, s.Channel(), id, ttl, c.Reason, MaxEvents, string(c.Code), c.Detail,
		eventsTTL(keep), EventOverhead).Slice()
	if err != nil {
		return "", fmt.Errorf("job: update %s: %w", id, err)
	}
	ok, v, err := pair(res)
	if err != nil {
		return "", fmt.Errorf("job: update %s: %w", id, err)
	}
	if ok == 0 {
		if v == "" {
			return "", ErrNotFound
		}
		return "", fmt.Errorf("%w (%s)", ErrTerminal, v)
	}
	return v, nil
}

// event is the JSON of c's event for request id ("" for none): its status
// is c's unless it names one, its time now unless set.
func (s *Store) event(id string, c Change) string {
	if c.Event == nil {
		return ""
	}
	ev := *c.Event
	ev.RequestID = id
	if ev.Status == "" {
		ev.Status = c.Status
	}
	if ev.At.IsZero() {
		ev.At = time.Now()
	}
	return mustJSON(ev)
}

// recordFields are the hash fields of a record Get decodes, in order;
// GetWithEmbedding reads "emb" too.
var recordFields = []string{"job", "status", "reason", "code", "detail", "state"}

// Get returns a request's live record without the prompt's embedding
// (Job.Embedding is nil), which only the worker that calls the provider
// needs (GetWithEmbedding).
func (s *Store) Get(ctx context.Context, id string) (*Record, error) {
	return s.get(ctx, id, recordFields)
}

// GetWithEmbedding returns a request's live record with the prompt's
// embedding, for the cache write after the call.
func (s *Store) GetWithEmbedding(ctx context.Context, id string) (*Record, error) {
	return s.get(ctx, id, append(recordFields[:len(recordFields):len(recordFields)], "emb"))
}

func (s *Store) get(ctx context.Context, id string, fields []string) (*Record, error) {
	vals, err := s.rdb.HMGet(ctx, s.jobKey(id), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("job: get %s: %w", id, err)
	}
	m := make(map[string]string, len(fields))
	for i, v := range vals {
		if str, ok := v.(string); ok {
			m[fields[i]] = str
		}
	}
	if m["job"] == "" {
		return nil, ErrNotFound
	}
	r := &Record{Status: Status(m["status"]), Reason: m["reason"], Code: Code(m["code"]), Detail: m["detail"]}
	if err := json.Unmarshal([]byte(m["job"]), &r.Job); err != nil {
		return nil, fmt.Errorf("job: decode %s: %w", id, err)
	}
	if st := m["state"]; st != "" {
		if err := json.Unmarshal([]byte(st), &r.State); err != nil {
			return nil, fmt.Errorf("job: decode state %s: %w", id, err)
		}
	}
	if e, ok := m["emb"]; ok {
		if r.Job.Embedding, err = decodeVector(e); err != nil {
			return nil, fmt.Errorf("job: decode embedding of %s: %w", id, err)
		}
	}
	return r, nil
}

// StatusOf reads only request id's status: no record to decode (a
// record carries the request, its embedding and its answer), for callers
// that wait for the end. ErrNotFound when there is no record.
func (s *Store) StatusOf(ctx context.Context, id string) (Status, error) {
	v, err := s.rdb.HGet(ctx, s.jobKey(id), "status").Result()
	if errors.Is(err, redis.Nil) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("job: status of %s: %w", id, err)
	}
	return Status(v), nil
}

// Events returns the stored events after stream id after ("" = all).
func (s *Store) Events(ctx context.Context, id, after string) ([]Event, error) {
	start := "-"
	if after != "" {
		start = "(" + after
	}
	msgs, err := s.rdb.XRange(ctx, s.streamKey(id), start, "+").Result()
	if err != nil {
		return nil, fmt.Errorf("job: events %s: %w", id, err)
	}
	out := make([]Event, 0, len(msgs))
	for _, m := range msgs {
		raw, _ := m.Values["e"].(string)
		var ev Event
		if err := json.Unmarshal([]byte(raw), &ev); err != nil {
			return nil, fmt.Errorf("job: decode event %s/%s: %w", id, m.ID, err)
		}
		ev.ID = m.ID
		out = append(out, ev)
	}
	return out, nil
}

// ParseMessage decodes a pub/sub payload published by the store.
func ParseMessage(payload string) (id string, ev Event, err error) {
	id, rest, ok1 := strings.Cut(payload, " ")
	sid, js, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 {
		return "", Event{}, fmt.Errorf("job: malformed event message")
	}
	if err := json.Unmarshal([]byte(js), &ev); err != nil {
		return "", Event{}, fmt.Errorf("job: decode event message: %w", err)
	}
	ev.ID = sid
	return id, ev, nil
}

// pair checks a {int, string} script reply.
func pair(res []any) (int64, string, error) {
	if len(res) != 2 {
		return 0, "", fmt.Errorf("unexpected script reply %v", res)
	}
	n, ok := res[0].(int64)
	s, ok2 := res[1].(string)
	if !ok || !ok2 {
		return 0, "", fmt.Errorf("unexpected script reply types %T %T", res[0], res[1])
	}
	return n, s, nil
}

// ValidEventID reports whether id has the shape of a stream id ("ms-seq")
// and is not from the future: a client's Last-Event-ID must be one the
// server sent, or the replay and the live events would be skipped.
func ValidEventID(id string, now time.Time) bool {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok || ms == "" || seq == "" {
		return false
	}
	m, err1 := strconv.ParseUint(ms, 10, 64)
	q, err2 := strconv.ParseUint(seq, 10, 64)
	// Canonical digits only: Redis refuses an id padded with zeros past
	// its own length limit (found by FuzzValidEventID), and no id it sent
	// has them.
	canonical := strconv.FormatUint(m, 10) == ms && strconv.FormatUint(q, 10) == seq
	return err1 == nil && err2 == nil && canonical && m <= uint64(now.Add(time.Minute).UnixMilli())
}

// CompareIDs orders two stream ids ("ms-seq"): -1, 0 or 1.
func CompareIDs(a, b string) int {
	am, as := splitID(a)
	bm, bs := splitID(b)
	switch {
	case am != bm:
		return cmp(am, bm)
	default:
		return cmp(as, bs)
	}
}

func splitID(id string) (uint64, uint64) {
	var ms, seq uint64
	_, _ = fmt.Sscanf(id, "%d-%d", &ms, &seq) // a malformed id orders as 0-0
	return ms, seq
}

func cmp(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Live returns the ids of requests not ended yet that were created before
// olderThan, oldest first, at most limit.
func (s *Store) Live(ctx context.Context, olderThan time.Time, limit int) ([]string, error) {
	ids, err := s.rdb.ZRangeByScore(ctx, s.liveKey(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(olderThan.UnixMilli(), 10), Count: int64(limit)}).Result()
	if err != nil {
		return nil, fmt.Errorf("job: live requests: %w", err)
	}
	return ids, nil
}

// Forget drops id from the live set (a record that expired without
// ending).
func (s *Store) Forget(ctx context.Context, id string) error {
	if err := s.rdb.ZRem(ctx, s.liveKey(), id).Err(); err != nil {
		return fmt.Errorf("job: forget %s: %w", id, err)
	}
	return nil
}

// existsScript returns, for each of KEYS, 1 when it exists and 0 when not:
// EXISTS with several keys only counts them.
var existsScript = redis.NewScript(`
local out = {}
for i, k in ipairs(KEYS) do out[i] = redis.call("EXISTS", k) end
return out`)

// Missing returns those of ids that have no live record: never stored,
// expired, or lost by Redis (a failover, a restart without persistence).
// One round trip: the records share the store's hash slot.
func (s *Store) Missing(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.jobKey(id)
	}
	found, err := existsScript.Run(ctx, s.rdb, keys).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("job: look for %d records: %w", len(ids), err)
	}
	var missing []string
	for i, f := range found {
		if f == 0 {
			missing = append(missing, ids[i])
		}
	}
	return missing, nil
}

// Joinable returns the request whose Job.JoinKey is key, or "" when there
// is none: the one a resend of it joins. The key names a request from its
// creation until Unjoin (its answer was delivered) or until its record
// goes; a record lost without its key (a failover) reads ErrNotFound, and
// the caller unjoins it.
func (s *Store) Joinable(ctx context.Context, key string) (string, error) {
	id, err := s.rdb.Get(ctx, s.joinKey(key)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("job: join key: %w", err)
	}
	return id, nil
}

// unjoinScript deletes KEYS[1] only if it still names ARGV[1].
var unjoinScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0`)

// Unjoin ends request id's hold on join key key (a no-op when the key
// names another request or none): its answer has reached a caller, so a
// resend from now on is a call of its own.
func (s *Store) Unjoin(ctx context.Context, key, id string) error {
	if err := unjoinScript.Run(ctx, s.rdb, []string{s.joinKey(key)}, id).Err(); err != nil {
		return fmt.Errorf("job: unjoin %s: %w", id, err)
	}
	return nil
}

// Idempotent returns the id of the request tenant already submitted with
// idemKey, or "" when there is none.
func (s *Store) Idempotent(ctx context.Context, tenant, idemKey string) (string, error) {
	id, err := s.rdb.Get(ctx, s.idemKey(tenant, idemKey)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("job: idempotency key: %w", err)
	}
	return id, nil
}
