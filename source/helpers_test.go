package source

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func ptr[T any](v T) *T { return &v }

// service returns Service demo/<name> with cluster IP 10.96.0.10 and one
// port "http" 80/TCP, changed by mods.
func service(name string, mods ...func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name},
		Spec: corev1.ServiceSpec{
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, m := range mods {
		m(svc)
	}
	return svc
}

// endpointSlice returns EndpointSlice demo/<name> of Service demo/web with
// one port "http" 8080/TCP, changed by mods.
func endpointSlice(name string, family discoveryv1.AddressType, eps []discoveryv1.Endpoint, mods ...func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "demo", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: family,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{slicePort("http", 8080)},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func slicePort(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}
}

// endpoint returns an endpoint at addr with nil conditions (ready, serving,
// not terminating), changed by mods.
func endpoint(addr string, mods ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	for _, m := range mods {
		m(&e)
	}
	return e
}

func onNode(n string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.NodeName = ptr(n) }
}

func conditions(ready, serving, terminating bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}
	}
}

// terminatingServing is an endpoint of a pod shutting down gracefully.
var terminatingServing = conditions(false, true, true)

func zoneHints(zones ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

func nodeHints(nodes ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

func addrs(eps []state.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Addr.String())
	}
	return out
}

func ips(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// checkProblems asserts that problems holds exactly one error per entry of
// want, each containing its entry, in any order.
func checkProblems(t *testing.T, problems []error, want []string) {
	t.Helper()
	var got []string
	for _, p := range problems {
		got = append(got, p.Error())
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	used := make([]bool, len(got))
next:
	for _, w := range want {
		for i, g := range got {
			if !used[i] && strings.Contains(g, w) {
				used[i] = true
				continue next
			}
		}
		t.Errorf("no problem contains %q; got:\n%s", w, strings.Join(got, "\n"))
	}
}

func describe(sp *state.ServicePort) string {
	return fmt.Sprintf("%+v", *sp)
}
