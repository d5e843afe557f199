// Package wirejson holds the JSON helpers the provider wire formats share:
// decoding with errors that name the offending field (they become 400
// answers on the compat endpoints), and checks and normalisation of the
// JSON objects that pass through untouched (tool inputs, JSON Schemas).
package wirejson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
)

// Unmarshal decodes body into v. Its errors say what is wrong in the
// client's terms: "invalid JSON at byte 12: …" or "messages.role: expected
// a string, got number", never Go type names.
func Unmarshal(body []byte, v any) error {
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("invalid JSON at byte %d: %s", se.Offset, se.Error())
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "request body"
		}
		return fmt.Errorf("%s: expected %s, got %s", field, kindName(te.Type), te.Value)
	}
	return fmt.Errorf("invalid JSON: %w", err)
}

// kindName names the JSON kind a Go type decodes from.
func kindName(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	default:
		return "a value"
	}
}

// UnknownFields returns, sorted, the top-level keys of the JSON object body
// that are not in known.
func UnknownFields(body []byte, known []string) ([]string, error) {
	var m map[string]json.RawMessage
	if err := Unmarshal(body, &m); err != nil {
		return nil, err
	}
	var out []string
	for k := range m {
		if !slices.Contains(known, k) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Present reports whether raw holds a value other than null.
func Present(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// Object checks that raw is a JSON object and returns it compacted; absent
// or null yields "{}". path names the field in the error.
func Object(path string, raw json.RawMessage) (json.RawMessage, error) {
	if !Present(raw) {
		return json.RawMessage("{}"), nil
	}
	return ObjectText(path, raw)
}

// ObjectText checks that text is a JSON object and returns it compacted.
// path names the field in the error.
func ObjectText(path string, text []byte) (json.RawMessage, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, text); err != nil {
		return nil, fmt.Errorf("%s: not valid JSON: %s", path, err.Error())
	}
	if buf.Len() == 0 || buf.Bytes()[0] != '{' {
		return nil, fmt.Errorf("%s: must be a JSON object", path)
	}
	return buf.Bytes(), nil
}

// ObjectOrEmpty returns raw compacted, or def when raw is absent, null or
// not valid JSON. It is for encoding values the neutral model already holds:
// they were checked on the way in, and a wire body must stay valid JSON.
func ObjectOrEmpty(raw json.RawMessage, def string) json.RawMessage {
	if !Present(raw) {
		return json.RawMessage(def)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return json.RawMessage(def)
	}
	return buf.Bytes()
}

// Marshal is json.Marshal without HTML escaping: wire bodies go to APIs and
// SDKs, not into HTML, and "<" should stay "<" in a prompt.
func Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
