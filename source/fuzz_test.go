package source

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func FuzzParseManifests(f *testing.F) {
	f.Add([]byte(demoManifest))
	f.Add([]byte(manifestWith("10.0.0.1")))
	f.Add([]byte("apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: a}, spec: {ports: [{port: 1}]}}\n- {apiVersion: v1, kind: List, items: []}\n"))
	f.Add([]byte(`{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "x"}, "addressType": "IPv6", "endpoints": [{"addresses": ["::ffff:127.0.0.1"]}], "ports": [{}]}`))
	f.Add([]byte("---\n--- #\nkind: [\n"))
	f.Add([]byte("---\n---\n" + demoManifest + "---\n---\n---\n--- !!map\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		svcs, sl, warnings, err := ParseManifests("fuzz.yaml", data)
		for _, e := range append(flatten(err), warnings...) {
			if !strings.Contains(e.Error(), "fuzz.yaml") {
				t.Errorf("problem does not name the file: %v", e)
			}
			var oe *ObjectError
			if errors.As(e, &oe) && (oe.Line < 0 || oe.Line > bytes.Count(data, []byte("\n"))+1) {
				t.Errorf("problem names line %d, outside the file: %v", oe.Line, e)
			}
		}
		if err != nil {
			return
		}
		snap, _ := BuildSnapshot(svcs, sl, Options{NodeName: "n", AllowLoopback: true, AllowNoClusterIP: true})
		checkSnapshot(t, snap, true)
	})
}

// FuzzBuildSnapshot feeds BuildSnapshot objects with nil pointers where the
// API allows them and addresses repeated across endpoints and slices.
func FuzzBuildSnapshot(f *testing.F) {
	f.Add("10.0.0.1", "10.0.0.1", "http", int32(8080), uint32(0))
	f.Add("::ffff:127.0.0.1", "fe80::1", "", int32(0), uint32(0xffffffff))
	f.Add("169.254.169.254", "10.0.0.2", "http", int32(-1), uint32(0x5a5a5a5a))
	f.Add("", "fd00::1", "dns", int32(70000), uint32(0x12345678))
	f.Fuzz(func(t *testing.T, addr1, addr2, portName string, port int32, bits uint32) {
		bit := func(i int) bool { return bits&(1<<i) != 0 }
		maybe := func(i int, v bool) *bool {
			if bit(i) {
				return nil
			}
			return &v
		}
		family := discoveryv1.AddressTypeIPv4
		if bit(0) {
			family = discoveryv1.AddressTypeIPv6
		}
		ep := func(addr string, b int) discoveryv1.Endpoint {
			e := discoveryv1.Endpoint{
				Conditions: discoveryv1.EndpointConditions{
					Ready: maybe(b, bit(b+1)), Serving: maybe(b+2, bit(b+3)), Terminating: maybe(b+4, bit(b+5)),
				},
			}
			if !bit(b + 6) {
				e.Addresses = []string{addr}
			}
			if bit(b + 7) {
				e.NodeName = ptr("n")
			}
			if bit(b + 8) {
				e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z"}}}
			}
			if bit(b + 9) {
				if e.Hints == nil {
					e.Hints = &discoveryv1.EndpointHints{}
				}
				e.Hints.ForNodes = []discoveryv1.ForNode{{Name: "n"}}
			}
			return e
		}
		p := discoveryv1.EndpointPort{Port: &port}
		if !bit(1) {
			p.Name = &portName
		}
		if bit(2) {
			p.Protocol = ptr(corev1.ProtocolUDP)
		}
		eps := []discoveryv1.Endpoint{ep(addr1, 3), ep(addr2, 13), ep(addr1, 13)}
		slices := []*discoveryv1.EndpointSlice{
			endpointSlice("web-1", family, eps, func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{p, p} }),
			endpointSlice("web-2", family, eps[1:], func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{p} }),
			nil,
		}
		svc := service("web", func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Name: portName, Port: port}, {Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP}}
			s.Spec.ExternalIPs = []string{addr1, addr2}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addr2}}
			if bit(23) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = addr1, nil
			}
			if bit(24) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &port}}
			}
			if bit(25) {
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
			}
		})
		opts := Options{NodeName: "n", NodeLabels: map[string]string{corev1.LabelTopologyZone: "z"}, AllowLoopback: bit(26), AllowNoClusterIP: bit(27)}
		snap, problems := BuildSnapshot([]*corev1.Service{svc, nil, svc}, slices, opts)
		for _, p := range problems {
			var oe *ObjectError
			if !errors.As(p, &oe) || oe.Name == "" || oe.Kind == "" {
				t.Errorf("problem does not name its object: %v", p)
			}
		}
		checkSnapshot(t, snap, opts.AllowLoopback)
	})
}

// checkSnapshot checks what must hold of any snapshot: endpoints sorted,
// unique and never refused; local sets local; affinity timeouts valid.
func checkSnapshot(t *testing.T, snap state.Snapshot, allowLoopback bool) {
	t.Helper()
	for sp := range snap.All {
		for _, set := range [][]state.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
			for i, e := range set {
				if err := checkAddr(e.Addr.Addr(), allowLoopback); err != nil || e.Addr.Addr().Is4In6() || e.Addr.Port() == 0 {
					t.Errorf("%s: endpoint %s should have been refused (%v)", sp.Name, e, err)
				}
				if i > 0 && set[i-1].Addr.Compare(e.Addr) >= 0 {
					t.Errorf("%s: endpoints not sorted and unique: %v", sp.Name, set)
				}
			}
		}
		for _, e := range sp.LocalEndpoints {
			if !e.Local {
				t.Errorf("%s: local set holds %s on node %q", sp.Name, e, e.NodeName)
			}
		}
		for _, ip := range sp.Frontends() {
			if err := checkAddr(ip.Addr(), allowLoopback); err != nil {
				t.Errorf("%s: frontend %s should have been refused", sp.Name, ip)
			}
		}
		if sp.Affinity.Sticky() && (sp.Affinity.Timeout <= 0 || sp.Affinity.Timeout > maxAffinitySeconds*1e9) {
			t.Errorf("%s: affinity timeout %s", sp.Name, sp.Affinity.Timeout)
		}
	}
}
