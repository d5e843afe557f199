package redisconn

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLoggerStructuredAndThrottled(t *testing.T) {
	var buf bytes.Buffer
	g := NewLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
	now := time.Unix(1000, 0)
	g.now = func() time.Time { return now }
	ctx := context.Background()
	dial := "redis: connection pool: failed to dial after %d attempts: %v"
	for range 3 {
		g.Printf(ctx, dial, 5, "connection refused")
	}
	g.Printf(ctx, "cluster: %s", "slots changed") // another kind: not held back
	now = now.Add(logEvery)
	g.Printf(ctx, dial, 5, "connection refused")

	var lines []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 (two dials, one cluster): %s", len(lines), buf.String())
	}
	if lines[0]["msg"] != "connection pool: failed to dial after 5 attempts: connection refused" ||
		lines[0]["level"] != "WARN" || lines[0]["component"] != "redis" || lines[0]["repeated"] != nil {
		t.Errorf("first line %v", lines[0])
	}
	if lines[1]["msg"] != "cluster: slots changed" {
		t.Errorf("second line %v", lines[1])
	}
	if lines[2]["repeated"] != float64(2) {
		t.Errorf("after the pause: %v, want repeated 2", lines[2])
	}
}
