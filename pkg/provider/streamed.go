package provider

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Rest is what of a block's full text is still to stream after done, the
// part its deltas carried: "" when done is all of it, ok false when done
// is not its start. A tool's input counts as all sent when done is the
// same JSON as full but for spacing: providers stream the input as they
// write it, and a decoder may compact it.
func Rest(full, done string, json bool) (rest string, ok bool) {
	if strings.HasPrefix(full, done) {
		return full[len(done):], true
	}
	if json && done != "" && compact(full) == compact(done) {
		return "", true
	}
	return "", false
}

func compact(s string) string {
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		return s
	}
	return b.String()
}
