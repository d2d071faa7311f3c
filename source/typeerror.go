package source

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// typeError matches the JSON decoder's message for a value of the wrong
// type: "cannot unmarshal string into Go struct field ServicePort.spec.ports.port
// of type int32". It names the field without list indexes and gives no
// line.
var typeError = regexp.MustCompile(`cannot unmarshal (\w+)(?: \S+)? into Go struct field \w+\.(\S+) of type (\S+)`)

// yaml11Bools are the plain words YAML 1.1, which Kubernetes' YAML reader
// follows, takes for booleans where YAML 1.2 sees strings.
var yaml11Bools = []string{"y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF"}

// locateTypeError finds the value a "cannot unmarshal" message is about in
// doc, parsed by lines: its field path with list indexes, and its line in
// doc (from 1). It reports false when msg is another error or the value
// cannot be found.
func locateTypeError(lines *fieldLines, doc []byte, msg string) (field string, line int, reason string, ok bool) {
	m := typeError.FindStringSubmatch(msg)
	if m == nil {
		return "", 0, "", false
	}
	kind, path, want := m[1], strings.Split(m[2], "."), m[3]
	root := lines.parse(doc)
	if root == nil {
		return "", 0, "", false
	}
	field, n := findOfKind(root, path, kind, "")
	if n == nil {
		return "", 0, "", false
	}
	reason = fmt.Sprintf("%s is %s; want %s", describeNode(n), article(kind), want)
	if kind == "bool" && slices.Contains(yaml11Bools, n.Value) {
		reason += fmt.Sprintf(` (YAML reads a plain %s as a boolean: quote it, "%s")`, n.Value, n.Value)
	}
	return field, n.Line, reason, true
}

// findOfKind walks path from n, through every element of the lists on the
// way, to the first value of the JSON kind given, and returns it with its
// field path.
func findOfKind(n *yaml.Node, path []string, kind, prefix string) (string, *yaml.Node) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 1 {
			return findOfKind(n.Content[0], path, kind, prefix)
		}
		return "", nil
	case yaml.AliasNode:
		// Not followed: aliases can nest into a huge tree, and manifests
		// rarely use them; the message then stays the decoder's.
		return "", nil
	case yaml.SequenceNode:
		if len(path) > 0 { // the decoder names a list's elements by the list
			for i, c := range n.Content {
				if f, found := findOfKind(c, path, kind, fmt.Sprintf("%s[%d]", prefix, i)); found != nil {
					return f, found
				}
			}
			return "", nil
		}
	}
	if len(path) == 0 {
		if jsonKind(n) == kind {
			return prefix, n
		}
		return "", nil
	}
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == path[0] {
				return findOfKind(n.Content[i+1], path[1:], kind, joinPath(prefix, path[0]))
			}
		}
	}
	return "", nil
}

// jsonKind is the kind the JSON decoder sees in n: object, array, string,
// number, bool or null.
func jsonKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "object"
	case yaml.SequenceNode:
		return "array"
	}
	switch n.ShortTag() {
	case "!!int", "!!float":
		return "number"
	case "!!bool":
		return "bool"
	case "!!null":
		return "null"
	}
	if n.Style == 0 && slices.Contains(yaml11Bools, n.Value) {
		return "bool"
	}
	return "string"
}

// describeNode is n for a message: a scalar quoted, else "the value".
func describeNode(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return fmt.Sprintf("%q", n.Value)
	}
	return "the value"
}

// article names a JSON kind with its article, as a reader says it.
func article(kind string) string {
	switch kind {
	case "object":
		return "a map"
	case "array":
		return "a list"
	case "bool":
		return "a boolean"
	}
	return "a " + kind
}
