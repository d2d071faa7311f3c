package source

import (
	yaml "go.yaml.in/yaml/v3"
)

// excessiveAliasLine returns the line (from 1) of the alias in doc whose
// expansion made the YAML decoder refuse doc with "document contains
// excessive aliasing" (a "billion laughs"), by counting what it decodes as
// it does (unmarshal in go.yaml.in/yaml/v2's decode.go, decoding into an
// interface, as Kubernetes' YAML reader does): the alias of doc's own text
// being expanded when the count tips. It returns 0 when doc does not parse
// or the count never tips; it stops where the decoder did, so it costs no
// more than the refused decode.
func excessiveAliasLine(doc []byte) int {
	var root yaml.Node
	if yaml.Unmarshal(doc, &root) != nil { // a tree of nodes: aliases are not expanded
		return 0
	}
	c := aliasCounter{expanding: map[*yaml.Node]bool{}}
	if c.visit(&root) || c.outer == nil {
		return 0
	}
	return c.outer.Line
}

// aliasCounter counts decodes and the decodes within aliases.
type aliasCounter struct {
	decodes, aliases, depth int
	// outer is the alias of the document's text expanded last.
	outer     *yaml.Node
	expanding map[*yaml.Node]bool
}

// maxAliasDecodes bounds the count, should it ever not tip where the
// decoder's did: past 4,000,000 decodes the decoder allows a tenth of them
// to be in aliases.
const maxAliasDecodes = 5_000_000

// visit counts n and what it holds, and reports false once the count tips
// (or passes maxAliasDecodes).
func (c *aliasCounter) visit(n *yaml.Node) bool {
	c.decodes++
	if c.depth > 0 {
		c.aliases++
	}
	if c.aliases > 100 && c.decodes > 1000 && float64(c.aliases)/float64(c.decodes) > allowedAliasRatio(c.decodes) {
		return false
	}
	if c.decodes > maxAliasDecodes {
		c.outer = nil
		return false
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 1 {
			return c.visit(n.Content[0])
		}
	case yaml.AliasNode:
		if n.Alias == nil || c.expanding[n] {
			return true // the decoder refuses it otherwise
		}
		if c.depth == 0 {
			c.outer = n
		}
		c.expanding[n] = true
		c.depth++
		ok := c.visit(n.Alias)
		c.depth--
		delete(c.expanding, n)
		return ok
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge" {
				if !c.merge(v) {
					return false
				}
				continue
			}
			if !c.visit(k) || !c.visit(v) {
				return false
			}
		}
	case yaml.SequenceNode:
		for _, v := range n.Content {
			if !c.visit(v) {
				return false
			}
		}
	}
	return true
}

// merge counts the value of a merge key ("<<"), as the decoder's merge
// decodes it: a mapping or alias, or a list of them, last first.
func (c *aliasCounter) merge(n *yaml.Node) bool {
	if n.Kind != yaml.SequenceNode {
		return c.visit(n)
	}
	for i := len(n.Content) - 1; i >= 0; i-- {
		if !c.visit(n.Content[i]) {
			return false
		}
	}
	return true
}

// allowedAliasRatio is go.yaml.in/yaml/v2's: how much of what it decodes
// may be within aliases, by how much it has decoded.
func allowedAliasRatio(decodes int) float64 {
	const low, high = 400_000, 4_000_000
	switch {
	case decodes <= low:
		return 0.99
	case decodes >= high:
		return 0.10
	}
	return 0.99 - 0.89*(float64(decodes-low)/float64(high-low))
}
