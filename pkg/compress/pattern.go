package compress

import (
	"errors"
	"regexp"
	"regexp/syntax"
	"strings"
)

// pattern is a compiled protected pattern and what the rules need to know
// about it.
type pattern struct {
	re *regexp.Regexp
	// blank: the pattern can match a space, tab or carriage return.
	blank bool
	// anchored: the pattern holds ^, $, \A or \z.
	anchored bool
	// literal, if not empty, is in every match (case-sensitively): a text
	// without it has no match. Go's regexp finds no literal prefix behind
	// a leading \b, which makes \bECU... scan every position.
	literal string
}

// has reports whether the pattern may match in s.
func (p *pattern) has(s string) bool {
	return p.literal == "" || strings.Contains(s, p.literal)
}

// analyse compiles a protected pattern and reads its syntax tree. A
// pattern that can match the empty string is refused: it would "protect"
// the gaps between characters, which any edit moves.
func analyse(p string) (pattern, error) {
	re, err := regexp.Compile(p)
	if err != nil {
		return pattern{}, err
	}
	tree, err := syntax.Parse(p, syntax.Perl)
	if err != nil {
		return pattern{}, err // unreachable: regexp.Compile parsed it
	}
	if nullable(tree) {
		return pattern{}, errors.New("pattern can match the empty string")
	}
	a := pattern{re: re, literal: prefixLiteral(tree)}
	walk(tree, &a)
	return a, nil
}

// prefixLiteral returns the case-sensitive literal that every match of r
// begins with, after zero-width assertions, or "".
func prefixLiteral(r *syntax.Regexp) string {
	for {
		switch r.Op {
		case syntax.OpCapture:
			r = r.Sub[0]
			continue
		case syntax.OpConcat:
			for _, s := range r.Sub {
				switch s.Op {
				case syntax.OpWordBoundary, syntax.OpNoWordBoundary, syntax.OpBeginLine, syntax.OpBeginText:
					continue
				}
				return prefixLiteral(s)
			}
			return ""
		case syntax.OpLiteral:
			if r.Flags&syntax.FoldCase != 0 {
				return ""
			}
			return string(r.Rune)
		}
		return ""
	}
}

// nullable reports whether r may match the empty string. It errs towards
// true (an assertion is taken to hold).
func nullable(r *syntax.Regexp) bool {
	switch r.Op {
	case syntax.OpNoMatch, syntax.OpCharClass, syntax.OpAnyCharNotNL, syntax.OpAnyChar:
		return false
	case syntax.OpLiteral:
		return len(r.Rune) == 0
	case syntax.OpCapture, syntax.OpPlus:
		return nullable(r.Sub[0])
	case syntax.OpRepeat:
		return r.Min == 0 || nullable(r.Sub[0])
	case syntax.OpConcat:
		for _, s := range r.Sub {
			if !nullable(s) {
				return false
			}
		}
		return true
	case syntax.OpAlternate:
		for _, s := range r.Sub {
			if nullable(s) {
				return true
			}
		}
		return false
	default: // empty match, star, quest, assertions
		return true
	}
}

// walk sets a.blank and a.anchored from the nodes of r.
func walk(r *syntax.Regexp, a *pattern) {
	switch r.Op {
	case syntax.OpLiteral:
		for _, c := range r.Rune {
			if isBlank(c) {
				a.blank = true
			}
		}
	case syntax.OpCharClass:
		for i := 0; i+1 < len(r.Rune); i += 2 {
			for _, c := range []rune{' ', '\t', '\r'} {
				if r.Rune[i] <= c && c <= r.Rune[i+1] {
					a.blank = true
				}
			}
		}
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		a.blank = true
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText:
		a.anchored = true
	}
	for _, s := range r.Sub {
		walk(s, a)
	}
}

func isBlank(c rune) bool { return c == ' ' || c == '\t' || c == '\r' }
