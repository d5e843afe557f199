package compactjson

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMarshalCostsItsContent(t *testing.T) {
	for name, s := range map[string]string{
		"html":       strings.Repeat("<>&", 1000),
		"separators": strings.Repeat("\u2028\u2029", 1000),
		"plain":      strings.Repeat("a", 3000),
	} {
		t.Run(name, func(t *testing.T) {
			b, err := Marshal(map[string]string{"s": s})
			if err != nil {
				t.Fatal(err)
			}
			if over := len(b) - len(s); over > len(`{"s":""}`) {
				t.Errorf("encoding costs %d bytes over its %d bytes of content", over, len(s))
			}
			var back map[string]string
			if err := json.Unmarshal(b, &back); err != nil || back["s"] != s {
				t.Errorf("does not decode back: %v", err)
			}
		})
	}
}

// A text that spells an escape out keeps it spelled out.
func TestMarshalKeepsSpelledOutEscapes(t *testing.T) {
	for _, s := range []string{`\u2028`, `\\u2029`, "x\\\u2028y", `\`, "\"\u2028\"", "\x01\u2029\b"} {
		b, err := Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back string
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Errorf("Marshal(%q) = %s, decodes to %q (%v)", s, b, back, err)
		}
	}
}

func FuzzMarshal(f *testing.F) {
	for _, s := range []string{"", `\u2028`, "\u2028", "<&>", "\\\u2029\\u2029"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := Marshal([]string{s})
		if err != nil {
			t.Fatal(err)
		}
		std, _ := json.Marshal([]string{s})
		if len(b) > len(std) {
			t.Errorf("longer than encoding/json: %d > %d", len(b), len(std))
		}
		var back, want []string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("invalid JSON %q: %v", b, err)
		}
		_ = json.Unmarshal(std, &want)
		if back[0] != want[0] {
			t.Errorf("decodes to %q, encoding/json's to %q", back[0], want[0])
		}
	})
}
