// Package compactjson encodes JSON that costs no more than its content:
// what Bulwark keeps in Redis (request records, their events, the history
// outbox) is stored as written, so an encoding that grows a tenant's text
// grows the store by the same factor.
//
// encoding/json writes '<', '>' and '&' as six-byte escapes, so that the
// output can be pasted into HTML, and U+2028 and U+2029 (three bytes each)
// as six-byte escapes for old JavaScript parsers. Neither reader exists
// here, and a body of '<' stored that way is six times its size. Marshal
// writes all of them as themselves; every other byte of the output is
// what encoding/json writes (control characters stay escaped, as JSON
// requires).
package compactjson

import (
	"bytes"
	"encoding/json"
)

// Marshal returns the JSON encoding of v without HTML escaping and with
// U+2028 and U+2029 written raw. It is valid JSON (RFC 8259) that
// encoding/json decodes to the same value.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if !bytes.Contains(b, []byte(`\u202`)) {
		return b, nil
	}
	return unescapeSeparators(b), nil
}

// unescapeSeparators rewrites the escapes \u2028 and \u2029 of b (valid
// JSON) as the raw characters. It walks escape by escape: in valid JSON
// every backslash starts one, so a text that spells the escape out
// ("\\u2028") is left alone.
func unescapeSeparators(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			out = append(out, b[i])
			continue
		}
		if b[i+1] == 'u' && i+6 <= len(b) {
			switch string(b[i+2 : i+6]) {
			case "2028":
				out = append(out, "\u2028"...)
				i += 5
				continue
			case "2029":
				out = append(out, "\u2029"...)
				i += 5
				continue
			}
		}
		out = append(out, b[i], b[i+1]) // any other escape, whole or its first two bytes
		i++
	}
	return out
}
