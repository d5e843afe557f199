package service

import (
	"context"
	"log/slog"
	"time"

	"bulwark/pkg/history"
	"bulwark/pkg/job"
	"bulwark/pkg/recent"
)

// budgets is the job store's BudgetFunc: each tenant's max_stored_bytes,
// and what its outcomes hold in the history outbox, read at most once a
// second per process (the outbox only fills while PostgreSQL is down, and
// a second's lag lets a tenant pass its budget by a second of outcomes at
// most).
func budgets(limits map[string]int64, h *history.Store, logger *slog.Logger) job.BudgetFunc {
	held := &recent.Value[map[string]int64]{MaxAge: time.Second, Load: h.HeldBy}
	return func(ctx context.Context, tenant string) (int64, int64) {
		b := limits[tenant]
		if b <= 0 {
			return 0, 0
		}
		m, _, err := held.Get(ctx)
		if err != nil {
			logger.Warn("history outbox usage unknown; budgets count the store alone", "err", err)
		}
		return b, m[tenant]
	}
}
