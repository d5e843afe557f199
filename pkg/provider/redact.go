package provider

import (
	"regexp"
	"strings"
	"unicode/utf8"

	"bulwark/pkg/secret"
)

// Redacted replaces whatever Redact removes.
const Redacted = "[redacted]"

// MaxMessageLen is the longest provider message Redact returns, in bytes;
// longer ones are cut at a rune boundary and end in "…". Provider messages go
// into errors, logs and events; a validation error that quotes a whole prompt
// does not belong there.
const MaxMessageLen = 1000

// keyPatterns match credentials that a provider (or a proxy in front of it)
// may echo back in an error message. Order matters: the labelled forms run
// first so that their label survives.
var keyPatterns = []struct {
	re   *regexp.Regexp
	repl string
}{
	// "Bearer sk-…", "Authorization: Bearer …".
	{regexp.MustCompile(`(?i)\bbearer\s+[A-Za-z0-9._~+/=*\-]+`), "Bearer " + Redacted},
	// "api_key=…", "x-api-key: …", "token: …" (query strings, header dumps).
	{regexp.MustCompile(`(?i)\b(x-api-key|api[-_]?key|access[-_]?token|token|secret)(["']?\s*[:=]\s*["']?)[^\s"',;&]+`), "${1}${2}" + Redacted},
	// OpenAI (sk-…, sk-proj-…, sk-svcacct-…) and Anthropic (sk-ant-api03-…)
	// keys, including the masked form OpenAI echoes ("sk-proj-****abcd").
	{regexp.MustCompile(`\bsk-[A-Za-z0-9*_\-]{4,}`), Redacted},
}

// Redact returns msg with every occurrence of each non-empty key removed,
// then anything else that looks like a credential (sk-… keys, bearer tokens,
// api_key=… pairs), and cuts the result to MaxMessageLen bytes. The keys are
// the ones the caller actually sent, so an exact echo is caught whatever its
// shape.
func Redact(msg string, keys ...secret.String) string {
	for _, k := range keys {
		if !k.IsZero() {
			msg = strings.ReplaceAll(msg, k.Reveal(), Redacted)
		}
	}
	for _, p := range keyPatterns {
		msg = p.re.ReplaceAllString(msg, p.repl)
	}
	return truncate(msg, MaxMessageLen)
}

// truncate cuts s to at most n bytes at a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Snippet returns a one-line, printable prefix of a non-JSON body (an HTML
// error page from a proxy, a plain-text 502) for an error message: control
// characters and runs of whitespace become single spaces and the result is
// at most n bytes. The caller still passes it through Redact.
func Snippet(body []byte, n int) string {
	var b strings.Builder
	space := false
	for _, r := range strings.ToValidUTF8(string(body), "�") {
		if r < ' ' || r == 0x7f || r == ' ' {
			space = b.Len() > 0
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r)
		if b.Len() >= n {
			break
		}
	}
	return truncate(b.String(), n)
}
