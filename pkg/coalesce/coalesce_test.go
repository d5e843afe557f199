package coalesce_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"bulwark/pkg/coalesce"
	"bulwark/pkg/testkit/testenv"
)

func TestClaimNamesTheFirstLeader(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	c := coalesce.New(rdb, "t:")

	leader, err := c.Claim(ctx, "scope:hash", "a", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "a", leader, "the first claimant leads")
	leader, err = c.Claim(ctx, "scope:hash", "b", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "a", leader, "an identical request joins the leader")
	leader, err = c.Claim(ctx, "scope:other", "b", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "b", leader, "another identity has its own leader")

	ttl, err := rdb.TTL(ctx, "t:inflight:scope:hash").Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 50*time.Second, "a claim lapses by itself, so a crashed leader frees its identity")

	require.NoError(t, c.Release(ctx, "scope:hash", "b"))
	leader, err = c.Claim(ctx, "scope:hash", "c", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "a", leader, "only the leader's release ends its claim")

	require.NoError(t, c.Release(ctx, "scope:hash", "a"))
	leader, err = c.Claim(ctx, "scope:hash", "c", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "c", leader, "after the leader's release the next request leads")
}

func TestClaimReportsRedisDown(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	c := coalesce.New(rdb, "t:")
	_, err := c.Claim(context.Background(), "k", "a", time.Minute)
	require.ErrorContains(t, err, "coalesce: claim")
	require.ErrorContains(t, c.Release(context.Background(), "k", "a"), "coalesce: release")
}
