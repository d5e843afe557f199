package compress

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// tsSpec is the grammar of leading timestamps as a regular expression
// (see leadingTimestamp), against which the hand-written parser is held.
var tsSpec = func() *regexp.Regexp {
	const (
		iso    = `\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?`
		syslog = `(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}\d{1,2} \d{2}:\d{2}:\d{2}(?:\.\d{1,9})?`
		epoch  = `1\d{9}(?:\d{3})?(?:\.\d{1,9})?`
		clock  = `\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?`
		ts     = `(?:` + iso + `|` + syslog + `|` + epoch + `|` + clock + `)`
	)
	return regexp.MustCompile(`^(?:\[(` + ts + `)\]|\((` + ts + `)\)|(` + ts + `))[ \t]`)
}()

// checkTimestamp fails unless leadingTimestamp(t) agrees with tsSpec.
func checkTimestamp(t *testing.T, s string) {
	t.Helper()
	end, inner, ok := leadingTimestamp(s)
	m := tsSpec.FindStringSubmatchIndex(s)
	if (m != nil) != ok {
		t.Fatalf("leadingTimestamp(%q) ok = %v, the grammar says %v", s, ok, m != nil)
	}
	if !ok {
		return
	}
	wantInner := ""
	for g := 1; g <= 3; g++ {
		if m[2*g] >= 0 {
			wantInner = s[m[2*g]:m[2*g+1]]
		}
	}
	if end != m[1]-1 || inner != wantInner {
		t.Fatalf("leadingTimestamp(%q) = %d, %q; the grammar says %d, %q", s, end, inner, m[1]-1, wantInner)
	}
}

func TestLeadingTimestamp(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		line, inner string
	}{
		{"2024-11-03T08:15:22.123Z x", "2024-11-03T08:15:22.123Z"},
		{"2024-11-03T08:15:22Z x", "2024-11-03T08:15:22Z"},
		{"2024-11-03T08:15:22 x", "2024-11-03T08:15:22"},
		{"2024-11-03 08:15:22,123+01:00 x", "2024-11-03 08:15:22,123+01:00"},
		{"2024-11-03T08:15:22.123456789-0500\tx", "2024-11-03T08:15:22.123456789-0500"},
		{"[2024-11-03 08:15:22.123] x", "2024-11-03 08:15:22.123"},
		{"(2024-11-03 08:15:22.123) x", "2024-11-03 08:15:22.123"},
		{"Nov  3 08:15:22 gw x", "Nov  3 08:15:22"},
		{"Nov 13 08:15:22.5 gw x", "Nov 13 08:15:22.5"},
		{"Nov 3 08:15:22 gw x", "Nov 3 08:15:22"},
		{"(1730621760.000000) can0 7E0#02", "1730621760.000000"},
		{"1730621760123 x", "1730621760123"},
		{"1730621760 x", "1730621760"},
		{"08:15:22.123 x", "08:15:22.123"},
		{"08:15:22 x", "08:15:22"},
		{"[08:15:22,5] x", "08:15:22,5"},
		{"2024-11-03T08:15:22.1234567890 x", ""},
		{"2024-11-03T08:15:22.123+01:0 x", ""},
		{"2024-11-03T08:15 x", ""},
		{"2024-11-03 x", ""},
		{"2024-11-03T08:15:22.123Z", ""},
		{"2024-11-03T08:15:22.123Zx", ""},
		{"[2024-11-03T08:15:22.123Z x", ""},
		{"[2024-11-03T08:15:22.123Z) x", ""},
		{"Nov   3 08:15:22 x", ""},
		{"Nov 123 08:15:22 x", ""},
		{"Nov3 08:15:22 x", ""},
		{"Foo  3 08:15:22 x", ""},
		{"17306217601 x", ""},
		{"2730621760 x", ""},
		{"1.234567 x", ""},
		{"8:15:22 x", ""},
		{" 08:15:22 x", ""},
		{"", ""},
	} {
		checkTimestamp(t, tt.line)
		end, inner, ok := leadingTimestamp(tt.line)
		require.Equal(t, tt.inner != "", ok, tt.line)
		require.Equal(t, tt.inner, inner, tt.line)
		if ok {
			require.Contains(t, " \t", string(tt.line[end]), tt.line)
		}
	}
}

func FuzzLeadingTimestamp(f *testing.F) {
	for _, s := range []string{
		"2024-11-03T08:15:22.123Z x", "2024-11-03 08:15:22,123+01:00 x", "[2024-11-03 08:15:22.123] x",
		"Nov  3 08:15:22 x", "(1730621760.000000) can0", "1730621760123 x", "08:15:22.123 x",
		"2024-11-03T08:15:22.123+01:0 x", "Nov 123 08:15:22 x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkTimestamp(t, s)
	})
}
