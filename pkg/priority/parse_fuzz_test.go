package priority_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"bulwark/pkg/priority"
)

// FuzzParse fuzzes the decoders of a client's priority: the
// X-Bulwark-Priority header (Parse) and the "priority" field of the async
// API (UnmarshalJSON, given the raw JSON value). Whatever they accept is one
// of the four priorities; it prints as a name that parses back to it; and
// the JSON decoder agrees with Parse on strings and with the number itself
// on integers.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"critical", "HIGH", " normal ", "low", "1", "4", "P2", "p3", "0", "5", "-1", "+2", "p+2", "P-0", "0003",
		"urgent", "", "p", "pp1", "9223372036854775808", `"high"`, `"2"`, `2`, `2.0`, `1e0`, `null`, `true`, `["low"]`,
		`"\u0068igh"`, `"P1"`, `" 3 "`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := priority.Parse(s)
		if err == nil {
			if !p.Valid() {
				t.Fatalf("Parse(%q) = %d, not a priority", s, p)
			}
			if back, err := priority.Parse(p.String()); err != nil || back != p {
				t.Fatalf("Parse(%q) = %v, whose name parses to %v, %v", s, p, back, err)
			}
		} else if p != 0 {
			t.Fatalf("Parse(%q) = %d with error %v", s, p, err)
		}

		var j priority.Priority
		if err := j.UnmarshalJSON([]byte(s)); err != nil {
			if j != 0 {
				t.Fatalf("UnmarshalJSON(%s) set %d with error %v", s, j, err)
			}
			return
		}
		if !j.Valid() {
			t.Fatalf("UnmarshalJSON(%s) = %d, not a priority", s, j)
		}
		var str string
		var n int
		switch {
		case json.Unmarshal([]byte(s), &str) == nil:
			if want, err := priority.Parse(str); err != nil || want != j {
				t.Fatalf("UnmarshalJSON(%s) = %v, Parse(%q) = %v, %v", s, j, str, want, err)
			}
		case json.Unmarshal([]byte(s), &n) == nil:
			if priority.Priority(n) != j {
				t.Fatalf("UnmarshalJSON(%s) = %v, want %d", s, j, n)
			}
		default:
			t.Fatalf("UnmarshalJSON accepted %s, neither a string nor an integer", strconv.Quote(s))
		}
	})
}
