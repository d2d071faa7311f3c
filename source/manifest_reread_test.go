package source

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestParseManifestsReusesDocuments: a read that reuses what the documents
// of the last read decoded to says exactly what a read from scratch does,
// document numbers and lines included, after lines or documents are
// inserted or removed above.
func TestParseManifestsReusesDocuments(t *testing.T) {
	const bad = `apiVersion: v1
kind: Service
metadata: {name: bad}
spec:
  type: NodePort
  ports:
  - name: http
    port: 80
    nodePort: 30080
  - name: admin
    port: 70000
---
apiVersion: v1
kind: Service
metadata: {name: svc-3}
spec:
  ports:
  - port: 80
    prots: []
`
	data := "# header\n---\n" + string(generatedManifest(10, 2)) + "---\n" + bad
	extra := "apiVersion: v1\nkind: Service\nmetadata: {name: extra}\nspec:\n  ports:\n  - port: 81\n---\n"
	svc5 := strings.Index(data, "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-5\n")
	edits := map[string]string{
		"unchanged":               data,
		"comment lines above":     "# one\n# two\n# three\n" + data,
		"a document above":        "# header\n---\n" + extra + data[len("# header\n---\n"):],
		"a document removed":      data[:svc5] + data[strings.Index(data[svc5:], "---\n")+svc5+len("---\n"):],
		"a document edited above": strings.Replace(data, "targetPort: 8080\n", "targetPort: 8080\n  sessionAffinity: ClientIP\n", 1),
	}
	describeAll := func(errs []error) []string {
		var out []string
		for _, e := range errs {
			var oe *ObjectError
			if errors.As(e, &oe) {
				out = append(out, fmt.Sprintf("%s (line %d)", oe, oe.Line))
			} else {
				out = append(out, e.Error())
			}
		}
		return out
	}
	last, _ := parseManifests(context.Background(), "big.yaml", []byte(data), nil)
	if len(last.docs) != 2*10+1 { // all but the one that fails to decode
		t.Fatalf("%d documents kept, want 21", len(last.docs))
	}
	for name, edited := range edits {
		t.Run(name, func(t *testing.T) {
			want, wantErr := parseManifests(context.Background(), "big.yaml", []byte(edited), nil)
			got, gotErr := parseManifests(context.Background(), "big.yaml", []byte(edited), last.docs)
			if g, w := describeAll(flatten(gotErr)), describeAll(flatten(wantErr)); !slices.Equal(g, w) || len(w) == 0 {
				t.Errorf("errors:\ngot  %q\nwant %q", g, w)
			}
			if g, w := describeAll(got.warnings), describeAll(want.warnings); !slices.Equal(g, w) || len(w) == 0 {
				t.Errorf("warnings:\ngot  %q\nwant %q", g, w)
			}
			if !reflect.DeepEqual(got.services, want.services) || !reflect.DeepEqual(got.slices, want.slices) {
				t.Errorf("objects differ from a read from scratch")
			}
		})
	}

	t.Run("unchanged documents are not decoded again", func(t *testing.T) {
		// Change what the last read keeps for svc-5, as no document can:
		// the next read serves it.
		for text, d := range last.docs {
			if svc, ok := d.obj.(*corev1.Service); ok && svc.Name == "svc-5" {
				svc = svc.DeepCopy()
				svc.Spec.ClusterIP = "198.18.9.9"
				last.docs[text] = decoded{svc, d.gvk}
			}
		}
		got, _ := parseManifests(context.Background(), "big.yaml", []byte(data), last.docs)
		for _, svc := range got.services {
			if svc.Name == "svc-5" && svc.Spec.ClusterIP != "198.18.9.9" {
				t.Fatalf("svc-5 decoded again: clusterIP %s", svc.Spec.ClusterIP)
			}
		}
		// What a read returns is its own: defaults and later changes do
		// not reach what the next read reuses.
		got.services[0].Spec.ClusterIP = "changed"
		again, _ := parseManifests(context.Background(), "big.yaml", []byte(data), got.docs)
		if again.services[0].Spec.ClusterIP == "changed" {
			t.Fatal("a read's object is shared with the next read")
		}
	})
}
