package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// expandNode replaces ${VAR} and ${VAR:-default} in every scalar of the
// document, in place. The path of each scalar is tracked so that a missing
// variable is reported by field, e.g. "keys[1].api_key: environment
// variable CLAUDE_API_KEY_2 is not set". Expanding the parsed tree rather than
// the raw text keeps a value with YAML syntax in it from changing the
// document's structure, and keeps values out of error messages.
func expandNode(n *yaml.Node, path string, lookup func(string) (string, bool)) error {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if err := expandNode(c, path, lookup); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := expandNode(n.Content[i+1], join(path, n.Content[i].Value), lookup); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if err := expandNode(c, path+"["+strconv.Itoa(i)+"]", lookup); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		v, err := expandString(n.Value, lookup)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if v != n.Value {
			n.Value = v
			// An expanded value is always a string; let the decoder convert it
			// to the field's type (int, duration, bool).
			n.Tag = ""
			n.Style = 0
		}
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// expandString expands ${VAR} and ${VAR:-default}. "$$" is a literal "$".
func expandString(s string, lookup func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if i+1 >= len(s) || s[i+1] != '{' {
			b.WriteByte('$')
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("unterminated ${ in value")
		}
		expr := s[i+2 : i+end]
		name, def, hasDef := strings.Cut(expr, ":-")
		if !validName(name) {
			return "", fmt.Errorf("invalid environment variable name %q", name)
		}
		v, ok := lookup(name)
		switch {
		case ok && v != "":
			b.WriteString(v)
		case hasDef:
			b.WriteString(def)
		default:
			return "", fmt.Errorf("environment variable %s is not set", name)
		}
		i += end
	}
	return b.String(), nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9' {
			continue
		}
		return false
	}
	return true
}

func osLookup(name string) (string, bool) { return os.LookupEnv(name) }
