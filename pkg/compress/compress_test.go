package compress

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"bulwark/pkg/cache"
	"bulwark/pkg/llm"
)

func mustNew(t testing.TB, cfg Config) *Compressor {
	t.Helper()
	c, err := New(cfg)
	require.NoError(t, err)
	return c
}

// lines joins its arguments with "\n".
func lines(l ...string) string { return strings.Join(l, "\n") }

// repeat returns n copies of l.
func repeat(l string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = l
	}
	return out
}

const retry = "[GW] U0100 lost communication with ECM"

type textCase struct {
	name    string
	cfg     Config
	in, out string
}

func runTextCases(t *testing.T, cases []textCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := mustNew(t, tt.cfg)
			got := c.Text(tt.in)
			require.Equal(t, tt.out, got)
			require.Equal(t, got, c.Text(got), "not idempotent")
		})
	}
}

func TestRule1WhiteSpace(t *testing.T) {
	t.Parallel()
	runTextCases(t, []textCase{
		{name: "inner runs and trailing blanks", in: "DTC  P0A80\t\tstored   \t", out: "DTC P0A80 stored"},
		{name: "leading indentation kept", in: "    \"dtc\":    \"P0A80\",", out: "    \"dtc\": \"P0A80\","},
		{name: "single tab kept", in: "7E8\t03 7F 22 31", out: "7E8\t03 7F 22 31"},
		{name: "CRLF line ends", in: "a\r\nb  c\r\n", out: "a\nb c\n"},
		{name: "carriage return inside a line kept", in: "a\rb", out: "a\rb"},
		{name: "unicode spaces kept", in: "a\u00a0\u00a0b\u2003\u2003c", out: "a\u00a0\u00a0b\u2003\u2003c"},
		{name: "three blank lines become one", in: lines("a", "", "", "", "b"), out: lines("a", "", "b")},
		{name: "many blank lines become one", in: lines("a", "", "", "", "", "", "", "b"), out: lines("a", "", "b")},
		{name: "two blank lines kept", in: lines("a", "", "", "b"), out: lines("a", "", "", "b")},
		{name: "blank-only lines are blank", in: lines("a", "  ", "\t", " \r", "b"), out: lines("a", "", "b")},
		{name: "leading and trailing blank lines", in: "\n\n\n\na\n\n\n\n", out: "\na\n"},
		{name: "squeeze would create an ECU id", in: "ECU  BMS timeout", out: "ECU  BMS timeout"},
		{name: "squeeze would create an ECU id, trailing blanks still go", in: "ECU\t\tBMS timeout  ", out: "ECU\t\tBMS timeout"},
		{name: "ECU id already there", in: "ECU BMS   timeout", out: "ECU BMS timeout"},
		{name: "empty", in: "", out: ""},
		{name: "only newlines", in: "\n", out: "\n"},
	})
}

func TestRule2RepeatedLines(t *testing.T) {
	t.Parallel()
	runTextCases(t, []textCase{
		{
			name: "run of five",
			in:   lines(append(append([]string{"start"}, repeat(retry, 5)...), "end")...),
			out:  lines("start", retry, "[previous line repeated 4 more times]", "end"),
		},
		{
			name: "at least MinRepeat",
			in:   lines(repeat(retry, 3)...),
			out:  lines(retry, "[previous line repeated 2 more times]"),
		},
		{
			name: "below MinRepeat",
			in:   lines(repeat(retry, 2)...),
			out:  lines(repeat(retry, 2)...),
		},
		{
			name: "MinRepeat 2",
			cfg:  Config{MinRepeat: 2},
			in:   lines(repeat(retry+" (gateway ECU_GW01 reports)", 2)...),
			out:  lines(retry+" (gateway ECU_GW01 reports)", "[previous line repeated 1 more time]"),
		},
		{
			name: "MinRepeat 10",
			cfg:  Config{MinRepeat: 10},
			in:   lines(repeat(retry, 9)...),
			out:  lines(repeat(retry, 9)...),
		},
		{
			name: "not worth a marker",
			in:   lines(repeat("ok", 6)...),
			out:  lines(repeat("ok", 6)...),
		},
		{
			name: "equal after rule 1",
			in:   lines(retry, "[GW]    U0100   lost communication with ECM", retry+"  "),
			out:  lines(retry, "[previous line repeated 2 more times]"),
		},
		{
			name: "a different DTC breaks the run",
			in: lines(retry, retry, "[GW] U0101 lost communication with ECM", retry, retry,
				retry),
			out: lines(retry, retry, "[GW] U0101 lost communication with ECM", retry,
				"[previous line repeated 2 more times]"),
		},
		{
			name: "a different version is a different line",
			in:   lines("ECU-7E0 SW version 2.4.1 flash failed", "ECU-7E0 SW version 2.4.2 flash failed", "ECU-7E0 SW version 2.4.1 flash failed"),
			out:  lines("ECU-7E0 SW version 2.4.1 flash failed", "ECU-7E0 SW version 2.4.2 flash failed", "ECU-7E0 SW version 2.4.1 flash failed"),
		},
		{
			name: "a different ECU is a different line",
			in:   lines("ECU-7E0 no response", "ECU-7E8 no response", "ECU-7E0 no response", "ECU-7E0 no response"),
			out:  lines("ECU-7E0 no response", "ECU-7E8 no response", "ECU-7E0 no response", "ECU-7E0 no response"),
		},
		{
			name: "a retry counter makes lines different",
			in:   lines(retry+" retry 1/3", retry+" retry 2/3", retry+" retry 3/3"),
			out:  lines(retry+" retry 1/3", retry+" retry 2/3", retry+" retry 3/3"),
		},
		{
			name: "a blank line breaks the run",
			in:   lines(retry, retry, "", retry, retry),
			out:  lines(retry, retry, "", retry, retry),
		},
		{
			name: "markers in the input never join a run",
			in:   lines(retry, retry, retry, "[previous line repeated 2 more times]", "[previous line repeated 2 more times]", "[previous line repeated 2 more times]"),
			out:  lines(retry, "[previous line repeated 2 more times]", "[previous line repeated 2 more times]", "[previous line repeated 2 more times]", "[previous line repeated 2 more times]"),
		},
		{
			name: "indented lines",
			in:   lines(repeat("    at com.acme.can.Gateway.poll(Gateway.java:118)", 4)...),
			out:  lines("    at com.acme.can.Gateway.poll(Gateway.java:118)", "[previous line repeated 3 more times]"),
		},
	})
}

func TestRule3Timestamps(t *testing.T) {
	t.Parallel()
	iso := []string{
		"2024-11-03T08:15:20.280Z " + retry,
		"2024-11-03T08:15:20.380Z " + retry,
		"2024-11-03T08:15:20.480Z " + retry,
		"2024-11-03T08:15:20.580Z " + retry,
	}
	runTextCases(t, []textCase{
		{
			name: "ISO 8601",
			in:   lines(iso...),
			out:  lines(iso[0], "[previous line repeated 3 more times, last at 2024-11-03T08:15:20.580Z]"),
		},
		{
			name: "rule 3 off",
			cfg:  Config{KeepTimestamps: true},
			in:   lines(iso...),
			out:  lines(iso...),
		},
		{
			name: "equal timestamps give the plain marker",
			in:   lines(iso[0], iso[0], iso[0]),
			out:  lines(iso[0], "[previous line repeated 2 more times]"),
		},
		{
			name: "equal timestamps, rule 3 off",
			cfg:  Config{KeepTimestamps: true},
			in:   lines(iso[0], iso[0], iso[0]),
			out:  lines(iso[0], "[previous line repeated 2 more times]"),
		},
		{
			name: "ISO with space, comma and offset",
			in: lines("2024-11-03 08:15:20,280+01:00 "+retry, "2024-11-03 08:15:20,380+01:00 "+retry,
				"2024-11-03 08:15:21,000+01:00 "+retry),
			out: lines("2024-11-03 08:15:20,280+01:00 "+retry,
				"[previous line repeated 2 more times, last at 2024-11-03 08:15:21,000+01:00]"),
		},
		{
			name: "bracketed",
			in:   lines("[2024-11-03 08:15:20.280] "+retry, "[2024-11-03 08:15:20.380] "+retry, "[2024-11-03 08:15:20.480] "+retry),
			out:  lines("[2024-11-03 08:15:20.280] "+retry, "[previous line repeated 2 more times, last at 2024-11-03 08:15:20.480]"),
		},
		{
			name: "syslog, day padded",
			in:   lines("Nov  3 08:15:20 gw can-diag: "+retry, "Nov  3 08:15:21 gw can-diag: "+retry, "Nov  3 08:15:22 gw can-diag: "+retry),
			out:  lines("Nov 3 08:15:20 gw can-diag: "+retry, "[previous line repeated 2 more times, last at Nov 3 08:15:22]"),
		},
		{
			name: "candump epoch",
			in: lines("(1730621760.000000) can0 7E0#023E800000000000", "(1730621762.001375) can0 7E0#023E800000000000",
				"(1730621764.002750) can0 7E0#023E800000000000"),
			out: lines("(1730621760.000000) can0 7E0#023E800000000000",
				"[previous line repeated 2 more times, last at 1730621764.002750]"),
		},
		{
			name: "epoch milliseconds",
			in:   lines("1730621760000 "+retry, "1730621760100 "+retry, "1730621760200 "+retry),
			out:  lines("1730621760000 "+retry, "[previous line repeated 2 more times, last at 1730621760200]"),
		},
		{
			name: "clock time",
			in:   lines("08:15:20.280 "+retry, "08:15:20.380 "+retry, "08:15:20.480 "+retry),
			out:  lines("08:15:20.280 "+retry, "[previous line repeated 2 more times, last at 08:15:20.480]"),
		},
		{
			name: "a different DTC breaks the run",
			in:   lines(iso[0], iso[1], "2024-11-03T08:15:20.430Z [GW] U0101 lost communication with ECM", iso[2], iso[3]),
			out:  lines(iso[0], iso[1], "2024-11-03T08:15:20.430Z [GW] U0101 lost communication with ECM", iso[2], iso[3]),
		},
		{
			name: "time going backwards breaks the run",
			in:   lines(iso[0], iso[1], iso[0], iso[1]),
			out:  lines(iso[0], iso[1], iso[0], iso[1]),
		},
		{
			name: "timestamps of another shape break the run",
			in:   lines(iso[0], iso[1], "2024-11-03T08:15:20.48Z "+retry, "2024-11-03T08:15:20.58Z "+retry),
			out:  lines(iso[0], iso[1], "2024-11-03T08:15:20.48Z "+retry, "2024-11-03T08:15:20.58Z "+retry),
		},
		{
			name: "bare decimal is not a timestamp (reads as a version)",
			in:   lines("1.234567 "+retry, "1.334567 "+retry, "1.434567 "+retry),
			out:  lines("1.234567 "+retry, "1.334567 "+retry, "1.434567 "+retry),
		},
		{
			name: "eleven digits are not an epoch",
			in:   lines("17306217600 "+retry, "17306217601 "+retry, "17306217602 "+retry),
			out:  lines("17306217600 "+retry, "17306217601 "+retry, "17306217602 "+retry),
		},
		{
			name: "timestamp not at the start",
			in:   lines("gw 2024-11-03T08:15:20.280Z "+retry, "gw 2024-11-03T08:15:20.380Z "+retry, "gw 2024-11-03T08:15:20.480Z "+retry),
			out:  lines("gw 2024-11-03T08:15:20.280Z "+retry, "gw 2024-11-03T08:15:20.380Z "+retry, "gw 2024-11-03T08:15:20.480Z "+retry),
		},
		{
			name: "timestamp alone is no line body",
			in:   lines("2024-11-03T08:15:20.280Z", "2024-11-03T08:15:20.380Z", "2024-11-03T08:15:20.480Z"),
			out:  lines("2024-11-03T08:15:20.280Z", "2024-11-03T08:15:20.380Z", "2024-11-03T08:15:20.480Z"),
		},
		{
			name: "timestamped and plain lines do not mix",
			in:   lines(iso[0], iso[1], retry, retry),
			out:  lines(iso[0], iso[1], retry, retry),
		},
	})
}

// A custom protected pattern that can straddle the end of a timestamp
// stops rule 3 for those lines.
func TestRule3ProtectedMatchAcrossTimestamp(t *testing.T) {
	t.Parallel()
	c := mustNew(t, Config{ProtectedPatterns: []string{`\d{2} U0100`}})
	const l = " U0100 lost communication with ECM"
	in := lines("08:15:20.280"+l, "08:15:20.380"+l, "08:15:20.480"+l)
	require.Equal(t, in, c.Text(in))
	c = mustNew(t, Config{ProtectedPatterns: []string{`U0100`}})
	require.Equal(t, lines("08:15:20.280"+l, "[previous line repeated 2 more times, last at 08:15:20.480]"), c.Text(in))
}

// With no protected patterns rule 1 squeezes everything, and rules 2 and
// 3 still merge only equal lines.
func TestNoProtectedPatterns(t *testing.T) {
	t.Parallel()
	c := mustNew(t, Config{ProtectedPatterns: []string{}})
	require.Equal(t, "ECU BMS timeout", c.Text("ECU  BMS timeout"))
	in := lines("ECU-7E0 no response", "ECU-7E8 no response", "ECU-7E0 no response")
	require.Equal(t, in, c.Text(in))
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  Config
		err  string
	}{
		{"defaults", Config{}, ""},
		{"MinRepeat 1", Config{MinRepeat: 1}, "MinRepeat 1"},
		{"MinRepeat negative", Config{MinRepeat: -3}, "MinRepeat -3"},
		{"bad pattern", Config{ProtectedPatterns: []string{`P0A80`, `(`}}, "ProtectedPatterns[1]"},
		{"empty-matching pattern", Config{ProtectedPatterns: []string{`\d*`}}, "empty string"},
		{"empty-matching assertion", Config{ProtectedPatterns: []string{`\b`}}, "empty string"},
		{"empty-matching alternative", Config{ProtectedPatterns: []string{`P0A80|`}}, "empty string"},
		{"no patterns", Config{ProtectedPatterns: []string{}}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(tt.cfg)
			if tt.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.err)
		})
	}
	cfg := Config{}.WithDefaults()
	require.Equal(t, MinRepeatDefault, cfg.MinRepeat)
	require.Equal(t, cache.ProtectedPatternsDefault(), cfg.ProtectedPatterns)
	own := []string{`P0A80`}
	cfg = Config{ProtectedPatterns: own}.WithDefaults()
	cfg.ProtectedPatterns[0] = "changed"
	require.Equal(t, `P0A80`, own[0], "WithDefaults shares the caller's slice")
}

func TestAnalyse(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		p               string
		blank, anchored bool
	}{
		{`(?i)\b[PCBU][0-9A-F]{4}\b`, false, false},
		{`\bECU[-_ ]?[A-Z0-9]+\b`, true, false},
		{`\b[0-9A-Z]{2,5}(?:-[0-9A-Z]{2,6}){1,3}\b`, false, false},
		{`\bv?\d+\.\d+(?:\.\d+)*\b`, false, false},
		{`\b\d+\b`, false, false},
		{`\s+P\d+`, true, false},
		{`P.1`, true, false},
		{`\d+$`, false, true},
		{`(?m)^ECU`, false, true},
		{`[^A-Z]P0A80`, true, false},
	} {
		a, err := analyse(tt.p)
		require.NoError(t, err, tt.p)
		require.Equal(t, tt.blank, a.blank, "blank %s", tt.p)
		require.Equal(t, tt.anchored, a.anchored, "anchored %s", tt.p)
	}
}

// An anchored custom pattern is checked by rule 1: trailing blanks that
// keep "12" from matching \d+$ stay.
func TestRule1AnchoredPattern(t *testing.T) {
	t.Parallel()
	c := mustNew(t, Config{ProtectedPatterns: []string{`\d+$`}})
	require.Equal(t, "odometer  12  ", c.Text("odometer  12  "))
	require.Equal(t, "odometer 12", c.Text("odometer  12"))
}

func TestRequest(t *testing.T) {
	t.Parallel()
	c := mustNew(t, Config{})
	log := lines(append([]string{"ECU-7E0  SW  version  2.4.1"}, repeat(retry, 50)...)...)
	want := lines("ECU-7E0 SW version 2.4.1", retry, "[previous line repeated 49 more times]")
	temp := 0.2
	req := &llm.Request{
		Model:  "claude-sonnet-4-5",
		System: "You are a vehicle diagnosis assistant.\n\n\n\n" + log,
		Messages: []llm.Message{
			{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: log}}},
			{Role: llm.RoleAssistant, Content: []llm.Block{
				{Type: llm.BlockText, Text: log},
				{Type: llm.BlockToolUse, ToolUseID: "t1", ToolName: "read_dtcs", Input: json.RawMessage(`{"ecu":  "ECU-7E0",   "log":  "a  b"}`)},
			}},
			{Role: llm.RoleUser, Content: []llm.Block{
				{Type: llm.BlockToolResult, ToolUseID: "t1", Text: log, IsError: true},
				{Type: llm.BlockText, Text: "and  now?  "},
			}},
		},
		MaxTokens:     1024,
		Temperature:   &temp,
		StopSequences: []string{"\n\n\n"},
		Tools:         []llm.Tool{{Name: "read_dtcs", InputSchema: json.RawMessage(`{"type":  "object"}`)}},
	}
	before, err := json.Marshal(req)
	require.NoError(t, err)

	out, saved := c.Request(req)

	after, err := json.Marshal(req)
	require.NoError(t, err)
	require.JSONEq(t, string(before), string(after), "the input was modified")

	require.Equal(t, req.System, out.System)
	require.Equal(t, req.Messages[1], out.Messages[1], "assistant turn changed")
	require.Equal(t, want, out.Messages[0].Content[0].Text)
	require.Equal(t, want, out.Messages[2].Content[0].Text)
	require.Equal(t, "and now?", out.Messages[2].Content[1].Text)
	require.Equal(t, "t1", out.Messages[2].Content[0].ToolUseID)
	require.True(t, out.Messages[2].Content[0].IsError)
	require.Equal(t, req.Tools, out.Tools)
	require.Equal(t, req.MaxTokens, out.MaxTokens)
	require.Equal(t, req.Model, out.Model)
	require.Equal(t, llm.EstimateTokens(req)-llm.EstimateTokens(&out), saved)
	require.Positive(t, saved)

	// The copy's messages are its own.
	out.Messages[0].Content[0].Text = "changed"
	out.Messages[1].Content[0].Text = "changed"
	require.Equal(t, log, req.Messages[0].Content[0].Text)
	require.Equal(t, log, req.Messages[1].Content[0].Text)

	// Nothing to compress: nothing saved.
	plain := &llm.Request{Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: "P0A80 on ECU BMS?"}}}}}
	out, saved = c.Request(plain)
	require.Equal(t, *plain, out)
	require.Zero(t, saved)
}

func TestRequestNilCompressor(t *testing.T) {
	t.Parallel()
	var c *Compressor
	req := &llm.Request{Messages: []llm.Message{{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: lines(repeat(retry, 10)...)}}}}}
	out, saved := c.Request(req)
	require.Equal(t, *req, out)
	require.Zero(t, saved)
	out.Messages[0].Content[0].Text = "changed"
	require.NotEqual(t, "changed", req.Messages[0].Content[0].Text)
	require.Equal(t, "a  b", c.Text("a  b"))

	out, saved = c.Request(&llm.Request{})
	require.Nil(t, out.Messages)
	require.Zero(t, saved)
}
