package cache

import (
	"context"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// A long text shared by two prompts swamps their similarity: "Answer only
// in French." before a 50-line log scores 0.9997 against the bare log with
// the local embedder, and so do two different questions about the same
// log. The embedding of the whole prompt cannot tell them apart, so a
// semantic hit also compares what differs:
//
//   - Both prompts are cut into segments: lines, and sentences within a
//     line (after ". ", "? ", "! ", or a Chinese full stop, question or
//     exclamation mark), masked (the ignored patterns) and lower-cased.
//   - The segments both prompts have (as multisets) are the shared text;
//     the rest of each, in order, is its difference.
//   - No shared segment: the whole prompts are their differences, and the
//     similarity the search measured is theirs; the hit stands.
//   - No difference: the same segments, differently spaced or cased, or
//     with other VINs or times; the hit stands.
//   - A difference on one side only (an instruction or question added
//     to, or dropped from, the shared text): no hit.
//   - Differences on both sides: they are embedded, and the hit stands
//     when their similarity reaches Config.Threshold. A difference longer
//     than diffMaxRunes is not small next to the text it differs from: no
//     hit, and no embedding of it. At most diffEmbedsMax candidates of a
//     lookup are embedded so (one call each, with a remote embedder one
//     request); further ones needing it are refused.
//
// A text pasted without line breaks or sentence ends is one segment: an
// instruction run into its first log line makes that line differ, and the
// two differing lines are then compared, which still refuses a long
// instruction but not a word or two.
const (
	diffMaxRunes  = 2000
	diffEmbedsMax = 2
)

// lineForm is a prompt as stored: each line normalised (Normalise), blank
// lines dropped, joined by "\n". Normalise(lineForm(p)) == Normalise(p),
// so the exact key is the same; the line breaks are kept for segments.
func lineForm(prompt string) string {
	var lines []string
	for l := range strings.Lines(prompt) {
		if l = Normalise(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// segments cuts a prompt in line form into its masked, lower-cased lines
// and sentences.
func (g *guard) segments(lines string) []string {
	var out []string
	for l := range strings.SplitSeq(lines, "\n") {
		out = appendSentences(out, strings.ToLower(Normalise(g.mask(l))))
	}
	return out
}

// appendSentences appends the sentences of one normalised line to out.
func appendSentences(out []string, line string) []string {
	start := 0
	for i, r := range line {
		end := -1
		switch r {
		case '。', '？', '！':
			end = i + utf8.RuneLen(r)
		case '.', '?', '!':
			if i+1 < len(line) && line[i+1] == ' ' {
				end = i + 1
			}
		}
		if end < 0 {
			continue
		}
		if s := strings.TrimSpace(line[start:end]); s != "" {
			out = append(out, s)
		}
		start = end
	}
	if s := strings.TrimSpace(line[start:]); s != "" {
		out = append(out, s)
	}
	return out
}

// difference returns the segments of a that b lacks and those of b that a
// lacks (as multisets), each joined by "\n" in their order, and whether a
// and b share any segment.
func difference(a, b []string) (onlyA, onlyB string, shared bool) {
	left := make(map[string]int, len(a))
	for _, s := range a {
		left[s]++
	}
	var inB []string
	for _, s := range b {
		if left[s] > 0 {
			left[s]--
			shared = true
		} else {
			inB = append(inB, s)
		}
	}
	var inA []string
	for _, s := range a {
		if left[s] > 0 {
			left[s]--
			inA = append(inA, s)
		}
	}
	return strings.Join(inA, "\n"), strings.Join(inB, "\n"), shared
}

// sameAsk reports whether a candidate's stored prompt (line form) asks
// what q asks, judged by what differs between them (see above). It spends
// q.diffEmbeds. Its error, the embedder's, wraps ErrUnavailable.
func (c *Cache) sameAsk(ctx context.Context, q *question, stored string) (bool, error) {
	onlyA, onlyB, shared := difference(c.guard.segments(stored), q.segments)
	switch {
	case !shared || onlyA == "" && onlyB == "":
		return true, nil
	case onlyA == "" || onlyB == "",
		utf8.RuneCountInString(onlyA) > diffMaxRunes, utf8.RuneCountInString(onlyB) > diffMaxRunes,
		q.diffEmbeds <= 0:
		return false, nil
	}
	q.diffEmbeds--
	v, err := c.emb.Embed(ctx, []string{onlyA, onlyB})
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("%d vectors for 2 texts", len(v))
	}
	if err != nil {
		err = fmt.Errorf("cache: embed the differences with %s: %w: %w", c.emb.Name(), ErrUnavailable, err)
		c.fail(ctx, err)
		return false, err
	}
	return cosineSim(v[0], v[1]) >= c.cfg.Threshold, nil
}

// cosineSim is the cosine similarity of a and b; 0 when either is zero.
func cosineSim(a, b []float32) float64 {
	var dot, na, nb float64
	for i := range min(len(a), len(b)) {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	if na == 0 || nb == 0 {
		return 0
	}
	return dot / math.Sqrt(na*nb)
}
