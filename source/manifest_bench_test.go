package source

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
)

// generatedManifest is a file of n Services, each with one EndpointSlice of
// eps endpoints, as a tester's generator writes them (2,000 Services with 5
// endpoints each is 1.5 MB).
func generatedManifest(n, eps int) []byte {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString("---\n")
		}
		fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata:
  name: svc-%[1]d
  namespace: default
spec:
  clusterIP: 198.18.%[2]d.%[3]d
  selector: {app: a%[1]d}
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%[1]d-abc
  namespace: default
  labels:
    kubernetes.io/service-name: svc-%[1]d
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
`, i, i/250, i%250+1)
		for j := range eps {
			k := i*eps + j
			fmt.Fprintf(&b, "- addresses: ['198.19.%d.%d']\n  conditions: {ready: true}\n", k/250, k%250+1)
		}
	}
	return []byte(b.String())
}

// BenchmarkParseManifests parses a generated file of 2,000 Services and
// their EndpointSlices whole, as the first read does.
func BenchmarkParseManifests(b *testing.B) {
	data := generatedManifest(2000, 5)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseManifests(context.Background(), "big.yaml", data, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkManifestEdit reads a generated file of n Services again after a
// one-line edit, as the manifest source does after each edit: read, parse,
// build the snapshot. Its time is the CPU an edit costs.
func BenchmarkManifestEdit(b *testing.B) {
	for _, n := range []int{2000, 4000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			data := generatedManifest(n, 5)
			// svc-1000's cluster IP, to one no other Service has.
			edited := bytes.Replace(data, []byte("clusterIP: 198.18.4.1\n"), []byte("clusterIP: 198.18.200.1\n"), 1)
			if bytes.Equal(edited, data) {
				b.Fatal("no line to edit")
			}
			versions := [][]byte{data, edited}
			var i int
			l := &loader{name: "big.yaml", path: "big.yaml", opts: Options{AllowLoopback: true, AllowNoClusterIP: true},
				read: func(string) ([]byte, error) { i++; return versions[i%2], nil }}
			if _, _, err := l.load(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, changed, err := l.load(context.Background()); err != nil || !changed {
					b.Fatal(changed, err)
				}
			}
		})
	}
}
