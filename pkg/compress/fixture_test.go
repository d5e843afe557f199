package compress

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"bulwark/pkg/cache"
	"bulwark/pkg/llm"
)

// fixturePath is a UDS diagnostic session through a gateway as a tester
// logs it: session start, version reads, stored DTCs, then 200 "U0100 lost
// communication with ECM" retries in eight bursts, between them other
// ECUs' DTCs (U0101, P0AFA, B1A00, C1234), version reads and a flash
// attempt, then a candump -l excerpt of tester-present frames. Columns are
// padded with blanks and the candump lines carry trailing blanks, as real
// captures do.
const fixturePath = "testdata/ecu_can_uds.log"

func readFixture(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(fixturePath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func fixtureRequest(t testing.TB) *llm.Request {
	return &llm.Request{
		System: "You are a vehicle diagnosis assistant. Find the root cause of the failed OTA update.",
		Messages: []llm.Message{
			{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "Why did OTA batch 7 fail on this car? Gateway log:"}}},
			{Role: llm.RoleAssistant, Content: []llm.Block{{Type: llm.BlockToolUse, ToolUseID: "t1", ToolName: "fetch_log", Input: []byte(`{"vin":"WVWZZZ3HZPE123456"}`)}}},
			{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockToolResult, ToolUseID: "t1", Text: readFixture(t)}}},
		},
		MaxTokens: 1024,
	}
}

func TestFixture(t *testing.T) {
	t.Parallel()
	c := mustNew(t, Config{})
	req := fixtureRequest(t)
	out, saved := c.Request(req)

	in := req.Messages[2].Content[0].Text
	got := out.Messages[2].Content[0].Text
	inTokens := llm.EstimateTokens(req) - req.MaxTokens
	t.Logf("fixture: %d lines, %d bytes -> %d lines, %d bytes; request input tokens %d -> %d, saved %d (%.1f%%)",
		strings.Count(in, "\n"), len(in), strings.Count(got, "\n"), len(got),
		inTokens, inTokens-saved, saved, 100*float64(saved)/float64(inTokens))
	require.GreaterOrEqual(t, 100*saved, 50*inTokens, "saved less than half of the input tokens")

	// Every distinct DTC, ECU id, part number and version of the log is in
	// the compressed log, and in the same order of first appearance. As
	// for the cache's guard, timestamps are not entities (the fractional
	// seconds of candump's 1730621762.001375 read as a version).
	unstamped := func(s string) string {
		for _, p := range cache.IgnoredPatternsDefault() {
			s = regexp.MustCompile(p).ReplaceAllLiteralString(s, " ")
		}
		return s
	}
	for i, p := range cache.ProtectedPatternsDefault()[:4] {
		re := regexp.MustCompile(p)
		require.Equal(t, distinct(re.FindAllString(unstamped(in), -1)), distinct(re.FindAllString(unstamped(got), -1)), "pattern %d %s", i, p)
	}
	for _, e := range []string{
		"U0100", "U0101", "P0A80", "P0A7F", "P0AFA", "B1A00", "C1234",
		"ECU-7E0", "ECU-7E1", "ECU BMS", "ECU_GW01", "ECU BCM", "ECU ABS",
		"2.4.1", "10.3.7", "v1.8", "3.1.0", "2.5.0", "5.2.0", "5Q0-937-084-B", "WVWZZZ3HZPE123456",
	} {
		require.Contains(t, got, e)
	}
	// Read back (markers expanded, timestamps aside) it has the same
	// entities, each as often and in the same order.
	pats := c.protected
	want, _ := entitySeq(c, pats, in, true)
	have, _ := entitySeq(c, pats, got, true)
	require.Equal(t, want, have)

	// The retries are gone but for one line per burst and its marker; the
	// lone U0101 line between two bursts is kept.
	require.Equal(t, 200, strings.Count(in, "U0100 lost communication with ECM"))
	require.Equal(t, 8, strings.Count(got, "U0100 lost communication with ECM"))
	require.Contains(t, got, "2024-11-03T08:15:20.280Z [GW] U0100 lost communication with ECM\n"+
		"[previous line repeated 29 more times, last at 2024-11-03T08:15:23.180Z]\n")
	require.Contains(t, got, "[GW] U0101 lost communication with TCM\n")
	require.Contains(t, got, "(1730621760.000000) can0 7E0#023E800000000000\n"+
		"[previous line repeated 11 more times, last at 1730621782.015125]\n"+
		"(1730621784.016500) can0 7E8#037F3E7F00000000\n")
	require.Equal(t, got, c.Text(got))

	if testing.Verbose() {
		t.Logf("compressed fixture:\n%s", got)
	}
}

// distinct returns the values of s, each once, in order of first
// appearance.
func distinct(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// BenchmarkRequest compresses the fixture request (a 246-line, 16.5 kB
// tool result): bytes/s is of the tool result, saved-tokens/op what it
// saves.
func BenchmarkRequest(b *testing.B) {
	c := mustNew(b, Config{})
	req := fixtureRequest(b)
	b.SetBytes(int64(len(req.Messages[2].Content[0].Text)))
	b.ReportAllocs()
	saved := 0
	for b.Loop() {
		_, saved = c.Request(req)
	}
	b.ReportMetric(float64(saved), "saved-tokens/op")
}
