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
		{"basic auth", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic [redacted]"},
		{"password pair", "password=hunter2;", "password=[redacted];"},

		// Keys of any prefix: long runs mixing letters and digits.
		{"hex key fragment", "key ab12cd34ef56ab12cd34ef56 rejected", "key [redacted] rejected"},
		{"prefixed key", "used gsk_4f9Qx7Lm2Zp8Rt6Vb3Nc1Kd5", "used [redacted]"},
		{"base64 key", "token dGhpcyBpcyBhIHNlY3JldCBrZXkgdmFsdWU0Mg== expired", "token [redacted] expired"},
		{"long mixed-case run", "cred AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh end", "cred [redacted] end"},
		{"model names stay", "model claude-sonnet-4-5-20250929 and gpt-4o-mini-2024-07-18 not found", "model claude-sonnet-4-5-20250929 and gpt-4o-mini-2024-07-18 not found"},
		{"error codes stay", "context_length_exceeded: invalid_request_error", "context_length_exceeded: invalid_request_error"},
		{"request ids stay", "see req_mfq3x2ab0123456789abcdef01 and req_011CSHoEeqs5C35K2UUqR7Fy", "see req_mfq3x2ab0123456789abcdef01 and req_011CSHoEeqs5C35K2UUqR7Fy"},

		// Organisation and project ids.
		{"openai org id", "Rate limit reached in organization org-SECRET123 on tokens", "Rate limit reached in organization [redacted] on tokens"},
		{"openai project id", "project proj_Ab12Cd34 is archived", "project [redacted] is archived"},
		{"anthropic org uuid", "organization 3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b is disabled", "organization [redacted] is disabled"},
		{"labelled org id", `{"organization_id": "acme"}`, `{"organization_id": "[redacted]"}`},

		// URLs: userinfo and query strings.
		{"url userinfo", "proxy https://bob:s3cr3t@gw.example.com/v1 refused", "proxy https://[redacted]@gw.example.com/v1 refused"},
		{"url query", "POST https://gw.example.com/v1/messages?key=abc&team=x failed", "POST https://gw.example.com/v1/messages?[redacted] failed"},
		{"url without query stays", "see https://docs.claude.com/en/api/rate-limits.", "see https://docs.claude.com/en/api/rate-limits."},

		// Addresses.
		{"ipv4 with port", "redis at 10.0.0.7:6379 refused", "redis at [redacted] refused"},
		{"ipv4 alone", "from 192.168.1.20 denied", "from [redacted] denied"},
		{"ipv6 with port", "dial tcp [fd00::1]:443: connect: connection refused", "dial tcp [redacted]: connect: connection refused"},
		{"host with port", "dial tcp redis.internal.corp:6379: i/o timeout", "dial tcp [redacted]: i/o timeout"},
		{"localhost with port", "connect localhost:5432 failed", "connect [redacted] failed"},
		{"url host and port", "Post \"http://10.1.2.3:8080/v1/messages\": EOF", "Post \"http://[redacted]/v1/messages\": EOF"},
		{"times and ratios stay", "retry at 12:30:45, limit 1.5:1, field messages.0.content: bad", "retry at 12:30:45, limit 1.5:1, field messages.0.content: bad"},
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
