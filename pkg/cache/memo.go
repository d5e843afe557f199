package cache

import (
	"encoding/json"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// The memo is a process's first tier of exact hits: the answers it found
// lately, in memory in front of PostgreSQL, so that a prompt asked
// thousands of times a second costs one query per MemoTTL rather than one
// per request (docs/performance.md). Semantic lookups do not use it.
//
// It is off until EnableMemo, which a process calls only when it also
// hears the fleet's invalidations (ForgetMemo): an answer deleted by
// InvalidateCase or InvalidateNamespace in any process must stop being
// served in every one. This process's own invalidations clear its memo at
// once; another's reach it as a notice (pkg/service sends them over Redis
// Pub/Sub, pkg/progress receives them), and should a notice be lost,
// MemoTTL bounds how long a deleted answer is still served. An entry never
// outlives its row's own expiry. A newer answer stored for the same prompt
// is served once the older one leaves the memo: both are answers to it.
type memo struct {
	ttl time.Duration
	lru *lru.Cache[string, memoEntry] // safe for concurrent use

	// mu orders forget against put: an answer read from PostgreSQL before
	// an invalidation must not enter the memo after it (gen moved on).
	mu  sync.Mutex
	gen uint64
}

type memoEntry struct {
	id       int64
	response json.RawMessage // shared by every hit: never modified
	created  time.Time       // when the answer was stored
	until    time.Time       // when this entry stops being served
}

func newMemo(entries int, ttl time.Duration) *memo {
	l, err := lru.New[string, memoEntry](entries)
	if err != nil {
		panic("cache: memo size must be positive: " + err.Error()) // Validate checks it
	}
	return &memo{ttl: ttl, lru: l}
}

func memoKey(scope, hash string) string { return scope + "\x00" + hash }

// generation returns the generation a lookup starts in, for put.
func (m *memo) generation() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gen
}

// get returns the live entry of key at now.
func (m *memo) get(key string, now time.Time) (memoEntry, bool) {
	e, ok := m.lru.Get(key)
	if !ok {
		return memoEntry{}, false
	}
	if !now.Before(e.until) {
		m.lru.Remove(key)
		return memoEntry{}, false
	}
	return e, true
}

// put keeps e under key for at most the memo's TTL and rowLeft (the row's
// own time to live), unless the memo was cleared since gen.
func (m *memo) put(gen uint64, key string, e memoEntry, now time.Time, rowLeft time.Duration) {
	e.until = now.Add(min(m.ttl, rowLeft))
	m.mu.Lock()
	defer m.mu.Unlock()
	if gen == m.gen {
		m.lru.Add(key, e)
	}
}

// forget clears the memo.
func (m *memo) forget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	m.lru.Purge()
}
