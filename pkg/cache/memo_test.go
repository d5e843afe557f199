package cache

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"bulwark/pkg/job"
)

// lookupKind looks k up exactly and returns what it found.
func lookupKind(t *testing.T, c *Cache, k Key) job.Cached {
	t.Helper()
	hit, err := c.LookupExact(context.Background(), k)
	require.NoError(t, err)
	return hit.Kind
}

// With the memo, a repeated exact hit is served from memory: a row deleted
// behind the cache's back (as another process would, its notice not yet
// here) is still served until ForgetMemo, and never after. This process's
// own invalidation empties the memo at once.
func TestMemoServesRepeatedExactHits(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.cache.EnableMemo()
	ctx := context.Background()
	k := key(diagPrompt)
	require.NoError(t, b.cache.Store(ctx, k, nil, answer))

	first, err := b.cache.LookupExact(ctx, k)
	require.NoError(t, err)
	second, err := b.cache.LookupExact(ctx, k)
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, second.Kind)
	require.Equal(t, first.ID, second.ID)
	require.JSONEq(t, string(answer), string(second.Response))
	require.GreaterOrEqual(t, second.Age, first.Age, "the age goes on from the row's")
	s := b.cache.Stats()
	require.Equal(t, int64(1), s.MemoHits)
	require.Equal(t, int64(2), s.ExactHits)

	_, err = b.pool.Exec(ctx, "DELETE FROM semantic_cache WHERE id = $1", first.ID)
	require.NoError(t, err)
	require.Equal(t, job.CachedExact, lookupKind(t, b.cache, k), "served from the memo: PostgreSQL was not asked")
	b.cache.ForgetMemo()
	require.Equal(t, job.CachedNone, lookupKind(t, b.cache, k))

	// Own invalidation: stored, remembered, invalidated, gone.
	require.NoError(t, b.cache.Store(ctx, k, nil, answer))
	require.Equal(t, job.CachedExact, lookupKind(t, b.cache, k))
	n, err := b.cache.InvalidateCase(ctx, "t1", "case-1")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, job.CachedNone, lookupKind(t, b.cache, k))
}

// Without EnableMemo every exact lookup asks PostgreSQL.
func TestNoMemoByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	k := key(diagPrompt)
	require.NoError(t, b.cache.Store(ctx, k, nil, answer))
	require.Equal(t, job.CachedExact, lookupKind(t, b.cache, k))
	_, err := b.pool.Exec(ctx, "DELETE FROM semantic_cache")
	require.NoError(t, err)
	require.Equal(t, job.CachedNone, lookupKind(t, b.cache, k))
	require.Zero(t, b.cache.Stats().MemoHits)
}

// A memo entry lives at most MemoTTL, and never past its row's expiry.
func TestMemoEntryLifetime(t *testing.T) {
	t.Parallel()
	const memoTTL = time.Second
	b := setup(t, Config{MemoTTL: memoTTL, TTL: map[string]time.Duration{"short": 150 * time.Millisecond}})
	b.cache.EnableMemo()
	ctx := context.Background()
	long, short := key(diagPrompt), key(diagPrompt)
	short.Layer = "short"
	require.NoError(t, b.cache.Store(ctx, short, nil, answer))
	require.Equal(t, job.CachedExact, lookupKind(t, b.cache, short))
	require.NoError(t, b.cache.Store(ctx, long, nil, answer))
	remembered := time.Now()
	require.Equal(t, job.CachedExact, lookupKind(t, b.cache, long))
	_, err := b.pool.Exec(ctx, "DELETE FROM semantic_cache")
	require.NoError(t, err)

	time.Sleep(250 * time.Millisecond) // past the short row's expiry: time itself is what is tested
	require.Equal(t, job.CachedNone, lookupKind(t, b.cache, short), "past its row's expiry")
	require.Equal(t, job.CachedExact, lookupKind(t, b.cache, long), "within MemoTTL")
	time.Sleep(time.Until(remembered.Add(memoTTL + 50*time.Millisecond)))
	require.Equal(t, job.CachedNone, lookupKind(t, b.cache, long), "past MemoTTL")
}

// An answer read before an invalidation does not enter the memo after it.
func TestMemoPutAfterForgetIsDropped(t *testing.T) {
	t.Parallel()
	m := newMemo(10, time.Minute)
	now := time.Now()
	gen := m.generation()
	m.forget() // an invalidation while the lookup's query ran
	m.put(gen, "k", memoEntry{id: 1, response: json.RawMessage(`{}`)}, now, time.Hour)
	_, ok := m.get("k", now)
	require.False(t, ok)
	m.put(m.generation(), "k", memoEntry{id: 1}, now, time.Hour)
	_, ok = m.get("k", now)
	require.True(t, ok)
}
