package cache

import (
	"regexp"
	"slices"
	"strings"
)

// guard is the protected-entity check of semantic hits: two prompts may
// be close in embedding space yet ask about different things when they
// name a different trouble code, ECU, part or version ("P0A80" and "P0A81"
// differ in one character of a long prompt). For each protected pattern the
// sorted list of matches must be equal in both prompts. Matches of the
// ignored patterns (timestamps, VINs, phone numbers, plates) are blanked
// first, so prompts that differ only in those still hit; their answers are
// then carried over (carry.go), and an instruction added to a shared text
// is caught by comparing what differs (difference.go). A guard is
// immutable and safe for concurrent use.
type guard struct {
	protected []*regexp.Regexp
	ignored   []*regexp.Regexp
}

func newGuard(protected, ignored []string) (*guard, error) {
	g := &guard{}
	for _, p := range protected {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, err
		}
		g.protected = append(g.protected, re)
	}
	for _, p := range ignored {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, err
		}
		g.ignored = append(g.ignored, re)
	}
	return g, nil
}

// mask replaces what the ignored patterns match (timestamps, VINs, ...) with a
// placeholder before a prompt is embedded, so that two reports that differ
// only in which car and when embed identically rather than merely alike:
// on a short prompt a changed VIN and timestamp alone pull a lexical
// embedding down to about 0.85, below any useful threshold.
func (g *guard) mask(prompt string) string {
	for _, re := range g.ignored {
		prompt = re.ReplaceAllLiteralString(prompt, "#")
	}
	return prompt
}

// values returns, per ignored pattern, the distinct strings it matches in
// prompt, in order of first appearance. Each pattern sees the text the
// earlier ones masked, as in mask, so a value belongs to one pattern only
// (a timestamp's clock time is the timestamp's).
func (g *guard) values(prompt string) [][]string {
	out := make([][]string, len(g.ignored))
	for i, re := range g.ignored {
		for _, m := range re.FindAllString(prompt, -1) {
			if !slices.Contains(out[i], m) {
				out[i] = append(out[i], m)
			}
		}
		prompt = re.ReplaceAllLiteralString(prompt, "#")
	}
	return out
}

// entities is, per protected pattern, the sorted upper-cased matches.
type entities [][]string

// extract returns the protected entities of a prompt.
func (g *guard) extract(prompt string) entities {
	if len(g.protected) == 0 {
		return nil
	}
	for _, re := range g.ignored {
		prompt = re.ReplaceAllLiteralString(prompt, " ")
	}
	out := make(entities, len(g.protected))
	for i, re := range g.protected {
		m := re.FindAllString(prompt, -1)
		for j := range m {
			m[j] = strings.ToUpper(m[j])
		}
		slices.Sort(m)
		out[i] = m
	}
	return out
}

// key is the canonical text form of e, stored with each answer and matched
// exactly by lookups: per pattern the sorted matches joined by ",", the
// patterns joined by "|".
func (e entities) key() string {
	parts := make([]string, len(e))
	for i, m := range e {
		parts[i] = strings.Join(m, ",")
	}
	return strings.Join(parts, "|")
}

// same reports whether two prompts' entities agree for every pattern.
func (e entities) same(o entities) bool {
	if len(e) != len(o) {
		return false
	}
	for i := range e {
		if !slices.Equal(e[i], o[i]) {
			return false
		}
	}
	return true
}
