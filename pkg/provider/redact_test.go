package provider

import (
	"strings"
	"testing"
	"unicode/utf8"

	"bulwark/pkg/secret"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	key := secret.New("gw-7f3a9c2e1b5d")
	tests := []struct {
		name, in, want string
	}{
		{"plain message untouched", "Number of request tokens has exceeded your per-minute rate limit", "Number of request tokens has exceeded your per-minute rate limit"},
		{"the key used", "invalid key gw-7f3a9c2e1b5d given", "invalid key [redacted] given"},
		{"the key twice", "gw-7f3a9c2e1b5d/gw-7f3a9c2e1b5d", "[redacted]/[redacted]"},
		{"openai key", "Incorrect API key provided: sk-proj-abc123DEF456_ghi-789.", "Incorrect API key provided: [redacted]."},
		{"openai masked key", "Incorrect API key provided: sk-proj-**********************ab1Z. You can", "Incorrect API key provided: [redacted]. You can"},
		{"anthropic key", "key sk-ant-api03-Zx9_Qw8-Er7Ty6Ui5Op4As3Df2Gh1Jk0-AAAA end", "key [redacted] end"},
		{"bearer token", "Authorization: Bearer abc.def-ghi", "Authorization: Bearer [redacted]"},
		{"query api_key", "GET /v1?api_key=s3cr3t&x=1", "GET /v1?api_key=[redacted]&x=1"},
		{"x-api-key header dump", `x-api-key: "s3cr3t"`, `x-api-key: "[redacted]"`},
		{"token words are not keys", "max_tokens: 100000 > 64000; tokens per min (TPM)", "max_tokens: 100000 > 64000; tokens per min (TPM)"},
		{"sk- inside a word is not a key", "task-1234 risk-free", "task-1234 risk-free"},
	}
	for _, tt := range tests {
		if got := Redact(tt.in, key, secret.String{}); got != tt.want {
			t.Errorf("%s: Redact(%q) = %q, want %q", tt.name, tt.in, got, tt.want)
		}
	}
}

func TestRedactTruncates(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", MaxMessageLen) // 2 bytes each
	got := Redact(long)
	if len(got) > MaxMessageLen || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("Redact(long) = %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}

func TestSnippet(t *testing.T) {
	t.Parallel()
	html := "<html>\n<head><title>502 Bad Gateway</title></head>\r\n\t<body>\x00</body>"
	if got, want := Snippet([]byte(html), 300), "<html> <head><title>502 Bad Gateway</title></head> <body> </body>"; got != want {
		t.Errorf("Snippet = %q, want %q", got, want)
	}
	if got := Snippet([]byte(strings.Repeat("x", 500)), 20); len(got) > 20 {
		t.Errorf("Snippet not cut: %d bytes", len(got))
	}
	if got := Snippet([]byte{0xff, 'a'}, 10); !utf8.ValidString(got) {
		t.Errorf("Snippet of invalid UTF-8 = %q", got)
	}
}
