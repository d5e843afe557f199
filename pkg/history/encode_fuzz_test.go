package history

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"bulwark/pkg/llm"
)

// FuzzStoredRecord: whatever an answer and a reason hold, what the row
// encoder sends PostgreSQL is accepted (the jsonb is valid JSON without
// \u0000, valid UTF-8; text is valid UTF-8 without NUL), text that needed
// no change is unchanged, and the stored answer reads back as the answer
// itself would after a plain JSON round trip (NUL and U+FFFF included).
func FuzzStoredRecord(f *testing.F) {
	for _, s := range []string{"", "plain answer", "a\x00b", "\uffff", "\uffff0", "\uffff\x00\uffff", "\xff\xfe", "\xe2\x82",
		`\u0000`, `"\u0000"`, "end\x00", "\ufffd", "<&>\u2028"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, answer, reason string) {
		got := text(reason)
		if !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("text(%q) = %q: PostgreSQL refuses it", reason, got)
		}
		if utf8.ValidString(reason) && strings.IndexByte(reason, 0) < 0 && got != reason {
			t.Fatalf("text(%q) = %q: changed text that needed no change", reason, got)
		}

		resp := &llm.Response{Model: reason, Content: []llm.Block{{Type: llm.BlockText, Text: answer}}}
		if in, err := json.Marshal(answer); err == nil {
			resp.Content = append(resp.Content, llm.Block{Type: llm.BlockToolUse, Input: json.RawMessage(`{"x":` + string(in) + `}`)})
		}
		b, err := storedJSON(resp)
		if err != nil {
			t.Fatalf("storedJSON: %v", err)
		}
		if !json.Valid(b) || !utf8.Valid(b) || hasNULEscape(b) || bytes.IndexByte(b, 0) >= 0 {
			t.Fatalf("stored JSON %q: PostgreSQL refuses it", b)
		}
		plain, err := json.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var want, read llm.Response
		if err := json.Unmarshal(plain, &want); err != nil {
			t.Fatal(err)
		}
		back, err := decodeStored(b)
		if err != nil {
			t.Fatalf("decodeStored(%q): %v", b, err)
		}
		if err := json.Unmarshal(back, &read); err != nil {
			t.Fatalf("read back %q: %v", back, err)
		}
		if read.Model != want.Model || read.Content[0].Text != want.Content[0].Text {
			t.Fatalf("read back %q / %q, want %q / %q", read.Model, read.Content[0].Text, want.Model, want.Content[0].Text)
		}
		if len(want.Content) > 1 {
			var a, b2 any
			if json.Unmarshal(want.Content[1].Input, &a) != nil || json.Unmarshal(read.Content[1].Input, &b2) != nil ||
				!jsonEqual(a, b2) {
				t.Fatalf("tool input read back %s, want %s", read.Content[1].Input, want.Content[1].Input)
			}
		}
	})
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// hasNULEscape reports whether the JSON text b holds the escape \u0000
// (jsonb refuses it), as opposed to an escaped backslash followed by
// "u0000", which jsonb accepts.
func hasNULEscape(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if bytes.HasPrefix(b[i:], []byte(`\u0000`)) {
			return true
		}
		i++ // skip the escaped character
	}
	return false
}
