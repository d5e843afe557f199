package compress

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"bulwark/pkg/cache"
	"bulwark/pkg/llm"
)

// MinRepeatDefault is the default Config.MinRepeat: a line must occur at
// least three times in a row to collapse.
const MinRepeatDefault = 3

// Config configures a Compressor. Zero fields mean the documented default.
type Config struct {
	// MinRepeat is the least number of consecutive equal lines (rule 2)
	// or lines that differ only in their leading timestamp (rule 3) that
	// collapse into the first of them and a marker. At least 2. Default
	// MinRepeatDefault (3).
	MinRepeat int `yaml:"min_repeat"`
	// ProtectedPatterns are regular expressions (RE2) of the entities that
	// compression must never change, drop or merge away: DTCs, ECU ids,
	// part numbers, versions, numbers. nil means
	// cache.ProtectedPatternsDefault(), the same definition the semantic
	// cache's guard uses; an empty non-nil slice protects nothing beyond
	// what the rules themselves keep (rule 2 still merges only equal
	// lines). A pattern that can match the empty string is refused. The
	// patterns are applied to one line at a time: a pattern that spans a
	// line break protects nothing.
	ProtectedPatterns []string `yaml:"protected_patterns"`
	// KeepTimestamps turns rule 3 off: lines that differ in their leading
	// timestamp are then never merged, only equal lines are. Default
	// false (rule 3 on).
	KeepTimestamps bool `yaml:"keep_timestamps"`
}

// WithDefaults returns a copy of c with defaults filled in. Slices are
// copied, so the caller's values are never shared.
func (c Config) WithDefaults() Config {
	if c.MinRepeat == 0 {
		c.MinRepeat = MinRepeatDefault
	}
	if c.ProtectedPatterns == nil {
		c.ProtectedPatterns = cache.ProtectedPatternsDefault()
	} else {
		c.ProtectedPatterns = slices.Clone(c.ProtectedPatterns)
	}
	return c
}

// Validate checks a Config that went through WithDefaults.
func (c Config) Validate() error {
	if c.MinRepeat < 2 {
		return fmt.Errorf("compress: Config.MinRepeat %d: want >= 2", c.MinRepeat)
	}
	for i, p := range c.ProtectedPatterns {
		if _, err := analyse(p); err != nil {
			return fmt.Errorf("compress: Config.ProtectedPatterns[%d]: %w", i, err)
		}
	}
	return nil
}

// Compressor compresses the user content of requests (see the package
// documentation). It is immutable and safe for concurrent use. A nil
// *Compressor compresses nothing, so "compression off" can be a nil
// pointer.
type Compressor struct {
	minRepeat  int
	timestamps bool
	protected  []*regexp.Regexp
	// wsCheck are the protected patterns whose matches rule 1 could
	// change: those that can match a blank or that hold a line or text
	// anchor. The others only ever match inside runs of non-blanks, which
	// rule 1 leaves as they are.
	wsCheck []pattern
	// tsCheck are the protected patterns that can match a blank, hence
	// straddle the end of a leading timestamp (rule 3).
	tsCheck []pattern
}

// New returns a Compressor for cfg, its patterns compiled once.
func New(cfg Config) (*Compressor, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Compressor{minRepeat: cfg.MinRepeat, timestamps: !cfg.KeepTimestamps}
	for _, p := range cfg.ProtectedPatterns {
		a, err := analyse(p)
		if err != nil {
			return nil, err // unreachable: Validate
		}
		c.protected = append(c.protected, a.re)
		if a.blank || a.anchored {
			c.wsCheck = append(c.wsCheck, a)
		}
		if a.blank {
			c.tsCheck = append(c.tsCheck, a)
		}
	}
	return c, nil
}

// Request returns a compressed copy of req and the tokens it saves
// (llm.EstimateTokens of req minus that of the copy, never negative).
//
// Only the text blocks and tool_result blocks of user messages are
// compressed; the system prompt, assistant messages, tool_use inputs, tools
// and every other field are as in req. req is never modified. The copy has
// its own Messages slice and Content slices; the rest (Tools,
// StopSequences, Input, Temperature, ToolChoice) is shared with req, to be
// treated as read-only as everywhere on the request path.
//
// With a nil receiver it returns an uncompressed copy and 0.
func (c *Compressor) Request(req *llm.Request) (out llm.Request, saved int) {
	out = *req
	if req.Messages != nil {
		out.Messages = make([]llm.Message, len(req.Messages))
	}
	for i, m := range req.Messages {
		m.Content = slices.Clone(m.Content)
		if c != nil && m.Role == llm.RoleUser {
			for j := range m.Content {
				b := &m.Content[j]
				if b.Type == llm.BlockText || b.Type == llm.BlockToolResult {
					b.Text = c.Text(b.Text)
				}
			}
		}
		out.Messages[i] = m
	}
	if c == nil {
		return out, 0
	}
	return out, max(0, llm.EstimateTokens(req)-llm.EstimateTokens(&out))
}

// Text compresses one piece of text by the rules of the package
// documentation. The result is never longer than s, keeps every protected
// entity, and Text(Text(s)) == Text(s). A nil receiver returns s.
func (c *Compressor) Text(s string) string {
	if c == nil || s == "" {
		return s
	}
	src := strings.Split(s, "\n")
	ls := make([]line, len(src))
	for i, l := range src {
		ls[i] = c.newLine(c.normalise(l))
	}
	var b strings.Builder
	b.Grow(len(s))
	first := true
	emit := func(t string) {
		if !first {
			b.WriteByte('\n')
		}
		first = false
		b.WriteString(t)
	}
	for i := 0; i < len(ls); {
		j := i + 1
		switch {
		case ls[i].blank:
			// Rule 1: three or more blank lines become one.
			for j < len(ls) && ls[j].blank {
				j++
			}
			if j-i >= 3 {
				emit("")
				i = j
				continue
			}
		default:
			// Rules 2 and 3: the longest run of lines each compatible
			// with the one before.
			for j < len(ls) && compatible(&ls[j-1], &ls[j]) {
				j++
			}
			if j-i >= c.minRepeat {
				if m, ok := runMarker(ls[i:j]); ok {
					emit(ls[i].text)
					emit(m)
					i = j
					continue
				}
			}
		}
		for ; i < j; i++ {
			emit(ls[i].text)
		}
	}
	return b.String()
}

// sameEntities reports whether every pattern of pats finds the same
// matches, in the same order, in a and in b.
func sameEntities(pats []pattern, a, b string) bool {
	for i := range pats {
		p := &pats[i]
		if !p.has(a) && !p.has(b) {
			continue
		}
		if !slices.Equal(p.re.FindAllString(a, -1), p.re.FindAllString(b, -1)) {
			return false
		}
	}
	return true
}
