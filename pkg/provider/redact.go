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

// keyPatterns match credentials and infrastructure details that a provider
// (or a proxy in front of it, or a Go network error) may put in an error
// message. Order matters: the labelled forms run first so that their label
// survives, and URLs are taken apart before their host:port is.
var keyPatterns = []struct {
	re   *regexp.Regexp
	repl string
}{
	// "Bearer sk-…", "Authorization: Bearer …", "Basic dXNlcjpwYXNz".
	{regexp.MustCompile(`(?i)\bbearer\s+[A-Za-z0-9._~+/=*\-]+`), "Bearer " + Redacted},
	{regexp.MustCompile(`(?i)\bbasic\s+[A-Za-z0-9+/=]{8,}`), "Basic " + Redacted},
	// "api_key=…", "x-api-key: …", "token: …" (query strings, header dumps).
	{regexp.MustCompile(`(?i)\b(x-api-key|api[-_]?key|access[-_]?token|token|secret|password)(["']?\s*[:=]\s*["']?)[^\s"',;&]+`), "${1}${2}" + Redacted},
	// "organization_id: …", "project-id=…".
	{regexp.MustCompile(`(?i)\b(organi[sz]ation[-_ ]?id|org[-_]?id|project[-_]?id)(["']?\s*[:=]\s*["']?)[^\s"',;&]+`), "${1}${2}" + Redacted},
	// A URL's userinfo ("https://user:pass@host") and query string, which
	// is where gateways take their tokens.
	{regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@?#"'<>]+@`), "${1}" + Redacted + "@"},
	{regexp.MustCompile(`(?i)(\b[a-z][a-z0-9+.\-]*://[^\s?#"'<>]*)\?[^\s#"'<>]*`), "${1}?" + Redacted},
	// OpenAI (sk-…, sk-proj-…, sk-svcacct-…) and Anthropic (sk-ant-api03-…)
	// keys, including the masked form OpenAI echoes ("sk-proj-****abcd").
	{regexp.MustCompile(`\bsk-[A-Za-z0-9*_\-]{4,}`), Redacted},
	// Organisation and project ids: OpenAI's org-…/proj_…, and UUIDs
	// (Anthropic's organisation ids).
	{regexp.MustCompile(`\borg-[A-Za-z0-9]{4,}`), Redacted},
	{regexp.MustCompile(`\bproj_[A-Za-z0-9]{4,}`), Redacted},
	{regexp.MustCompile(`\b[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\b`), Redacted},
	// Network addresses: IPv6 in brackets, IPv4 with or without a port,
	// host names with a port ("redis.internal:6379"). They map the
	// operator's network; a host name alone (api.openai.com) stays.
	{regexp.MustCompile(`\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\](?::\d{1,5})?`), Redacted},
	{regexp.MustCompile(`\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b`), Redacted},
	{regexp.MustCompile(`(?i)\b(?:localhost|(?:[a-z0-9](?:[a-z0-9\-]*[a-z0-9])?\.)+[a-z][a-z0-9\-]*):\d{1,5}\b`), Redacted},
}

// tokenRun is a run of the characters keys are made of (base64, base64url,
// hex, and the separators of prefixed keys); longToken decides whether a
// run is one.
var tokenRun = regexp.MustCompile(`[A-Za-z0-9+/=_\-]{16,}`)

// longToken reports whether run looks like a credential of any prefix: one
// of its pieces (between separators) is at least 16 characters mixing
// letters and digits, or at least 32 mixing upper and lower case. Words,
// snake_case codes ("context_length_exceeded") and model names
// ("claude-sonnet-4-5-20250929") have no such piece. Request ids (req_…,
// Bulwark's and Anthropic's) are what an operator looks a failure up by:
// they stay.
func longToken(run string) bool {
	if strings.HasPrefix(run, "req_") {
		return false
	}
	for piece := range strings.FieldsFuncSeq(run, func(r rune) bool { return strings.ContainsRune("+/=_-", r) }) {
		var letter, digit, upper, lower bool
		for _, r := range piece {
			switch {
			case r >= '0' && r <= '9':
				digit = true
			case r >= 'a' && r <= 'z':
				letter, lower = true, true
			case r >= 'A' && r <= 'Z':
				letter, upper = true, true
			}
		}
		if (len(piece) >= 16 && letter && digit) || (len(piece) >= 32 && upper && lower) {
			return true
		}
	}
	return false
}

// Redact returns msg with every occurrence of each non-empty key removed,
// then anything else that looks like a credential or an address (sk-… keys
// and long key-like tokens of any prefix, bearer tokens, api_key=… pairs,
// organisation and project ids, URL userinfo and query strings, IP
// addresses and host:port pairs), and cuts the result to MaxMessageLen
// bytes. The keys are the ones the caller actually sent, so an exact echo
// is caught whatever its shape.
//
// It is for what operators read (logs, a request's detail); nothing a
// provider or a Go error says reaches a tenant, redacted or not.
func Redact(msg string, keys ...secret.String) string {
	for _, k := range keys {
		if !k.IsZero() {
			msg = strings.ReplaceAll(msg, k.Reveal(), Redacted)
		}
	}
	for _, p := range keyPatterns {
		msg = p.re.ReplaceAllString(msg, p.repl)
	}
	msg = tokenRun.ReplaceAllStringFunc(msg, func(run string) string {
		if longToken(run) {
			return Redacted
		}
		return run
	})
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
