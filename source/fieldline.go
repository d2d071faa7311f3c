package source

import (
	"bytes"
	"strconv"
	"strings"
	"sync/atomic"

	yaml "go.yaml.in/yaml/v3"
)

// fieldLines finds the lines of fields in a document, parsing it into
// yaml.v3 nodes once for all its problems: it keeps the last document it
// parsed, and the next look-up in the same document (the same slice of
// bytes) walks the same nodes. Each look-up parsed the whole document
// before, so a generator that wrote 14,000 bad addresses into one 5 MB
// EndpointSlice had it parsed 14,000 times, for minutes. The problems of a
// document are found together (its validation, its decoding, each
// object's problems in BuildSnapshot), so one document is enough; only it
// is kept, as one decode of it would. The zero value is ready to use.
type fieldLines struct {
	doc  []byte     // the document parsed, nil for none
	root *yaml.Node // its node; nil when it does not parse
	// lastOf is the document whose last line is last.
	lastOf []byte
	last   int
}

// For tests: documentParses counts the parses of documents into nodes
// (parse); forgetLines has each look-up parse and count its document
// again, as each did before fieldLines kept one, for comparing the lines
// found.
var (
	documentParses atomic.Int64
	forgetLines    atomic.Bool
)

// parse returns doc as yaml.v3 nodes, parsed once while doc is the
// document kept; nil when doc does not parse.
func (c *fieldLines) parse(doc []byte) *yaml.Node {
	if sameBytes(doc, c.doc) && !forgetLines.Load() {
		return c.root
	}
	documentParses.Add(1)
	root := new(yaml.Node)
	if yaml.Unmarshal(doc, root) != nil {
		root = nil
	}
	c.doc, c.root = doc, root
	return root
}

// lastLine is lastLine(doc), counted once while doc is the one kept.
func (c *fieldLines) lastLine(doc []byte) int {
	if !sameBytes(doc, c.lastOf) || forgetLines.Load() {
		c.lastOf, c.last = doc, lastLine(doc)
	}
	return c.last
}

// reset lets go of what is kept.
func (c *fieldLines) reset() { *c = fieldLines{} }

// sameBytes reports whether a and b are the same bytes of the same array,
// not empty: a copy is another document.
func sameBytes(a, b []byte) bool {
	return len(a) > 0 && len(a) == len(b) && &a[0] == &b[0]
}

// fieldLine returns the line (from 1) of field in doc, a YAML or JSON
// document: the line of its key, or of the list element a path ending in an
// index names. field is a path as the validation writes it, e.g.
// "spec.ports[1].nodePort" or "metadata.annotations[example.com/key]" (a
// bracket holding other than a number is a map key, which may hold dots).
// A field that is missing (a warning may be about one not set) gives the
// line of the deepest part of the path that is there. It returns 0 when
// doc does not parse or has none of the path; the caller then keeps the
// document's first line.
func (c *fieldLines) fieldLine(doc []byte, field string) int {
	if field == "" {
		return 0
	}
	root := c.parse(doc)
	if root == nil || root.Kind != yaml.DocumentNode || len(root.Content) != 1 {
		return 0
	}
	return nodeLine(root.Content[0], field)
}

// nodeLine is fieldLine's walk from n, a document's top node.
func nodeLine(n *yaml.Node, field string) int {
	line := 0
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

// lastLine returns the last line (from 1) of doc that is not blank, or 0.
func lastLine(doc []byte) int {
	doc = bytes.TrimRight(doc, " \t\r\n")
	if len(doc) == 0 {
		return 0
	}
	return bytes.Count(doc, []byte("\n")) + 1
}
