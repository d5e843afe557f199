package job_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/testenv"
)

// budgets gives every tenant the same budget and holds nothing outside.
func budgets(b int64) job.BudgetFunc {
	return func(context.Context, string) (int64, int64) { return b, 0 }
}

// heldBy is what the store counts against tenant.
func heldBy(t *testing.T, rdb redis.UniversalClient, tenant string) int64 {
	t.Helper()
	n, err := rdb.HGet(context.Background(), "b:bytes-of:"+tenant, "=").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return n
}

// memoryOf is what Redis says the keys of request id take.
func memoryOf(t *testing.T, rdb redis.UniversalClient, id string) int64 {
	t.Helper()
	var n int64
	for _, k := range []string{"b:job:" + id, "b:ev:" + id} {
		m, err := rdb.MemoryUsage(context.Background(), k).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		n += m
	}
	return n
}

// The budget counts, for any content, at least what Redis holds for a
// request and not much more: a record queued, running, streamed (deltas)
// and answered, of small and large prompts, of text that encoding/json
// would have escaped six-fold.
func TestBudgetCountsWhatRedisHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := job.NewStore(rdb, "b:", time.Hour).WithBudgets(budgets(1 << 40))
	for i, prompt := range []string{"why does P0A80 show", strings.Repeat("<", 200_000), strings.Repeat("é\u2028&", 30_000),
		strings.Repeat("log line 08:15:22 ECU BMS voltage 3.71\n", 3000)} {
		tenant := fmt.Sprintf("t%d", i)
		j := newJob(fmt.Sprintf("m%d", i))
		j.Tenant = tenant
		j.Request = llm.Request{Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: prompt}}}}}
		j.Embedding = make([]float32, 384)
		if _, _, err := s.Create(ctx, j, job.Event{Type: job.EventQueued}, "", 0); err != nil {
			t.Fatal(err)
		}
		check := func(stage string) {
			held, mem := heldBy(t, rdb, tenant), memoryOf(t, rdb, j.ID)
			t.Logf("%s %s: budget counts %d, Redis holds %d (%.2f)", j.ID, stage, held, mem, float64(held)/float64(mem))
			if held < mem || float64(held) > 1.35*float64(mem)+8192 {
				t.Errorf("%s %s: budget counts %d bytes, Redis holds %d", j.ID, stage, held, mem)
			}
		}
		check("queued")
		st := job.State{Attempts: 1}
		if _, err := s.Apply(ctx, j.ID, job.Change{Tenant: tenant, Status: job.StatusRunning, State: &st,
			Event: &job.Event{Type: job.EventStarted}}); err != nil {
			t.Fatal(err)
		}
		for range 50 {
			if _, err := s.Apply(ctx, j.ID, job.Change{Tenant: tenant, Event: &job.Event{Type: job.EventDelta,
				Status: job.StatusRunning, Delta: []llm.Delta{{Text: strings.Repeat("answer <&> ", 20)}}}}); err != nil {
				t.Fatal(err)
			}
		}
		check("streamed")
		st.Result = &llm.Response{Content: []llm.Block{{Type: llm.BlockText, Text: strings.Repeat("<b>", 10_000)}}}
		if _, err := s.Apply(ctx, j.ID, job.Change{Tenant: tenant, Status: job.StatusCompleted, State: &st,
			Event: &job.Event{Type: job.EventCompleted}}); err != nil {
			t.Fatal(err)
		}
		check("answered")
	}
}

// A stored request costs what its content does: a prompt of characters
// encoding/json writes as six-byte escapes is stored at its own size.
func TestStoredRequestCostsItsContent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	s := job.NewStore(rdb, "b:", time.Hour)
	for name, text := range map[string]string{"html": strings.Repeat("<>&", 100_000), "separators": strings.Repeat("\u2028", 100_000)} {
		j := newJob("c-" + name)
		j.Request = llm.Request{Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: text}}}}}
		if _, _, err := s.Create(ctx, j, job.Event{Type: job.EventQueued}, "", 0); err != nil {
			t.Fatal(err)
		}
		n, err := rdb.HStrLen(ctx, "b:job:"+j.ID, "job").Result()
		if err != nil {
			t.Fatal(err)
		}
		if over := n - int64(len(text)); over > 1024 {
			t.Errorf("%s: a %d-byte prompt is stored in %d bytes", name, len(text), n)
		}
	}
}

// A tenant past its budget is refused, with how much it holds and when
// some of it is freed, while another tenant's requests are stored; once
// its requests end and their records expire, it may store again.
func TestBudgetRefusesOneTenantOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	const budget = 128 << 10
	s := job.NewStore(rdb, "b:", time.Hour).WithBudgets(budgets(budget))
	prompt := strings.Repeat("x", 10_000)
	submit := func(tenant, id string) error {
		j := newJob(id)
		j.Tenant = tenant
		j.Request = llm.Request{Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: prompt}}}}}
		_, _, err := s.Create(ctx, j, job.Event{Type: job.EventQueued}, "", 0)
		return err
	}
	var stored []string
	var be *job.BudgetError
	for i := range 100 {
		id := "a" + strconv.Itoa(i)
		err := submit("noisy", id)
		if errors.As(err, &be) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, id)
	}
	if be == nil || len(stored) < 5 || len(stored) > 7 {
		t.Fatalf("stored %d requests of 10 KB in a 128 KB budget before a refusal (%v)", len(stored), be)
	}
	if be.Used+be.Need <= budget || be.Budget != budget || be.FreedAt.Before(time.Now()) {
		t.Errorf("refusal says %+v", be)
	}
	if held := heldBy(t, rdb, "noisy"); held > budget {
		t.Errorf("the tenant holds %d bytes of a %d budget", held, budget)
	}
	for i := range 5 {
		if err := submit("quiet", "q"+strconv.Itoa(i)); err != nil {
			t.Fatalf("another tenant refused: %v", err)
		}
	}
	// Its requests end, kept a second: their charges go with them.
	for _, id := range stored {
		if _, err := s.Apply(ctx, id, job.Change{Tenant: "noisy", Status: job.StatusCompleted, State: &job.State{},
			Event: &job.Event{Type: job.EventCompleted}, Keep: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := submit("noisy", "again-"+strconv.FormatInt(time.Now().UnixNano(), 36))
		if err == nil {
			break
		}
		if !errors.Is(err, job.ErrOverBudget) || time.Now().After(deadline) {
			t.Fatalf("still refused after its requests expired: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the records' expiry: a time, not an event
	}
}
