package testenv_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"bulwark/pkg/testkit/testenv"
)

func TestRedisAndPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("fresh Redis db: size %d, err %v", n, err)
	}
	conn, err := pgx.Connect(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM requests").Scan(&n); err != nil {
		t.Fatalf("migrated schema: %v", err)
	}
}
