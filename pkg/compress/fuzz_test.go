package compress

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"bulwark/pkg/cache"
	"bulwark/pkg/llm"
)

// maxExpanded bounds how many lines entitySeq expands markers into, so that
// a fuzzed "[previous line repeated 999999999 more times]" does not
// exhaust memory.
const maxExpanded = 100_000

// entitySeq is the reference reading of a text: per protected pattern, its
// matches in order, line by line, where a line that reads as a marker
// stands for N copies of the last line above it that is not a marker (a
// marker with no line above it is read as text).
//
// With strip, the matches that begin inside a leading timestamp (rule 3's)
// are left out: timestamps are not entities. Rule 1 can make a timestamp
// ("Nov   3 08:15:22" is none, "Nov 3 08:15:22" is one), so with strip
// each line is first put through rule 1; that rule 1 keeps the protected
// matches of each line is checked without strip.
//
// ok is false when the expansion would exceed maxExpanded lines.
func entitySeq(c *Compressor, pats []*regexp.Regexp, text string, strip bool) (seq [][]string, ok bool) {
	seq = make([][]string, len(pats))
	of := func(l string) [][]string {
		from := 0
		if strip {
			l = c.normalise(l)
			if end, _, ok := c.splitTimestamp(l); ok {
				from = end
			}
		}
		out := make([][]string, len(pats))
		for i, re := range pats {
			for _, loc := range re.FindAllStringIndex(l, -1) {
				if loc[0] >= from {
					out[i] = append(out[i], l[loc[0]:loc[1]])
				}
			}
		}
		return out
	}
	var prev [][]string
	havePrev := false
	expanded := 0
	for l := range strings.SplitSeq(text, "\n") {
		n, isMarker := parseMarker(l)
		cur, times := prev, n
		if !isMarker || !havePrev {
			cur, times = of(l), 1
			prev, havePrev = cur, !isMarker
		}
		if times > maxExpanded-expanded {
			return nil, false
		}
		expanded += times
		for range times {
			for i := range seq {
				seq[i] = append(seq[i], cur[i]...)
			}
		}
	}
	return seq, true
}

// checkText checks the properties of c.Text on one input: see
// FuzzProtectedEntitiesSurvive.
func checkText(t *testing.T, c *Compressor, pats []*regexp.Regexp, in string, strip bool) string {
	t.Helper()
	out := c.Text(in)
	if again := c.Text(out); again != out {
		t.Fatalf("not idempotent:\nin:    %q\nonce:  %q\ntwice: %q", in, out, again)
	}
	if len(out) > len(in) {
		t.Fatalf("output longer than input:\nin:  %q\nout: %q", in, out)
	}
	want, ok1 := entitySeq(c, pats, in, strip)
	got, ok2 := entitySeq(c, pats, out, strip)
	if ok1 && ok2 {
		for i := range pats {
			if !slices.Equal(want[i], got[i]) {
				t.Fatalf("protected entities of %s changed:\nin:   %q\nout:  %q\nwant: %q\ngot:  %q",
					pats[i], in, out, want[i], got[i])
			}
		}
	}
	// Every output line that is not a marker is an input line, in order,
	// as written or with rule 1 applied.
	src := strings.Split(in, "\n")
	j := 0
	for o := range strings.SplitSeq(out, "\n") {
		if _, ok := parseMarker(o); ok {
			continue
		}
		for j < len(src) && o != src[j] && o != squeeze(src[j]) && o != strings.TrimRight(src[j], blanks) {
			j++
		}
		if j == len(src) {
			t.Fatalf("output line %q is no input line:\nin:  %q\nout: %q", o, in, out)
		}
		j++
	}
	return out
}

// FuzzProtectedEntitiesSurvive checks, for any text, with rule 3 on and
// off and with MinRepeat 2 and 3:
//
//   - the protected entities (the matches of cache.ProtectedPatternsDefault,
//     per pattern, in order) of the output, each marker read as N copies of
//     the line above it, are those of the input; with rule 3 off this holds
//     for every match, with rule 3 on for every match outside a leading
//     timestamp;
//   - compressing twice gives what compressing once gave;
//   - the output is no longer than the input, so its token estimate is no
//     larger;
//   - every output line that is not a marker is an input line, in order,
//     unchanged or with rule 1 applied;
//   - Request compresses user text and tool results that way, leaves the
//     system prompt and assistant turns alone and counts the tokens saved.
func FuzzProtectedEntitiesSurvive(f *testing.F) {
	pats := make([]*regexp.Regexp, 0)
	for _, p := range cache.ProtectedPatternsDefault() {
		pats = append(pats, regexp.MustCompile(p))
	}
	type variant struct {
		c     *Compressor
		strip bool
	}
	var variants []variant
	for _, cfg := range []Config{{}, {MinRepeat: 2}, {KeepTimestamps: true}, {KeepTimestamps: true, MinRepeat: 2}} {
		c, err := New(cfg)
		if err != nil {
			f.Fatal(err)
		}
		variants = append(variants, variant{c, !cfg.KeepTimestamps})
	}

	// The head of the fixture, to its first marker (a seed as long as the
	// whole fixture slows fuzzing down more than it helps).
	fixture := readFixture(f)
	f.Add(fixture[:strings.Index(fixture, "2024-11-03T08:15:23.317Z")])
	for _, s := range []string{
		"",
		"\n\n\n",
		lines(repeat(retry, 5)...),
		lines("ECU  BMS  P0A80", "ECU  BMS  P0A80", "ECU  BMS  P0A80"),
		lines("ECU\t\tBMS", "ECU\t\tBMS   ", "ECU \tBMS"),
		lines("2024-11-03T08:15:20.280Z U0100 lost", "2024-11-03T08:15:20.380Z U0100 lost", "2024-11-03T08:15:20.480Z U0101 lost"),
		lines("2024-11-03T08:15:20.280Z U0100 lost", "2024-11-03T08:15:20.380Z U0100 lost", "2024-11-03T08:15:20.480Z U0100 lost", "[previous line repeated 3 more times]"),
		lines("[previous line repeated 3 more times]", "x", "[previous  line repeated 2 more times]  "),
		lines("Nov  3 08:15:20 ECU-7E0 2.4.1", "Nov  3 08:15:21 ECU-7E0 2.4.1", "Nov  3 08:15:22 ECU-7E0 2.4.1"),
		lines("(1730621760.000000) can0 7E0#023E80", "(1730621762.001375) can0 7E0#023E80", "(1730621764.002750) can0 7E0#023E80"),
		lines("ECU  7E0 v10.3  ", "ECU  7E0 v10.3", "ECU  7E0 v10.3 "),
		lines("08:15:20 ECU", "08:15:21 ECU", "08:15:22 ECU"),
		lines("x", "[previous line repeated 99999999999999999999 more times]"),
		lines("x", "[previous line repeated 1000000000 more times]"),
		lines("x", "[previous line repeated 9223372036854775807 more times]", "[previous line repeated 9 more times]"),
		"Nov   3 08:15:20 0",
		lines("0000-00-00T00:00:00.000Z B0000 a", "0000-00-00T00:A:0 A B0000 a", "0000-00-00T00:00:00.000Z B0000 a"),
		"ECU-7E0  5Q0-937-084-B  \r\n  P0A80 \t v2.4.1\r\n\r\n\r\n\r\nU0100  1730621760123",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		for l := range strings.SplitSeq(in, "\n") {
			checkTimestamp(t, l)
		}
		for _, v := range variants {
			checkText(t, v.c, pats, in, v.strip)
		}
		c := variants[0].c
		req := &llm.Request{
			System: in,
			Messages: []llm.Message{
				{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: in}}},
				{Role: llm.RoleAssistant, Content: []llm.Block{{Type: llm.BlockText, Text: in}}},
				{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockToolResult, ToolUseID: "t", Text: in}}},
			},
			MaxTokens: 100,
		}
		out, saved := c.Request(req)
		want := c.Text(in)
		if out.System != in || out.Messages[1].Content[0].Text != in {
			t.Fatalf("system prompt or assistant turn changed")
		}
		if out.Messages[0].Content[0].Text != want || out.Messages[2].Content[0].Text != want {
			t.Fatalf("user text or tool result not compressed as Text")
		}
		if req.Messages[0].Content[0].Text != in || req.Messages[2].Content[0].Text != in {
			t.Fatalf("input modified")
		}
		if d := llm.EstimateTokens(req) - llm.EstimateTokens(&out); saved != d || saved < 0 {
			t.Fatalf("saved %d, want %d >= 0", saved, d)
		}
	})
}
