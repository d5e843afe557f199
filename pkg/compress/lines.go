package compress

import (
	"regexp"
	"strconv"
	"strings"
)

// line is one line of a text after rule 1, with what rules 2 and 3 need.
type line struct {
	text string
	// blank: the line is empty (after rule 1).
	blank bool
	// marker: the line reads as a repeat marker (ours, or one that was in
	// the input); it never joins a run.
	marker bool
	// ts: the line starts with a timestamp (rule 3 on): tok is the
	// timestamp as written (with its brackets), inner without them, and
	// body the rest of the line from the blank that follows it.
	ts               bool
	tok, inner, body string
}

func (c *Compressor) newLine(t string) line {
	l := line{text: t, blank: t == ""}
	if l.blank {
		return l
	}
	if _, ok := parseMarker(t); ok {
		l.marker = true
		return l
	}
	if c.timestamps {
		if end, inner, ok := c.splitTimestamp(t); ok {
			l.ts, l.tok, l.inner, l.body = true, t[:end], inner, t[end:]
		}
	}
	return l
}

// compatible reports whether b may join a run whose last line is a: both
// equal (rule 2), or both with a leading timestamp of the same shape, b's
// not earlier than a's, and the rest of the lines equal (rule 3). Blank
// lines and markers join nothing.
func compatible(a, b *line) bool {
	switch {
	case a.blank || b.blank || a.marker || b.marker:
		return false
	case a.ts && b.ts:
		return a.body == b.body && sameShape(a.tok, b.tok) && b.tok >= a.tok
	case !a.ts && !b.ts:
		return a.text == b.text
	default:
		return false
	}
}

// sameShape reports whether two timestamps are written alike: the same
// length, digits where the other has digits, and the same other bytes.
// Two timestamps of one shape sort as text in time order (for ISO 8601,
// syslog within a month, clock times and epochs of one length).
func sameShape(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		da, db := isDigit(a[i]), isDigit(b[i])
		if da != db || (!da && a[i] != b[i]) {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// runMarker returns the marker that replaces all but the first line of a
// run, and whether it is worth it: it must be shorter than the lines it
// replaces, so compression never lengthens a text.
func runMarker(run []line) (string, bool) {
	n := len(run) - 1
	var m string
	if last := run[n]; last.text == run[0].text {
		m = repeatMarker(n, "")
	} else {
		m = repeatMarker(n, squeeze(last.inner))
	}
	removed := 0
	for _, l := range run[1:] {
		removed += len(l.text) + 1
	}
	return m, len(m)+1 < removed
}

// Markers. repeatMarker(n, "") is "[previous line repeated n more times]"
// ("1 more time" for n = 1); repeatMarker(n, ts) is "[previous line
// repeated n more times, last at ts]".
const (
	markerPrefix = "[previous line repeated "
	markerLastAt = ", last at "
)

func repeatMarker(n int, lastAt string) string {
	m := markerPrefix + strconv.Itoa(n) + " more time"
	if n != 1 {
		m += "s"
	}
	if lastAt != "" {
		m += markerLastAt + lastAt
	}
	return m + "]"
}

var markerRe = regexp.MustCompile(`^\[previous line repeated ([0-9]+) more times?(?:, last at .*)?\]$`)

// parseMarker reports whether a line reads as a marker, ignoring blanks at
// either end and the width of blank runs (so that rule 1 cannot turn a
// line into a marker or out of one), and returns its count.
func parseMarker(t string) (int, bool) {
	t = strings.Trim(t, blanks)
	if !strings.HasPrefix(t, "[previous") {
		return 0, false
	}
	m := markerRe.FindStringSubmatch(squeeze(t))
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return 0, false
	}
	return n, true
}

// blanks are the characters rule 1 touches. Other white space (vertical
// tab, form feed, Unicode spaces) is left as it is.
const blanks = " \t\r"

// normalise applies rule 1 to one line: its leading indentation kept, each
// inner run of two or more spaces or tabs made one space, and trailing
// spaces, tabs and carriage returns removed. If that changes what a
// protected pattern matches in the line ("ECU  BMS" would become the ECU
// id "ECU BMS"), only the trailing blanks go; if even that changes it, the
// line is kept as it is.
func (c *Compressor) normalise(l string) string {
	n := squeeze(l)
	if n == l || sameEntities(c.wsCheck, l, n) {
		return n
	}
	if t := strings.TrimRight(l, blanks); t != n && sameEntities(c.wsCheck, l, t) {
		return t
	}
	return l
}

// squeeze is rule 1 without the entity check.
func squeeze(l string) string {
	t := strings.TrimRight(l, blanks)
	indent := len(t) - len(strings.TrimLeft(t, " \t"))
	if !hasBlankRun(t[indent:]) {
		return t
	}
	var b strings.Builder
	b.Grow(len(t))
	b.WriteString(t[:indent])
	for i := indent; i < len(t); {
		if t[i] != ' ' && t[i] != '\t' {
			b.WriteByte(t[i])
			i++
			continue
		}
		k := i + 1
		for k < len(t) && (t[k] == ' ' || t[k] == '\t') {
			k++
		}
		if k-i == 1 {
			b.WriteByte(t[i]) // a single tab stays a tab
		} else {
			b.WriteByte(' ')
		}
		i = k
	}
	return b.String()
}

// hasBlankRun reports whether s has two spaces or tabs in a row.
func hasBlankRun(s string) bool {
	for i := 0; i+1 < len(s); i++ {
		if (s[i] == ' ' || s[i] == '\t') && (s[i+1] == ' ' || s[i+1] == '\t') {
			return true
		}
	}
	return false
}

// Leading timestamps of rule 3, each optionally in [] or (), and followed
// by a space or tab:
//
//   - ISO 8601 date and time to the second, optional fraction and zone:
//     2024-11-03T08:15:22.123Z, 2024-11-03 08:15:22,123+01:00;
//   - syslog: Nov  3 08:15:22, Nov 13 08:15:22.5;
//   - Unix time in seconds or milliseconds, 2001-2033 (the cache's
//     ignored pattern), optional fraction: 1730621722.123456 (candump -l),
//     1730621722123;
//   - a clock time to the second: 08:15:22.123.
//
// A bare decimal (Vector ASC's relative 1.234567) is not a timestamp: it
// reads as a version number. As a regular expression (the tests hold the
// parser to it):
//
//	^(?:\[(TS)\]|\((TS)\)|(TS))[ \t]  where TS is one of
//	\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?
//	(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}\d{1,2} \d{2}:\d{2}:\d{2}(?:\.\d{1,9})?
//	1\d{9}(?:\d{3})?(?:\.\d{1,9})?
//	\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?
//
// leadingTimestamp parses it by hand: with Go's regexp it was about 70 %
// of BenchmarkRequest (2.6 µs a line).
// Greedy parsing without backtracking finds the same matches, because
// every optional part begins with a character that what follows it cannot
// begin with.
func leadingTimestamp(t string) (end int, inner string, ok bool) {
	i, closing := 0, byte(0)
	if t != "" && (t[0] == '[' || t[0] == '(') {
		i, closing = 1, ']'
		if t[0] == '(' {
			closing = ')'
		}
	}
	n := timestampLen(t[i:])
	if n == 0 {
		return 0, "", false
	}
	inner, end = t[i:i+n], i+n
	if closing != 0 {
		if end >= len(t) || t[end] != closing {
			return 0, "", false
		}
		end++
	}
	if end >= len(t) || (t[end] != ' ' && t[end] != '\t') {
		return 0, "", false
	}
	return end, inner, true
}

// timestampLen returns the length of the timestamp s begins with, or 0.
// The four forms cannot begin alike: ISO has '-' at 4, an epoch a digit
// there and the clock ':' at 2, syslog a letter at 0.
func timestampLen(s string) int {
	switch {
	case digits(s, 0, 4) && at(s, 4, '-') && digits(s, 5, 2) && at(s, 7, '-') && digits(s, 8, 2) &&
		(at(s, 10, 'T') || at(s, 10, ' ')) && clock(s, 11):
		i := fraction(s, 19, true)
		switch {
		case at(s, i, 'Z'):
			i++
		case (at(s, i, '+') || at(s, i, '-')) && digits(s, i+1, 2):
			k := i + 3
			if at(s, k, ':') {
				k++
			}
			if digits(s, k, 2) {
				i = k + 2
			}
		}
		return i
	case len(s) >= 3 && strings.Contains(months, "|"+s[:3]+"|"):
		i := 3
		for i < 5 && at(s, i, ' ') {
			i++
		}
		d := i
		for i-d < 2 && i < len(s) && isDigit(s[i]) {
			i++
		}
		if d == 3 || i == d || !at(s, i, ' ') || !clock(s, i+1) {
			return 0
		}
		return fraction(s, i+9, false)
	case at(s, 0, '1') && digits(s, 0, 10):
		i := 10
		if digits(s, 10, 3) {
			i = 13
		}
		return fraction(s, i, false)
	case clock(s, 0):
		return fraction(s, 8, true)
	}
	return 0
}

const months = "|Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec|"

// clock reports whether s has hh:mm:ss (any digits) at i.
func clock(s string, i int) bool {
	return digits(s, i, 2) && at(s, i+2, ':') && digits(s, i+3, 2) && at(s, i+5, ':') && digits(s, i+6, 2)
}

// fraction returns the end of an optional fraction at i: '.' (or ',' with
// comma) and 1 to 9 digits.
func fraction(s string, i int, comma bool) int {
	if !(at(s, i, '.') || (comma && at(s, i, ','))) || !digits(s, i+1, 1) {
		return i
	}
	k := i + 1
	for k < len(s) && k-i <= 9 && isDigit(s[k]) {
		k++
	}
	return k
}

// at reports whether s has c at i.
func at(s string, i int, c byte) bool { return i < len(s) && s[i] == c }

// digits reports whether s has n digits at i.
func digits(s string, i, n int) bool {
	if i+n > len(s) {
		return false
	}
	for k := i; k < i+n; k++ {
		if !isDigit(s[k]) {
			return false
		}
	}
	return true
}

// splitTimestamp finds a leading timestamp: end is where the blank after
// it is, inner the timestamp without brackets. A line whose rest is blank
// has none, nor has one where a protected match straddles the end of the
// timestamp (so that every protected match lies either in the timestamp,
// which is not an entity, or in the rest, which a run keeps equal).
func (c *Compressor) splitTimestamp(t string) (end int, inner string, ok bool) {
	end, inner, ok = leadingTimestamp(t)
	if !ok || strings.Trim(t[end:], blanks) == "" {
		return 0, "", false
	}
	for i := range c.tsCheck {
		p := &c.tsCheck[i]
		if !p.has(t) {
			continue
		}
		for _, loc := range p.re.FindAllStringIndex(t, -1) {
			if loc[0] < end && loc[1] > end {
				return 0, "", false
			}
		}
	}
	return end, inner, true
}
