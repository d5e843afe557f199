package history

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// What PostgreSQL refuses, and how a row is encoded so that it never does.
// A refused outcome cannot be written at all (retrying fails the same way),
// so its request would later be reported lost although it was answered.
// Every value of a row goes through the two functions below, and only
// they decide what reaches PostgreSQL:
//
//   - text columns (the reason, the key, the tenant, …) refuse NUL bytes
//     and invalid UTF-8 (SQLSTATE 22021): text replaces each NUL and each
//     invalid byte sequence with U+FFFD, the replacement character. Not
//     reversible, and it need not be: these are labels and diagnostics.
//   - the jsonb response refuses the escape \u0000 (SQLSTATE 22P05). The
//     answer is what a later look-up returns, so storedJSON escapes it
//     reversibly inside every JSON string (object keys too): U+FFFF, a
//     Unicode noncharacter that no provider sends, becomes U+FFFF U+FFFF
//     and U+0000 becomes U+FFFF '0'; decodeStored undoes it. Invalid UTF-8
//     cannot reach it: encoding/json already replaced it with U+FFFD when
//     the answer was decoded, and does again when it is encoded.

// nulEscape is the escape character of the stored JSON.
const nulEscape = '\uffff'

// text returns s as a text column accepts it.
func text(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// storedJSON marshals v as the jsonb column accepts it: valid JSON,
// without \u0000, reversible by decodeStored.
func storedJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(b, []byte(`\u0000`)) && !bytes.Contains(b, []byte(string(nulEscape))) &&
		!bytes.Contains(b, []byte(`\uffff`)) && !bytes.Contains(b, []byte(`\uFFFF`)) {
		return b, nil // the common case: nothing to escape
	}
	return rewrite(b, escapeNUL)
}

// decodeStored returns the JSON storedJSON was given, from what
// PostgreSQL returns.
func decodeStored(b []byte) ([]byte, error) {
	if !bytes.Contains(b, []byte(string(nulEscape))) && !bytes.Contains(b, []byte(`\uffff`)) && !bytes.Contains(b, []byte(`\uFFFF`)) {
		return b, nil
	}
	return rewrite(b, unescapeNUL)
}

func escapeNUL(s string) string {
	if strings.IndexByte(s, 0) < 0 && !strings.ContainsRune(s, nulEscape) {
		return s
	}
	var sb strings.Builder
	for _, r := range s {
		switch r {
		case 0:
			sb.WriteRune(nulEscape)
			sb.WriteByte('0')
		case nulEscape:
			sb.WriteRune(nulEscape)
			sb.WriteRune(nulEscape)
		default:
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

func unescapeNUL(s string) string {
	if !strings.ContainsRune(s, nulEscape) {
		return s
	}
	var sb strings.Builder
	esc := false
	for _, r := range s {
		switch {
		case esc && r == '0':
			sb.WriteByte(0)
			esc = false
		case esc:
			sb.WriteRune(r) // nulEscape itself, or anything escapeNUL never wrote
			esc = false
		case r == nulEscape:
			esc = true
		default:
			sb.WriteRune(r)
		}
	}
	if esc {
		sb.WriteRune(nulEscape)
	}
	return sb.String()
}

// rewrite applies f to every string of the JSON document b, keys included,
// keeping numbers as written.
func rewrite(b []byte, f func(string) string) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("history: stored JSON: %w", err)
	}
	out, err := json.Marshal(walk(v, f))
	if err != nil {
		return nil, fmt.Errorf("history: stored JSON: %w", err)
	}
	return out, nil
}

func walk(v any, f func(string) string) any {
	switch v := v.(type) {
	case string:
		return f(v)
	case []any:
		for i := range v {
			v[i] = walk(v[i], f)
		}
		return v
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[f(k)] = walk(e, f)
		}
		return m
	default:
		return v
	}
}
