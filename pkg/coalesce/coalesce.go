// Package coalesce keeps the claims that attach identical requests to the
// first one in flight. A claim is one Redis key per request identity
// (cache.Cache.Ref), naming the leading request, so identical requests
// arriving on any API process find the same leader; it lapses on its own
// after a TTL (the longest a request may wait), so a crashed leader never
// blocks its identity for good.
package coalesce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Claims is the claim store. It is safe for concurrent use.
type Claims struct {
	rdb    redis.Cmdable
	prefix string
}

// New returns the claims kept in rdb under prefix (redis.prefix).
func New(rdb redis.Cmdable, prefix string) *Claims {
	return &Claims{rdb: rdb, prefix: prefix}
}

// claimKey is the Redis key of identity key's claim.
func (c *Claims) claimKey(key string) string { return c.prefix + "inflight:" + key }

// Claim makes id the leader of key for ttl, or returns the current leader
// (which is id when it already leads).
func (c *Claims) Claim(ctx context.Context, key, id string, ttl time.Duration) (leader string, err error) {
	leader, err = c.rdb.SetArgs(ctx, c.claimKey(key), id, redis.SetArgs{Mode: "NX", Get: true, TTL: ttl}).Result()
	if errors.Is(err, redis.Nil) {
		return id, nil
	}
	if err != nil {
		return "", fmt.Errorf("coalesce: claim: %w", err)
	}
	return leader, nil
}

// releaseScript deletes KEYS[1] only if it still names ARGV[1], so a
// leader whose claim lapsed cannot end a later leader's.
var releaseScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0`)

// Release ends id's claim of key; a no-op when another request holds it.
func (c *Claims) Release(ctx context.Context, key, id string) error {
	if err := releaseScript.Run(ctx, c.rdb, []string{c.claimKey(key)}, id).Err(); err != nil {
		return fmt.Errorf("coalesce: release: %w", err)
	}
	return nil
}
