package pgdb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// An outage is ridden out; a server that answers with an error is a
// misconfiguration to stop on.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	auth := &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"refused", fmt.Errorf("pgdb: %w", refused), true},
		{"timeout", fmt.Errorf("pgdb: %w", context.DeadlineExceeded), true},
		{"authentication", fmt.Errorf("pgdb: %w", auth), false},
		{"failing migration", fmt.Errorf("pgdb: migrate: %w", &pgconn.PgError{Code: "42601"}), false},
		{"other", errors.New("pgdb: no such file"), false},
	} {
		if got := Unreachable(tt.err); got != tt.want {
			t.Errorf("%s: Unreachable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
