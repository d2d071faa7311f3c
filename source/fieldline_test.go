package source

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// sliceOf is a file of a Service and its EndpointSlice of n endpoints,
// endpoint i's address being addr(i), each endpoint on four lines; first
// is the line of endpoint 0's address.
func sliceOf(n int, addr func(i int) string) (data []byte, first int) {
	var b strings.Builder
	b.WriteString(`apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 198.18.0.1
  ports:
  - port: 80
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- port: 8080
endpoints:
`)
	first = strings.Count(b.String(), "\n") + 2
	for i := range n {
		fmt.Fprintf(&b, "- addresses:\n  - %s\n  conditions: {ready: true}\n  nodeName: node-%d\n", addr(i), i)
	}
	return []byte(b.String()), first
}

// readProblems is what a read of data reports, as the loader reads it:
// the errors of the parse or, when it has none, the warnings and what
// BuildSnapshot found, located in the file; each with its line.
func readProblems(data []byte) []string {
	m, err := parseManifests(context.Background(), "gen.yaml", data, nil)
	var problems []error
	switch {
	case m == nil:
		problems = []error{err}
	case err != nil:
		problems = append(slices.Clone(m.warnings), flatten(err)...)
	default:
		_, built := BuildSnapshot(m.services, m.slices, Options{})
		problems = slices.Clone(m.warnings)
		for _, p := range built {
			problems = append(problems, m.locate(p))
		}
	}
	out := make([]string, len(problems))
	for i, p := range problems {
		var oe *ObjectError
		if errors.As(p, &oe) {
			out[i] = fmt.Sprintf("%s [line %d]", oe.format(true), oe.Line)
		} else {
			out[i] = p.Error()
		}
	}
	return out
}

// TestManyFieldErrorsParseTheDocumentOnce: a document with a problem in
// each of thousands of endpoints (a generator's bug) is parsed into nodes
// once for the lines of all of them, not once for each: 2,000 bad
// addresses took 2,000 parses of the document (a 4 MB slice with 14,000
// took some 45 minutes), the 100 unknown fields the decoder reports 100.
// Each problem is still on its own line.
func TestManyFieldErrorsParseTheDocumentOnce(t *testing.T) {
	const n = 2000
	tests := []struct {
		name   string
		addr   func(i int) string
		errors bool   // the parse's errors, else BuildSnapshot's problems
		field  string // of endpoint i
		lines  int    // problems on each endpoint's lines
	}{
		{"leading zeros, refused by the validation", func(i int) string { return fmt.Sprintf("10.0.%d.0%d", i/100, i%100) }, true, "endpoints[%d].addresses[0]", 1},
		{"link-local, refused by BuildSnapshot", func(i int) string { return fmt.Sprintf("169.254.%d.%d", i/200, i%200+1) }, false, "endpoints[%d].addresses[0]", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, first := sliceOf(n, tc.addr)
			before := documentParses.Load()
			m, err := parseManifests(context.Background(), "gen.yaml", data, nil)
			if m == nil || (err != nil) != tc.errors {
				t.Fatalf("parse: %v", err)
			}
			problems := flatten(err)
			if !tc.errors {
				_, problems = BuildSnapshot(m.services, m.slices, Options{})
				for i, p := range problems {
					problems[i] = m.locate(p)
				}
			}
			if parses := documentParses.Load() - before; parses != 1 {
				t.Errorf("the slice parsed into nodes %d times for %d problems, want once", parses, len(problems))
			}
			if len(problems) != n {
				t.Fatalf("%d problems, want %d", len(problems), n)
			}
			for i, p := range problems {
				var oe *ObjectError
				if !errors.As(p, &oe) || oe.Field != fmt.Sprintf(tc.field, i) || oe.Line != first+4*i {
					t.Fatalf("problem %d: %v (line %d), want %s on line %d", i, p, oe.Line, fmt.Sprintf(tc.field, i), first+4*i)
				}
			}
		})
	}

	t.Run("unknown fields, refused by the decoder", func(t *testing.T) {
		data, first := sliceOf(n, func(i int) string { return fmt.Sprintf("10.0.%d.%d\n  hostnme: h%d", i/200, i%200+1, i) })
		before := documentParses.Load()
		_, err := parseManifests(context.Background(), "gen.yaml", data, nil)
		problems := flatten(err)
		if parses := documentParses.Load() - before; parses != 1 {
			t.Errorf("the slice parsed into nodes %d times for %d problems, want once", parses, len(problems))
		}
		if len(problems) != 100 { // the decoder's bound (sigs.k8s.io/json)
			t.Fatalf("%d problems, want the decoder's 100", len(problems))
		}
		for i, p := range problems {
			var oe *ObjectError
			if !errors.As(p, &oe) || oe.Field != fmt.Sprintf("endpoints[%d].hostnme", i) || oe.Line != first+5*i+1 {
				t.Fatalf("problem %d: %v (line %d), want endpoints[%d].hostnme on line %d", i, p, oe.Line, i, first+5*i+1)
			}
		}
	})
}

// TestFieldLinesSameAsEachParsed: the problems of many files, each with
// several kinds of error in several documents (fields the validation,
// the decoder or BuildSnapshot refuses, values of the wrong type, YAML
// that does not parse, node ports two Services share, Lists, JSON,
// CRLF), are reported with the same messages and lines whether their
// documents are parsed once for all their problems or once for each, as
// before.
func TestFieldLinesSameAsEachParsed(t *testing.T) {
	// The first soft edits leave the file usable: their problems are
	// warnings, and BuildSnapshot's.
	const soft = 5
	edits := [][2]string{
		{"['198.19.", "['169.254."}, // link-local: BuildSnapshot
		{"  clusterIP: 198.18.", "  externalIPs: [169.254.1.1]\n  clusterIP: 198.18."}, // BuildSnapshot
		{"  clusterIP: ", "  type: NodePort\n  clusterIP: "},                           // no node port
		{"kubernetes.io/service-name: svc-", "kubernetes.io/service-name: gone-"},
		{"- name: http\n  port: 8080\n", "- name: other\n  port: 8080\n"},  // no such Service port
		{"['198.19.", "['198.019."},                                        // leading zero: validation
		{"    port: 80\n", "    port: 70000\n"},                            // validation
		{"    protocol: TCP\n", "    protocl: TCP\n"},                      // unknown field
		{"  ports:\n", "  prots: []\n  ports:\n"},                          // unknown field
		{"    targetPort: 8080\n", "    targetPort: 8080\n    port: 81\n"}, // duplicated key
		{"{ready: true}", "{ready: maybe}"},                                // wrong type
		{"  - name: http\n    port: 80\n", "  - name: http\n    port: http\n"},
		{"addressType: IPv4\n", " addressType: IPv4\n"}, // YAML syntax
		{"    targetPort: 8080\n", "    targetPort: 8080\n    nodePort: 30080\n"},
		{"kind: Service\n", "kind: Servcie\n"},
		{"  name: svc-", "  name: Svc_"},
		{"  conditions: {ready: true}\n", "  conditions: {ready: true}\n  zone: [a]\n"},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var files [][]byte
	for i := range 80 {
		data := string(generatedManifest(6, 4))
		choose := len(edits)
		if i%2 == 0 {
			choose = soft
		}
		for range 1 + rng.IntN(12) {
			e := edits[rng.IntN(choose)]
			idx := allIndexes(data, e[0])
			if len(idx) == 0 {
				continue
			}
			at := idx[rng.IntN(len(idx))]
			data = data[:at] + e[1] + data[at+len(e[0]):]
		}
		files = append(files, []byte(data))
		switch rng.IntN(4) {
		case 0:
			files = append(files, []byte(strings.ReplaceAll(data, "\n", "\r\n")))
		case 1:
			files = append(files, []byte("apiVersion: v1\nkind: List\nitems:\n- "+
				strings.ReplaceAll(strings.ReplaceAll(data, "\n", "\n  "), "\n  ---\n  ", "\n- ")))
		}
	}
	files = append(files,
		[]byte(`{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
 "spec": {"ports": [{"port": 80, "nodePort": 70000}, {"port": "x"}], "selector": {"a": "b"}}}
{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b"}, "spec": {"type": "NodePort", "ports": [{"port": 80}], "prots": 1}}
{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "a"}},
 "addressType": "IPv4", "ports": [{"port": 80}], "endpoints": [{"addresses": ["169.254.0.1"]}, {"addresses": ["10.0.0.01"]}]}
`),
		[]byte(demoManifest), []byte(lbService("a", 30100, 30080)+"---\n"+lbService("b", 30100, 30081)))

	kept, each := documentParses.Load(), int64(0)
	var problems int
	for i, data := range files {
		got := readProblems(data)
		forgetLines.Store(true)
		before := documentParses.Load()
		want := readProblems(data)
		each += documentParses.Load() - before
		forgetLines.Store(false)
		if !slices.Equal(got, want) {
			t.Fatalf("file %d:\n%s\ngot:\n%s\nwant, as each problem parsed its document:\n%s", i, data, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		problems += len(got)
	}
	kept = documentParses.Load() - each - kept
	if problems < 4*len(files) || kept >= each {
		t.Errorf("%d files, %d problems, %d parses, %d as each problem parsed its document: test too weak", len(files), problems, kept, each)
	}
	t.Logf("%d files, %d problems, %d parses, %d as each problem parsed its document", len(files), problems, kept, each)
}

func allIndexes(s, sub string) []int {
	var out []int
	for i := 0; ; {
		j := strings.Index(s[i:], sub)
		if j < 0 {
			return out
		}
		out = append(out, i+j)
		i += j + 1
	}
}

// FuzzFieldLines: whatever the file, its problems are the same whether its
// documents are parsed once for all their problems or once for each.
func FuzzFieldLines(f *testing.F) {
	f.Add([]byte(demoManifest))
	data, _ := sliceOf(3, func(i int) string { return fmt.Sprintf("169.254.0.%d\n  hostnme: x", i+1) })
	f.Add(data)
	data, _ = sliceOf(3, func(i int) string { return fmt.Sprintf("10.0.0.0%d", i+1) })
	f.Add(data)
	f.Add([]byte(`{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {"ports": [{"port": 0}]}}` + "\n" +
		`{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {"ports": [{"port": "x"}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got := readProblems(data)
		forgetLines.Store(true)
		want := readProblems(data)
		forgetLines.Store(false)
		if !slices.Equal(got, want) {
			t.Fatalf("got:\n%s\nwant, as each problem parsed its document:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}
