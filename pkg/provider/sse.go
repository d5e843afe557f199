package provider

import (
	"crypto/rand"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"bulwark/pkg/provider/internal/wirejson"
)

// WriteEvent writes one Server-Sent Event: an "event:" line when event is
// not empty, one "data:" line holding v as compact JSON, and the blank line
// that ends the event.
func WriteEvent(w io.Writer, event string, v any) error {
	data, err := wirejson.Marshal(v)
	if err != nil {
		return fmt.Errorf("sse: encode %s: %w", event, err)
	}
	var b strings.Builder
	b.Grow(len(data) + len(event) + 16)
	if event != "" {
		b.WriteString("event: ")
		b.WriteString(event)
		b.WriteByte('\n')
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("sse: write %s: %w", event, err)
	}
	return nil
}

// StreamChunks is how many pieces SplitText cuts a long text into. A
// replayed answer is streamed in a few pieces so that a client's streaming
// code path is exercised, without one event per token.
const StreamChunks = 4

// minChunk is the shortest piece SplitText makes: short texts go out whole.
const minChunk = 16

// SplitText cuts s into at most StreamChunks pieces of similar length, at
// rune boundaries, that concatenate to s. An empty s yields no pieces.
func SplitText(s string) []string {
	if s == "" {
		return nil
	}
	size := max(len(s)/StreamChunks+1, minChunk)
	var out []string
	for len(s) > size {
		cut := size
		for cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut++
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return append(out, s)
}

// NewID returns prefix followed by 24 random alphanumeric characters, the
// shape of provider message ids ("msg_…", "chatcmpl-…"), for answers that
// carry no id of their own.
func NewID(prefix string) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var b [24]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24).
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return prefix + string(b[:])
}
