package source

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestProxyProtocolAnnotation: the annotation reaches every port of the
// Service in both modes' shared semantics; a bad value is reported,
// naming the Service and the annotation, and the Service is served
// without a header.
func TestProxyProtocolAnnotation(t *testing.T) {
	annotated := func(v string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Annotations = map[string]string{AnnotationProxyProtocol: v} }
	}
	tests := []struct {
		name         string
		svc          *corev1.Service
		want         state.ProxyProtocol
		wantProblems []string
	}{
		{"absent", service("web"), state.ProxyProtocolNone, nil},
		{"v1", service("web", annotated("v1")), state.ProxyProtocolV1, nil},
		{"v2", service("web", annotated("v2")), state.ProxyProtocolV2, nil},
		{"other annotations alone", service("web", func(s *corev1.Service) { s.Annotations = map[string]string{"example.com/x": "v1"} }), state.ProxyProtocolNone, nil},
		{"a bad value", service("web", annotated("V1")), state.ProxyProtocolNone,
			[]string{`Service demo/web: metadata.annotations[kube-userspace-proxy.io/proxy-protocol]: unknown PROXY protocol version "V1" (want v1 or v2); served without a PROXY protocol header`}},
		{"empty", service("web", annotated("")), state.ProxyProtocolNone,
			[]string{`metadata.annotations[kube-userspace-proxy.io/proxy-protocol]: unknown PROXY protocol version ""`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap, problems := BuildSnapshot([]*corev1.Service{tc.svc}, nil, Options{})
			checkProblems(t, problems, tc.wantProblems)
			if snap.Len() != 1 {
				t.Fatalf("%d service ports, want 1: the Service is served either way", snap.Len())
			}
			for sp := range snap.All {
				if sp.ProxyProtocol != tc.want {
					t.Errorf("%s: ProxyProtocol %v, want %v", sp.Name, sp.ProxyProtocol, tc.want)
				}
			}
		})
	}
}

// TestProxyProtocolChangeIsAServiceChange: adding or removing the
// annotation changes the service port (so a running proxy takes it up),
// and is counted as a change of the Service, not of its endpoints.
func TestProxyProtocolChangeIsAServiceChange(t *testing.T) {
	before, _ := BuildSnapshot([]*corev1.Service{service("web")}, nil, Options{})
	after, _ := BuildSnapshot([]*corev1.Service{service("web", func(s *corev1.Service) {
		s.Annotations = map[string]string{AnnotationProxyProtocol: "v2"}
	})}, nil, Options{})
	name := before.Names()[0]
	if before.Get(name).Equal(after.Get(name)) {
		t.Fatal("the annotation's change leaves the service port Equal")
	}
	var changes state.ChangeSet
	changes.Add(name.Service(), []state.ServicePort{*before.Get(name)}, []state.ServicePort{*after.Get(name)})
	if c := changes.Changes(); len(c.Services) != 1 || len(c.Endpoints) != 0 {
		t.Fatalf("changes %+v, want one Service change and no endpoint change", c)
	}
}

// TestProxyProtocolManifestChecks: in a manifest a bad value refuses the
// edit, naming file, document, field and line; on a UDP or SCTP port the
// annotation is a warning, since only TCP gets the header.
func TestProxyProtocolManifestChecks(t *testing.T) {
	const doc = `apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
  annotations:
    example.com/other: x
    kube-userspace-proxy.io/proxy-protocol: %s
spec:
  ports:
  - {name: http, port: 80}
  - {name: dns, port: 53, protocol: UDP}
`
	t.Run("a bad value is an error", func(t *testing.T) {
		data := "# first\n---\n" + strings.Replace(doc, "%s", "v3", 1)
		_, _, _, err := ParseManifests("demo.yaml", []byte(data))
		checkProblems(t, flatten(err), []string{
			`demo.yaml: document 1 (Service demo/web): metadata.annotations[kube-userspace-proxy.io/proxy-protocol]: unknown PROXY protocol version "v3" (want v1 or v2)`,
		})
		var oe *ObjectError
		if !errors.As(err, &oe) {
			t.Fatalf("%v is not an ObjectError", err)
		}
		if want := strings.Count(data[:strings.Index(data, "kube-userspace-proxy.io/")], "\n") + 1; oe.Line != want {
			t.Errorf("line %d, want %d (the annotation's)", oe.Line, want)
		}
	})
	t.Run("a UDP port is warned about", func(t *testing.T) {
		data := strings.Replace(doc, "%s", "v1", 1)
		services, _, warnings, err := ParseManifests("demo.yaml", []byte(data))
		if err != nil {
			t.Fatal(err)
		}
		checkProblems(t, warnings, []string{
			"demo.yaml: document 1 (Service demo/web): spec.ports[1].protocol: the PROXY protocol header (annotation kube-userspace-proxy.io/proxy-protocol) is sent on TCP ports only: this UDP port is served without it",
		})
		snap, problems := BuildSnapshot(services, nil, Options{AllowNoClusterIP: true})
		checkProblems(t, problems, nil)
		for sp := range snap.All {
			if sp.ProxyProtocol != state.ProxyProtocolV1 {
				t.Errorf("%s: ProxyProtocol %v, want v1 (the data plane applies it to TCP only)", sp.Name, sp.ProxyProtocol)
			}
		}
	})
}

// TestClusterProxyProtocol: from the API server, the annotation follows
// the Service as it changes; a bad value serves the Service without a
// header and reports the problem, naming the Service and the annotation.
func TestClusterProxyProtocol(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var ignored []error
		client := fake.NewClientset(service("web"), webSlice("1", "10.0.0.1"))
		r := runCluster(t, client, func(c *Cluster) {
			c.Ignored = func(p []error) { mu.Lock(); ignored = p; mu.Unlock() }
		})
		settle()
		annotate := func(rv, v string) {
			t.Helper()
			svc := service("web", func(s *corev1.Service) {
				s.ResourceVersion = rv
				if v != "-" {
					s.Annotations = map[string]string{AnnotationProxyProtocol: v}
				}
			})
			if _, err := client.CoreV1().Services("demo").Update(t.Context(), svc, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			settle()
		}
		expect := func(want state.ProxyProtocol, problems []string) {
			t.Helper()
			if got := r.last().Get(webHTTP).ProxyProtocol; got != want {
				t.Errorf("ProxyProtocol %v, want %v", got, want)
			}
			mu.Lock()
			defer mu.Unlock()
			checkProblems(t, ignored, problems)
		}
		expect(state.ProxyProtocolNone, nil)
		annotate("2", "v2")
		expect(state.ProxyProtocolV2, nil)
		annotate("3", "v9")
		expect(state.ProxyProtocolNone, []string{`Service demo/web: metadata.annotations[kube-userspace-proxy.io/proxy-protocol]: unknown PROXY protocol version "v9" (want v1 or v2); served without a PROXY protocol header`})
		annotate("4", "v1")
		expect(state.ProxyProtocolV1, nil)
		annotate("5", "-")
		expect(state.ProxyProtocolNone, nil)
		if n, _, _ := r.counts(); n != 5 {
			t.Fatalf("applied %d snapshots, want 5: each change of the annotation is one", n)
		}
	})
}
