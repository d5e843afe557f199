package history_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"bulwark/pkg/history"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/testenv"
)

// An answer holding what PostgreSQL refuses (NUL, which jsonb refuses as
// \u0000 and text as a byte; invalid UTF-8, which text refuses) is stored
// through the batching writer, nothing is dropped, and a look-up returns
// the answer as it was: NUL and U+FFFF (the escape character) exactly,
// the tool input's NUL too; text columns get U+FFFD instead. Its row is
// completed, so the reconcile job can never call the request lost.
func TestUnstorableTextIsEscaped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := history.New(testPool(t), slog.New(slog.DiscardHandler), time.Hour)
	s.Outbox(testenv.Redis(t), "t:outbox", 10)
	var dropped, failed atomic.Int32
	s.OnDrop = func() { dropped.Add(1) }
	s.OnError = func() { failed.Add(1) }
	s.Start()
	rec := outcome("req-nul", 1, "")
	const answer = "a\x00b \uffff0 \uffff\x00 end\x00"
	rec.State.Result.Content[0].Text = answer
	rec.State.Result.Content = append(rec.State.Result.Content, llm.Block{Type: llm.BlockToolUse, ToolName: "t\x00",
		Input: json.RawMessage(`{"k\u0000":"v\u0000","n":12345678901234567890}`)})
	rec.State.KeyID = "key-\x00-\xff"
	s.Submitted(ctx, &rec.Job, job.StatusQueued, "none")
	s.Finished(ctx, rec, 0)
	failedRec := outcome("req-bad-reason", 1, "provider_error: \x00 body \xe2\x82 (request req-bad-reason)")
	s.Finished(ctx, failedRec, 0)
	s.Close()
	if dropped.Load() != 0 || failed.Load() != 0 {
		t.Fatalf("%d outcomes dropped, %d writes failed; want none", dropped.Load(), failed.Load())
	}
	row, err := s.Get(ctx, "req-nul")
	if err != nil || row.Status != job.StatusCompleted || row.Response == nil {
		t.Fatalf("row %+v, %v", row, err)
	}
	if got := row.Response.Content[0].Text; got != answer {
		t.Fatalf("answer read back %q, want %q", got, answer)
	}
	if tool := row.Response.Content[1]; tool.ToolName != "t\x00" || string(tool.Input) != `{"k\u0000":"v\u0000","n":12345678901234567890}` {
		t.Fatalf("tool block read back %+v (input %s)", tool, tool.Input)
	}
	row, err = s.Get(ctx, "req-bad-reason")
	if err != nil || row.Status != job.StatusFailed || row.Error != "provider_error: \uFFFD body \uFFFD (request req-bad-reason)" {
		t.Fatalf("failed row %+v, %v", row, err)
	}
	if n, _ := s.Backlog(ctx); n != 0 {
		t.Fatalf("%d outcomes in the outbox, want all written", n)
	}
}
