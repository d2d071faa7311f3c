package source

import (
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// fieldLine returns the line (from 1) of field in doc, a YAML or JSON
// document: the line of its key, or of the list element a path ending in an
// index names. field is a path as the validation writes it, e.g.
// "spec.ports[1].nodePort" or "metadata.annotations[example.com/key]" (a
// bracket holding other than a number is a map key, which may hold dots).
// A field that is missing (a warning may be about one not set) gives the
// line of the deepest part of the path that is there. It returns 0 when
// doc does not parse or has none of the path; the caller then keeps the
// document's first line.
func fieldLine(doc []byte, field string) int {
	if field == "" {
		return 0
	}
	var root yaml.Node
	if yaml.Unmarshal(doc, &root) != nil || root.Kind != yaml.DocumentNode || len(root.Content) != 1 {
		return 0
	}
	n, line := root.Content[0], 0
	for _, seg := range splitPath(field) {
		key, indexes, _ := strings.Cut(seg, "[")
		v, keyLine := mappingValue(n, key)
		if v == nil {
			return line
		}
		n, line = v, keyLine
		for idx := range strings.SplitSeq(indexes, "[") {
			if idx == "" {
				continue
			}
			idx = strings.TrimSuffix(idx, "]")
			i, err := strconv.Atoi(idx)
			if err != nil {
				// A map key: annotations[example.com/key].
				if v, keyLine := mappingValue(n, idx); v != nil {
					n, line = v, keyLine
					continue
				}
				return line
			}
			if n.Kind != yaml.SequenceNode || i < 0 || i >= len(n.Content) {
				return line
			}
			n = n.Content[i]
			line = n.Line
		}
	}
	return line
}

// splitPath splits field at the dots outside brackets.
func splitPath(field string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(field); i++ {
		switch field[i] {
		case '[':
			depth++
		case ']':
			depth--
		case '.':
			if depth == 0 {
				out = append(out, field[start:i])
				start = i + 1
			}
		}
	}
	return append(out, field[start:])
}

// mappingValue returns the value of key in mapping n, and the line of the
// key; nil when n is not a mapping or has no such key.
func mappingValue(n *yaml.Node, key string) (*yaml.Node, int) {
	if n.Kind != yaml.MappingNode {
		return nil, 0
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1], n.Content[i].Line
		}
	}
	return nil, 0
}
