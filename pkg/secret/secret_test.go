package secret_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"bulwark/pkg/secret"
)

func TestNeverPrinted(t *testing.T) {
	t.Parallel()
	const raw = "sk-ant-very-secret-value"
	s := secret.New(raw)
	type holder struct {
		Key secret.String
	}
	h := holder{Key: s}

	var outputs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		outputs = append(outputs, fmt.Sprintf(verb, s), fmt.Sprintf(verb, h), fmt.Sprintf(verb, &h))
	}
	js, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, string(js))
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "key", s, "h", h)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "key", s)
	outputs = append(outputs, buf.String(), fmt.Errorf("call: %v", s).Error())

	for _, out := range outputs {
		if strings.Contains(out, raw) || strings.Contains(out, fmt.Sprintf("%x", raw)) {
			t.Errorf("secret leaked in %q", out)
		}
	}
	if s.Reveal() != raw {
		t.Fatalf("Reveal() = %q", s.Reveal())
	}
	if !s.Equal(secret.New(raw)) || s.Equal(secret.New("other")) {
		t.Fatal("Equal is wrong")
	}
}
