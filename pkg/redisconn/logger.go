package redisconn

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// logEvery is how often one kind of go-redis message is logged: during an
// outage every failed dial of every pool logs, many lines a second.
const logEvery = 5 * time.Second

// Logger routes go-redis's own messages (failed dials, pool and cluster
// state) into the process's structured log as warnings with
// component=redis, instead of plain lines on stderr that a JSON log
// pipeline cannot parse. Each message kind (its format) is logged at most
// once per logEvery; the next line says how many were left out. Install it
// with redis.SetLogger, once per process.
type Logger struct {
	l   *slog.Logger
	now func() time.Time

	mu   sync.Mutex
	seen map[string]*logKind
}

type logKind struct {
	last    time.Time
	dropped int
}

// NewLogger returns a Logger writing to l.
func NewLogger(l *slog.Logger) *Logger {
	return &Logger{l: l, now: time.Now, seen: map[string]*logKind{}}
}

// Printf implements go-redis's internal Logging interface.
func (g *Logger) Printf(ctx context.Context, format string, v ...any) {
	dropped, ok := g.admit(format)
	if !ok {
		return
	}
	if ctx == nil {
		ctx = context.Background() // some of go-redis's background loops log without one
	}
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	attrs := []any{"component", "redis"}
	if dropped > 0 {
		attrs = append(attrs, "repeated", dropped)
	}
	g.l.WarnContext(ctx, msg, attrs...)
}

// admit reports whether a message of this format may be logged now, and
// how many of its kind were left out since the last one.
func (g *Logger) admit(format string) (dropped int, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	k := g.seen[format]
	if k == nil {
		k = &logKind{}
		g.seen[format] = k
	} else if now.Sub(k.last) < logEvery {
		k.dropped++
		return 0, false
	}
	dropped, k.dropped, k.last = k.dropped, 0, now
	return dropped, true
}
