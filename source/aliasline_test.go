package source

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// laughs is a "billion laughs" of nine levels, as a list of lists or a map
// of maps, indented by indent.
func laughs(indent string, maps bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%sa: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n", indent)
	for l := 'b'; l <= 'i'; l++ {
		var refs []string
		for k := range 9 {
			if maps {
				refs = append(refs, fmt.Sprintf("k%d: *%c", k, l-1))
			} else {
				refs = append(refs, fmt.Sprintf("*%c", l-1))
			}
		}
		if maps {
			fmt.Fprintf(&b, "%s%c: &%[2]c {%s}\n", indent, l, strings.Join(refs, ", "))
		} else {
			fmt.Fprintf(&b, "%s%c: &%[2]c [%s]\n", indent, l, strings.Join(refs, ","))
		}
	}
	return b.String()
}

// TestExcessiveAliasingNamesItsLine: a document the YAML decoder refuses
// for excessive aliasing (a "billion laughs") is reported on the line of
// the alias it gave up in, where the message named the document's first
// line (FILE:1 for a file that starts with it). The line is the decoder's:
// the document up to the line before decodes, up to that line it does not.
func TestExcessiveAliasingNamesItsLine(t *testing.T) {
	service := "apiVersion: v1\nkind: Service\nmetadata:\n  name: ok\nspec:\n  clusterIP: 198.18.0.1\n  ports:\n  - port: 80\n"
	for _, tc := range []struct {
		name, file string
		want       string
	}{
		{"first document", laughs("", false), "bomb.yaml:4: document 1: yaml: document contains excessive aliasing"},
		{"maps", laughs("", true), "bomb.yaml:4: document 1: yaml: document contains excessive aliasing"},
		{"in a Service's labels, after another", service + "---\n" + strings.Replace(service, "name: ok\n", "name: bomb\n  labels:\n"+laughs("    ", false), 1),
			"bomb.yaml:18: document 2: yaml: document contains excessive aliasing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseManifests(context.Background(), "bomb.yaml", []byte(tc.file), nil)
			if got := fmt.Sprint(withLines(err)); got != tc.want {
				t.Fatalf("%q\nwant %q", got, tc.want)
			}
			// The decoder's own line: the lines before it decode.
			var line int
			fmt.Sscanf(strings.TrimPrefix(tc.want, "bomb.yaml:"), "%d", &line)
			lines := bytes.SplitAfter([]byte(tc.file), []byte("\n"))
			start := 0
			for i, l := range lines[:line] {
				if bytes.HasPrefix(l, []byte("---")) {
					start = i + 1
				}
			}
			if _, err := sigsyaml.YAMLToJSON(bytes.Join(lines[start:line-1], nil)); err != nil {
				t.Errorf("the document up to line %d: %v", line-1, err)
			}
			if _, err := sigsyaml.YAMLToJSON(bytes.Join(lines[start:line], nil)); err == nil || !strings.Contains(err.Error(), "excessive aliasing") {
				t.Errorf("the document up to line %d: %v; want excessive aliasing", line, err)
			}
		})
	}
}

// TestExcessiveAliasLineBounded: a document whose aliases never make the
// decoder give up, or that does not parse, has no such line.
func TestExcessiveAliasLineBounded(t *testing.T) {
	for _, doc := range []string{"a: &a [1, 2]\nb: *a\n", "a: [\n", "a: &a {b: *a}\n", ""} {
		if l := excessiveAliasLine([]byte(doc)); l != 0 {
			t.Errorf("%q: line %d; want 0", doc, l)
		}
	}
}

// FuzzExcessiveAliasLine: any document gives a line within it, or 0, and
// the count ends (it is bounded as the decoder's is).
func FuzzExcessiveAliasLine(f *testing.F) {
	f.Add([]byte(laughs("", false)))
	f.Add([]byte(laughs("", true)))
	f.Add([]byte("a: &a {b: *a}\n"))
	f.Add([]byte("a: &a {x: 1}\nb: {<<: [*a, *a], y: *a}\n"))
	f.Fuzz(func(t *testing.T, doc []byte) {
		if l := excessiveAliasLine(doc); l < 0 || l > bytes.Count(doc, []byte("\n"))+1 {
			t.Errorf("line %d of a document of %d lines", l, bytes.Count(doc, []byte("\n"))+1)
		}
	})
}

// TestExcessiveAliasLineAgreesWithTheDecoder: near where the decoder
// gives up, a document has a line exactly when the decoder refuses it. An
// alias of a list of k items costs k+2 decodes, k+1 of them within the
// alias, so past about 200 aliases of 200 items more than 99% of the
// decodes are, and the decoder refuses the document; aliases of smaller
// lists never get there at this length. (Its lower bounds, more than 1,000
// decodes and 100 of them in aliases, cannot decide alone: a document
// with so few decodes, 99% of them in aliases, cannot be written.)
func TestExcessiveAliasLineAgreesWithTheDecoder(t *testing.T) {
	doc := func(k, n int) string {
		return "a: &a [" + strings.TrimSuffix(strings.Repeat("1,", k), ",") + "]\n" +
			"b: [" + strings.TrimSuffix(strings.Repeat("*a,", n), ",") + "]\n"
	}
	var docs []string
	for _, n := range []int{100, 200, 203, 204, 205, 206, 210, 400} {
		docs = append(docs, doc(200, n))
	}
	for _, n := range []int{100, 1000, 3000} {
		docs = append(docs, doc(100, n), doc(10, n))
	}
	refused := 0
	for _, doc := range docs {
		_, err := sigsyaml.YAMLToJSON([]byte(doc))
		decoderRefuses := err != nil && strings.Contains(err.Error(), "excessive aliasing")
		if err != nil && !decoderRefuses {
			t.Fatalf("%.40q: %v", doc, err)
		}
		if decoderRefuses {
			refused++
		}
		if l := excessiveAliasLine([]byte(doc)); (l != 0) != decoderRefuses {
			t.Errorf("%d aliases of a list of %d: line %d, but the decoder refuses it: %v",
				strings.Count(doc, "*a"), strings.Count(doc[:strings.Index(doc, "]")], "1"), l, decoderRefuses)
		}
	}
	if refused == 0 || refused == len(docs) {
		t.Fatalf("the decoder refused %d of %d documents: none is near its bounds", refused, len(docs))
	}
	t.Logf("the decoder refused %d of %d", refused, len(docs))
}
