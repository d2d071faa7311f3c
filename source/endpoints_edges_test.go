package source

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// buildWeb builds svc (service("web") if nil) with slices and returns its
// port http/TCP, failing the test if it is not served, and the problems.
func buildWeb(t *testing.T, svc *corev1.Service, sl []*discoveryv1.EndpointSlice, opts Options) (*state.ServicePort, []error) {
	t.Helper()
	if svc == nil {
		svc = service("web")
	}
	snap, problems := BuildSnapshot([]*corev1.Service{svc}, sl, opts)
	sp := snap.Get(webHTTP)
	if sp == nil {
		t.Fatalf("no port %s in %v; problems %v", webHTTP, snap.Names(), problems)
	}
	return sp, problems
}

// TestDuplicateEndpointsEdges: which copy of an address that two slices
// hold is kept. A terminating copy never replaces a running one, not
// even when it is the local one (kube-proxy's EndpointSliceCache keeps a
// newcomer only when it is not terminating); among copies alike the one
// of the slice whose name sorts first wins, whatever order the slices
// come in, so that the snapshot does not depend on the informer's order.
func TestDuplicateEndpointsEdges(t *testing.T) {
	const v4 = discoveryv1.AddressTypeIPv4
	type eps = []discoveryv1.Endpoint
	here := Options{NodeName: "node-a"}
	tests := []struct {
		name      string
		slices    []*discoveryv1.EndpointSlice
		want      []state.Endpoint // ClusterEndpoints
		wantLocal []string
	}{
		{
			name: "a local terminating newcomer does not replace a running copy on another node",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-1", v4, eps{endpoint("10.0.0.1", onNode("node-b"))}),
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.1", onNode("node-a"), terminatingServing)}),
			},
			want: []state.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:8080"), Ready: true, Serving: true, NodeName: "node-b"}},
		},
		{
			name: "copies alike on other nodes: the first slice by name, though it comes last",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-3", v4, eps{endpoint("10.0.0.1", onNode("node-d"))}),
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.1", onNode("node-c"))}),
				endpointSlice("web-1", v4, eps{endpoint("10.0.0.1", onNode("node-b"))}),
			},
			want: []state.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:8080"), Ready: true, Serving: true, NodeName: "node-b"}},
		},
		{
			name: "copies alike, both terminating, on other nodes: the first slice by name",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.1", onNode("node-c"), terminatingServing)}),
				endpointSlice("web-1", v4, eps{endpoint("10.0.0.1", onNode("node-b"), terminatingServing)}),
			},
			want: []state.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:8080"), Serving: true, Terminating: true, NodeName: "node-b"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Either order of the slices gives the same endpoints.
			reversed := slices.Clone(tc.slices)
			slices.Reverse(reversed)
			for _, order := range [][]*discoveryv1.EndpointSlice{tc.slices, reversed} {
				sp, problems := buildWeb(t, nil, order, here)
				checkProblems(t, problems, nil)
				if !slices.Equal(sp.ClusterEndpoints, tc.want) {
					t.Errorf("cluster endpoints:\n got %+v\nwant %+v", sp.ClusterEndpoints, tc.want)
				}
				if got := addrs(sp.LocalEndpoints); !slices.Equal(got, tc.wantLocal) {
					t.Errorf("local endpoints: got %q, want %q", got, tc.wantLocal)
				}
			}
		})
	}
}

// TestSlicePortBounds: a slice port number is used when it is 1-65535;
// a negative one is refused and reported, not wrapped into the uint16
// range (-1 would become 65535).
func TestSlicePortBounds(t *testing.T) {
	tests := []struct {
		name         string
		port         int32
		want         []string
		wantProblems []string
	}{
		{name: "65535 is a port", port: 65535, want: []string{"10.0.0.1:65535"}},
		{name: "1 is a port", port: 1, want: []string{"10.0.0.1:1"}},
		{name: "-1 is refused", port: -1, wantProblems: []string{"EndpointSlice demo/web-1: ports[0].port: -1 is out of range 1-65535"}},
		{name: "-65535 is refused", port: -65535, wantProblems: []string{"ports[0].port: -65535 is out of range 1-65535"}},
		{name: "65536 is refused", port: 65536, wantProblems: []string{"ports[0].port: 65536 is out of range 1-65535"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.0.1")},
				func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{slicePort("http", tc.port)} })
			sp, problems := buildWeb(t, nil, []*discoveryv1.EndpointSlice{s}, Options{})
			checkProblems(t, problems, tc.wantProblems)
			if got := addrs(sp.ClusterEndpoints); !slices.Equal(got, tc.want) {
				t.Errorf("cluster endpoints: got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestEndpointTopology: Endpoint.Topology names the hint that let an
// endpoint into ClusterEndpoints, "node <name>" or "zone <name>", and is
// empty when hints did not narrow them (ignored, absent, or the
// serving-terminating fallback, which hints do not apply to).
func TestEndpointTopology(t *testing.T) {
	type eps = []discoveryv1.Endpoint
	here := Options{NodeName: "node-a", NodeLabels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}
	tests := []struct {
		name string
		eps  eps
		want map[string]string // address to Topology, for every cluster endpoint
	}{
		{
			name: "node hints",
			eps:  eps{endpoint("10.0.0.1", nodeHints("node-a"), zoneHints("zone-a")), endpoint("10.0.0.2", nodeHints("node-b"), zoneHints("zone-a"))},
			want: map[string]string{"10.0.0.1:8080": "node node-a"},
		},
		{
			// Only ready endpoints must carry a hint (kube-proxy's
			// topology.go looks at the ready ones).
			name: "node hints: an endpoint that is not ready needs none",
			eps: eps{
				endpoint("10.0.0.1", nodeHints("node-a")), endpoint("10.0.0.2", nodeHints("node-b")),
				endpoint("10.0.0.3", conditions(false, false, false)),
			},
			want: map[string]string{"10.0.0.1:8080": "node node-a"},
		},
		{
			name: "zone hints",
			eps:  eps{endpoint("10.0.0.1", zoneHints("zone-a")), endpoint("10.0.0.2", zoneHints("zone-b"))},
			want: map[string]string{"10.0.0.1:8080": "zone zone-a"},
		},
		{
			name: "node hints for other nodes: zone hints",
			eps:  eps{endpoint("10.0.0.1", nodeHints("node-b"), zoneHints("zone-a")), endpoint("10.0.0.2", nodeHints("node-c"), zoneHints("zone-b"))},
			want: map[string]string{"10.0.0.1:8080": "zone zone-a"},
		},
		{
			name: "hints ignored",
			eps:  eps{endpoint("10.0.0.1", zoneHints("zone-a")), endpoint("10.0.0.2")},
			want: map[string]string{"10.0.0.1:8080": "", "10.0.0.2:8080": ""},
		},
		{
			name: "no hints",
			eps:  eps{endpoint("10.0.0.1")},
			want: map[string]string{"10.0.0.1:8080": ""},
		},
		{
			name: "serving-terminating fallback",
			eps:  eps{endpoint("10.0.0.1", terminatingServing, zoneHints("zone-a")), endpoint("10.0.0.2", terminatingServing, zoneHints("zone-b"))},
			want: map[string]string{"10.0.0.1:8080": "", "10.0.0.2:8080": ""},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, tc.eps)
			sp, _ := buildWeb(t, nil, []*discoveryv1.EndpointSlice{s}, here)
			got := make(map[string]string)
			for _, e := range sp.ClusterEndpoints {
				got[e.Addr.String()] = e.Topology
			}
			if len(got) != len(tc.want) {
				t.Fatalf("cluster endpoints %+v, want %v", sp.ClusterEndpoints, tc.want)
			}
			for a, w := range tc.want {
				if g, ok := got[a]; !ok || g != w {
					t.Errorf("%s: topology %q (present %v), want %q", a, g, ok, w)
				}
			}
		})
	}
}

// TestHintsIgnoredWhenExternallyReachable: with internalTrafficPolicy
// Local, a port still sends traffic to its ClusterEndpoints when it is
// reachable from outside, by a node port, an external IP or a
// load-balancer IP (kube-proxy's UsesClusterEndpoints: iTP Cluster or
// ExternallyAccessible), so unusable hints are said to be ignored.
func TestHintsIgnoredWhenExternallyReachable(t *testing.T) {
	local := func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal) }
	tests := []struct {
		name string
		svc  *corev1.Service
		want string
	}{
		{name: "internal only", svc: service("web", local), want: ""},
		{name: "node port", svc: service("web", local, func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
		}), want: "zone hints ignored: none is for zone zone-a"},
		{name: "external IP", svc: service("web", local, func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"192.0.2.1"}
		}), want: "zone hints ignored: none is for zone zone-a"},
		{name: "load-balancer IP without node ports", svc: service("web", local, func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.AllocateLoadBalancerNodePorts = ptr(false)
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.2"}}
		}), want: "zone hints ignored: none is for zone zone-a"},
	}
	here := Options{NodeName: "node-a", NodeLabels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{
				endpoint("10.0.0.1", zoneHints("zone-b")), endpoint("10.0.0.2", zoneHints("zone-c")),
			})
			sp, problems := buildWeb(t, tc.svc, []*discoveryv1.EndpointSlice{s}, here)
			checkProblems(t, problems, nil)
			if !sp.InternalLocal {
				t.Fatalf("port is not internalTrafficPolicy Local: %s", describe(sp))
			}
			if sp.TopologyHintsIgnored != tc.want {
				t.Errorf("topology hints ignored: got %q, want %q\nport %s", sp.TopologyHintsIgnored, tc.want, describe(sp))
			}
		})
	}
}

// TestHintsIgnoredAlikeInBothFamilies: when both families ignore their
// hints for the same reason, it is said once, without naming a family.
func TestHintsIgnoredAlikeInBothFamilies(t *testing.T) {
	svc := service("web", func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.10", []string{"10.96.0.10", "fd00::10"}
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	sl := []*discoveryv1.EndpointSlice{
		endpointSlice("web-v4", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.0.1", zoneHints("zone-b"))}),
		endpointSlice("web-v6", discoveryv1.AddressTypeIPv6, []discoveryv1.Endpoint{endpoint("fd00::1", zoneHints("zone-b"))}),
	}
	sp, _ := buildWeb(t, svc, sl, Options{NodeName: "node-a", NodeLabels: map[string]string{corev1.LabelTopologyZone: "zone-a"}})
	if want := "zone hints ignored: none is for zone zone-a"; sp.TopologyHintsIgnored != want {
		t.Errorf("topology hints ignored: got %q, want %q", sp.TopologyHintsIgnored, want)
	}
}

// TestServiceWithoutFamilyTakesBothFamilies: a Service that states
// neither a cluster IP nor ipFamilies (a manifest may leave both out)
// takes the endpoints of IPv4 and IPv6 slices alike.
func TestServiceWithoutFamilyTakesBothFamilies(t *testing.T) {
	svc := service("web", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = "", nil, nil })
	sl := []*discoveryv1.EndpointSlice{
		endpointSlice("web-v4", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.0.1")}),
		endpointSlice("web-v6", discoveryv1.AddressTypeIPv6, []discoveryv1.Endpoint{endpoint("fd00::1")}),
	}
	sp, problems := buildWeb(t, svc, sl, Options{AllowNoClusterIP: true})
	checkProblems(t, problems, nil)
	if got, want := addrs(sp.ClusterEndpoints), []string{"10.0.0.1:8080", "[fd00::1]:8080"}; !slices.Equal(got, want) {
		t.Errorf("cluster endpoints: got %q, want %q", got, want)
	}
}

// TestServingEndpointsReadyCounts: a ready endpoint is serving, even when
// its serving condition (which the API server does not check against
// ready) says otherwise, and even when hints keep it out of
// ClusterEndpoints.
func TestServingEndpointsReadyCounts(t *testing.T) {
	s := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{
		endpoint("10.0.0.1", zoneHints("zone-a")),
		endpoint("10.0.0.2", zoneHints("zone-b"), conditions(true, false, false)),
	})
	sp, _ := buildWeb(t, nil, []*discoveryv1.EndpointSlice{s}, Options{NodeLabels: map[string]string{corev1.LabelTopologyZone: "zone-a"}})
	want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:8080")}
	if !slices.Equal(sp.ServingEndpoints, want) {
		t.Errorf("serving endpoints %v, want %v", sp.ServingEndpoints, want)
	}
}

// TestOtherServicesFrontendBeforeOwnNodePort: built one Service at a time
// (the informer source), an endpoint that is another Service's frontend
// is ignored even when its port is also this Service's own node port: the
// frontend captures it on any address, the node port only on this host's.
func TestOtherServicesFrontendBeforeOwnNodePort(t *testing.T) {
	db := state.ServicePortName{Namespace: "demo", Name: "db", Port: "sql", Protocol: state.TCP}
	others := newFrontIndex()
	others.add(&state.ServicePort{Name: db, Port: 31888, ClusterIPs: ips("10.96.0.20")})
	svc := service("web", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 31888
	})
	s := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.96.0.20"), endpoint("10.0.0.1")},
		func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{slicePort("http", 31888)} })
	sp, problems := buildWeb(t, svc, []*discoveryv1.EndpointSlice{s}, Options{others: others})
	checkProblems(t, problems, []string{"EndpointSlice demo/web-1: endpoints[0].addresses[0]: 10.96.0.20:31888 is Service demo/db:sql/TCP's frontend; the proxy would capture its own connection to it; ignored"})
	if got, want := addrs(sp.ClusterEndpoints), []string{"10.0.0.1:31888"}; !slices.Equal(got, want) {
		t.Errorf("cluster endpoints: got %q, want %q", got, want)
	}
}

// TestFrontIndexChanged: a frontend or node port that came, went or
// passed to another Service is in the change, one that stayed with its
// owner is not.
func TestFrontIndexChanged(t *testing.T) {
	name := func(svc string) state.ServicePortName {
		return state.ServicePortName{Namespace: "demo", Name: svc, Port: "http", Protocol: state.TCP}
	}
	key := func(s string) frontKey { return frontKey{state.TCP, netip.MustParseAddrPort(s)} }
	x, y := newFrontIndex(), newFrontIndex()
	x.fronts[key("10.96.0.1:80")] = name("a") // stays
	y.fronts[key("10.96.0.1:80")] = name("a")
	x.fronts[key("10.96.0.2:80")] = name("a") // passes to b
	y.fronts[key("10.96.0.2:80")] = name("b")
	x.fronts[key("10.96.0.3:80")] = name("a") // goes
	y.fronts[key("10.96.0.4:80")] = name("b") // comes
	x.nodePorts[key("0.0.0.0:30001")] = name("a")
	y.nodePorts[key("0.0.0.0:30001")] = name("b") // passes to b
	x.nodePorts[key("0.0.0.0:30002")] = name("a") // stays
	y.nodePorts[key("0.0.0.0:30002")] = name("a")

	got := x.changed(y)
	for _, k := range []string{"10.96.0.2:80", "10.96.0.3:80", "10.96.0.4:80"} {
		if _, ok := got.fronts[key(k)]; !ok {
			t.Errorf("frontend %s not in the change %v", k, got.fronts)
		}
	}
	if _, ok := got.fronts[key("10.96.0.1:80")]; ok || len(got.fronts) != 3 {
		t.Errorf("frontends changed: %v; want 10.96.0.2-4:80", got.fronts)
	}
	if _, ok := got.nodePorts[key("0.0.0.0:30001")]; !ok || len(got.nodePorts) != 1 {
		t.Errorf("node ports changed: %v; want 0.0.0.0:30001", got.nodePorts)
	}
	if !x.changed(x).empty() {
		t.Error("an index changed from itself")
	}
}
