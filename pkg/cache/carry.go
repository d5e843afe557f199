package cache

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// A semantic hit may come from a prompt that names another car, phone or
// moment: the ignored patterns are masked before the match, so "VIN A
// fails" finds the answer to "VIN B fails". Served as stored, an answer
// that quotes B ("reflash B's BMS") would be about the wrong car. So the
// answer is carried over to the asked prompt:
//
//   - for each ignored pattern whose distinct matches are as many in both
//     prompts, the stored prompt's i-th value (in order of first
//     appearance) becomes the asked prompt's i-th in every string of the
//     answer: text blocks, tool inputs, whatever the JSON holds;
//   - for a pattern whose counts differ, the mapping is ambiguous, and an
//     answer that quotes any of the stored prompt's values of it is not
//     served (the lookup takes the next candidate, or misses);
//   - an answer that quotes none of them is served unchanged.
//
// The stored values are recomputed from the stored prompt (the prompt
// column) at hit time rather than kept in a column: they cost a few
// regular-expression passes over one prompt per candidate that made the
// threshold, rows stored before this change need no backfill, and a change
// of Config.IgnoredPatterns applies to every row at once.

// carry returns answer as it may be served for a prompt whose ignored
// values are asked (guard.values of the asked prompt) when it was stored
// for stored (normalised); ok is false when it quotes a value that has no
// counterpart.
func (g *guard) carry(stored string, asked [][]string, answer json.RawMessage) (out json.RawMessage, ok bool) {
	was := g.values(stored)
	var pairs [][2]string // stored value, asked value
	var orphans []string  // stored values without a counterpart
	for i := range was {
		if len(was[i]) != len(asked[i]) {
			orphans = append(orphans, was[i]...)
			continue
		}
		for j, v := range was[i] {
			if v != asked[i][j] {
				pairs = append(pairs, [2]string{v, asked[i][j]})
			}
		}
	}
	if len(pairs) == 0 && len(orphans) == 0 {
		return answer, true
	}
	// A Replacer tries its pairs in argument order at each position: the
	// longer value first, so a 13-digit time is not replaced as its
	// 10-digit prefix. It replaces in one pass, so A→B and B→A swap.
	slices.SortStableFunc(pairs, func(a, b [2]string) int { return cmp.Compare(len(b[0]), len(a[0])) })
	args := make([]string, 0, 2*len(pairs))
	for _, p := range pairs {
		args = append(args, p[0], p[1])
	}
	rep := strings.NewReplacer(args...)
	quoted := false
	out, err := mapStrings(answer, func(s string) string {
		for _, o := range orphans {
			quoted = quoted || strings.Contains(s, o)
		}
		return rep.Replace(s)
	})
	if err != nil || quoted {
		return nil, false
	}
	return out, true
}

// mapStrings returns the JSON text raw with f applied to every string in
// it (object keys too, harmlessly: no answer has a VIN for a key);
// everything else is kept byte for byte, so the answer is served as stored
// but for the substituted values. It returns raw itself when f changed
// nothing.
func mapStrings(raw json.RawMessage, f func(string) string) (json.RawMessage, error) {
	var out []byte // nil until a string changes
	last := 0
	for i := 0; i < len(raw); i++ {
		if raw[i] != '"' {
			continue // outside a string, a quote can only open one
		}
		end := i + 1
		for ; end < len(raw) && raw[end] != '"'; end++ {
			if raw[end] == '\\' {
				end++
			}
		}
		if end >= len(raw) {
			return nil, errors.New("cache: answer: unterminated JSON string")
		}
		s, err := unquote(raw[i : end+1])
		if err != nil {
			return nil, fmt.Errorf("cache: answer: %w", err)
		}
		if t := f(s); t != s {
			q, err := quote(t)
			if err != nil {
				return nil, fmt.Errorf("cache: answer: %w", err)
			}
			out = append(append(out, raw[last:i]...), q...)
			last = end + 1
		}
		i = end
	}
	if out == nil {
		return raw, nil
	}
	return append(out, raw[last:]...), nil
}

// unquote decodes one JSON string literal, quotes included.
func unquote(lit []byte) (string, error) {
	if bytes.IndexByte(lit, '\\') < 0 {
		return string(lit[1 : len(lit)-1]), nil
	}
	var s string
	if err := json.Unmarshal(lit, &s); err != nil {
		return "", err
	}
	return s, nil
}

// quote encodes s as a JSON string literal, leaving <, > and & as they are
// (the stored answer had them so).
func quote(s string) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
