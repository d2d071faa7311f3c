package source

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func TestBuildSnapshotEndpoints(t *testing.T) {
	const v4, v6 = discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	type eps = []discoveryv1.Endpoint
	here := Options{NodeName: "node-a", NodeLabels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}
	dualStack := service("web", func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.10", []string{"10.96.0.10", "fd00::10"}
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})

	tests := []struct {
		name         string
		service      *corev1.Service // service("web") if nil
		others       []*corev1.Service
		slices       []*discoveryv1.EndpointSlice
		opts         Options
		wantCluster  []string // ClusterEndpoints of demo/web:http/TCP
		wantLocal    []string // LocalEndpoints of demo/web:http/TCP
		wantProblems []string
		wantHints    string // its TopologyHintsIgnored
	}{
		{
			name:        "nil conditions mean ready; sorted by address",
			slices:      []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("10.0.0.3"), endpoint("10.0.0.1"), endpoint("10.0.0.20")})},
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.3:8080", "10.0.0.20:8080"},
		},
		{
			name:        "leading zeros, as older API servers stored them, read as decimal",
			slices:      []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("010.000.000.009"), endpoint("10.0.0.10")})},
			wantCluster: []string{"10.0.0.9:8080", "10.0.0.10:8080"},
		},
		{
			name: "ready only; not-ready serving endpoints are left out",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1"),
				endpoint("10.0.0.2", conditions(false, true, false)),
				endpoint("10.0.0.3", terminatingServing),
			})},
			wantCluster: []string{"10.0.0.1:8080"},
		},
		{
			name: "no ready endpoint: serving and terminating ones",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", conditions(false, false, true)),
				endpoint("10.0.0.2", conditions(false, true, false)),
				endpoint("10.0.0.3", terminatingServing),
				endpoint("10.0.0.4", terminatingServing),
			})},
			wantCluster: []string{"10.0.0.3:8080", "10.0.0.4:8080"},
		},
		{
			name:   "nothing ready or serving: no endpoints",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("10.0.0.1", conditions(false, false, false))})},
		},
		{
			name: "zone hints honoured when every ready endpoint has one",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", zoneHints("zone-a")),
				endpoint("10.0.0.2", zoneHints("zone-b")),
				endpoint("10.0.0.3", zoneHints("zone-b", "zone-a")),
				endpoint("10.0.0.4", conditions(false, false, false)), // not ready: needs no hint
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.3:8080"},
		},
		{
			name: "zone hints ignored when one ready endpoint has none",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", zoneHints("zone-a")),
				endpoint("10.0.0.2", zoneHints("zone-b")),
				endpoint("10.0.0.3"),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"},
			wantHints:   "zone hints ignored: only 2 of 3 ready endpoints carry one",
		},
		{
			name: "zone hints ignored when none names this zone",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", zoneHints("zone-b")),
				endpoint("10.0.0.2", zoneHints("zone-c")),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
			wantHints:   "zone hints ignored: none is for zone zone-a",
		},
		{
			name: "zone hints ignored when the node has no zone",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", zoneHints("zone-a")),
				endpoint("10.0.0.2", zoneHints("zone-b")),
			})},
			opts:        Options{NodeName: "node-a"},
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
			wantHints:   "zone hints ignored: this node's zone is not known (no topology.kubernetes.io/zone label on its Node; with --manifests there is no Node, so zone hints never apply there, node hints do)",
		},
		{
			name: "node hints win over zone hints",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", zoneHints("zone-a"), nodeHints("node-b")),
				endpoint("10.0.0.2", zoneHints("zone-a"), nodeHints("node-a")),
				endpoint("10.0.0.3", zoneHints("zone-b"), nodeHints("node-c")),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.2:8080"},
		},
		{
			name: "node hints not on every endpoint: zone hints apply",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", zoneHints("zone-a"), nodeHints("node-a")),
				endpoint("10.0.0.2", zoneHints("zone-a")),
				endpoint("10.0.0.3", zoneHints("zone-b")),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
			wantHints:   "node hints ignored: only 1 of 3 ready endpoints carry one",
		},
		{
			name: "node hints for other nodes: zone hints apply, and the node hints are said to be ignored",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", zoneHints("zone-a"), nodeHints("node-b")),
				endpoint("10.0.0.2", zoneHints("zone-b"), nodeHints("node-c")),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080"},
			wantHints:   "node hints ignored: none is for node node-a",
		},
		{
			name: "neither node nor zone hints usable: both reasons",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", zoneHints("zone-b"), nodeHints("node-b")),
				endpoint("10.0.0.2", zoneHints("zone-c"), nodeHints("node-c")),
			})},
			opts:        Options{NodeLabels: map[string]string{corev1.LabelTopologyZone: "zone-a"}},
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
			wantHints:   "node hints ignored: this proxy has no node name; zone hints ignored: none is for zone zone-a",
		},
		{
			name:    "hints of a port that sends nothing to its cluster endpoints are not said to be ignored",
			service: service("web", func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal) }),
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", zoneHints("zone-b"), onNode("node-a")),
				endpoint("10.0.0.2", zoneHints("zone-c")),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
			wantLocal:   []string{"10.0.0.1:8080"},
		},
		{
			name: "hints do not apply to the serving-terminating fallback",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", terminatingServing, zoneHints("zone-a")),
				endpoint("10.0.0.2", terminatingServing, zoneHints("zone-b")),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
		},
		{
			name: "local set: this node's ready endpoints",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", onNode("node-a")),
				endpoint("10.0.0.2", onNode("node-b")),
				endpoint("10.0.0.3", onNode("node-a"), terminatingServing),
				endpoint("10.0.0.4"),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.4:8080"},
			wantLocal:   []string{"10.0.0.1:8080"},
		},
		{
			name: "local set falls back on its own, even when other nodes are ready",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", onNode("node-b")),
				endpoint("10.0.0.3", onNode("node-a"), terminatingServing),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080"},
			wantLocal:   []string{"10.0.0.3:8080"},
		},
		{
			// As kube-proxy's CategorizeEndpoints: the fallback takes
			// serving endpoints only when they are terminating.
			name: "local fallback leaves out a serving endpoint that is neither ready nor terminating",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", onNode("node-b")),
				endpoint("10.0.0.2", onNode("node-a"), conditions(false, true, false)),
				endpoint("10.0.0.3", onNode("node-a"), terminatingServing),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080"},
			wantLocal:   []string{"10.0.0.3:8080"},
		},
		{
			name: "local fallback: a serving endpoint that is neither ready nor terminating is none",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				endpoint("10.0.0.1", onNode("node-b")),
				endpoint("10.0.0.2", onNode("node-a"), conditions(false, true, false)),
			})},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080"},
			wantLocal:   nil,
		},
		{
			name:        "no node name: nothing is local",
			slices:      []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("10.0.0.1", onNode(""))})},
			wantCluster: []string{"10.0.0.1:8080"},
		},
		{
			name: "duplicate across slices: a non-terminating newcomer replaces a terminating one",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-1", v4, eps{endpoint("10.0.0.1", terminatingServing, onNode("node-a"))}),
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.1", onNode("node-b"))}),
			},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080"},
			wantLocal:   nil, // the ready copy is on node-b
		},
		{
			name: "duplicate across slices: a local newcomer replaces a copy on another node, as kube-proxy favours it",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-1", v4, eps{endpoint("10.0.0.1", onNode("node-b"))}),
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.1", onNode("node-a"))}),
				endpointSlice("web-3", v4, eps{endpoint("10.0.0.1", onNode("node-c"))}),
			},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080"},
			wantLocal:   []string{"10.0.0.1:8080"},
		},
		{
			name: "duplicate across slices: otherwise the first is kept",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.1", onNode("node-b"))}),
				endpointSlice("web-1", v4, eps{endpoint("10.0.0.1", onNode("node-a"))}), // sorts first
				endpointSlice("web-3", v4, eps{endpoint("10.0.0.1", terminatingServing, onNode("node-c"))}),
			},
			opts:        here,
			wantCluster: []string{"10.0.0.1:8080"},
			wantLocal:   []string{"10.0.0.1:8080"},
		},
		{
			name:    "dual-stack IPv4 and IPv6 slices",
			service: dualStack,
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-v6", v6, eps{endpoint("fd00::2"), endpoint("fd00::1")}),
				endpointSlice("web-v4", v4, eps{endpoint("10.0.0.1")}),
			},
			wantCluster: []string{"10.0.0.1:8080", "[fd00::1]:8080", "[fd00::2]:8080"},
		},
		{
			// kube-proxy runs a proxier per family: each falls back to
			// serving, terminating endpoints, and honours hints, on its
			// own family's endpoints alone.
			name:    "dual stack: an IPv6 family with only terminating endpoints falls back by itself",
			service: dualStack,
			opts:    here,
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-v4", v4, eps{endpoint("10.0.0.1", onNode("node-a"))}),
				endpointSlice("web-v6", v6, eps{endpoint("fd00::1", terminatingServing, onNode("node-a"))}),
			},
			wantCluster: []string{"10.0.0.1:8080", "[fd00::1]:8080"},
			wantLocal:   []string{"10.0.0.1:8080", "[fd00::1]:8080"},
		},
		{
			name:    "dual stack: hints are honoured per family",
			service: dualStack,
			opts:    here,
			slices: []*discoveryv1.EndpointSlice{
				// IPv4: every endpoint hinted, one for zone-a: only it.
				endpointSlice("web-v4", v4, eps{endpoint("10.0.0.1", zoneHints("zone-a")), endpoint("10.0.0.2", zoneHints("zone-b"))}),
				// IPv6: hinted for zone-b only: the hints do not name
				// this zone, so they are ignored in this family.
				endpointSlice("web-v6", v6, eps{endpoint("fd00::1", zoneHints("zone-b")), endpoint("fd00::2", zoneHints("zone-b"))}),
			},
			wantCluster: []string{"10.0.0.1:8080", "[fd00::1]:8080", "[fd00::2]:8080"},
			wantHints:   "IPv6 zone hints ignored: none is for zone zone-a",
		},
		{
			name:    "dual stack: one family unhinted leaves the other's hints in force",
			service: dualStack,
			opts:    here,
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-v4", v4, eps{endpoint("10.0.0.1", zoneHints("zone-a")), endpoint("10.0.0.2", zoneHints("zone-b"))}),
				endpointSlice("web-v6", v6, eps{endpoint("fd00::1"), endpoint("fd00::2")}),
			},
			wantCluster: []string{"10.0.0.1:8080", "[fd00::1]:8080", "[fd00::2]:8080"},
		},
		{
			name: "a slice of a family the Service does not have is ignored, as kube-proxy does",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-v6", v6, eps{endpoint("fd00::1")}),
				endpointSlice("web-v4", v4, eps{endpoint("10.0.0.1")}),
			},
			wantCluster:  []string{"10.0.0.1:8080"},
			wantProblems: []string{"EndpointSlice demo/web-v6: addressType: IPv6 is not an IP family of Service demo/web; ignored, as kube-proxy does"},
		},
		{
			name: "FQDN slices are ignored",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-1", discoveryv1.AddressTypeFQDN, eps{endpoint("backend.example.com")}),
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.1")}),
			},
			wantCluster: []string{"10.0.0.1:8080"},
		},
		{
			name: "only addresses[0] is used",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{
				{Addresses: []string{"10.0.0.1", "10.0.0.2"}},
			})},
			wantCluster: []string{"10.0.0.1:8080"},
		},
		{
			name: "ports matched by name and protocol, mismatches reported; nil name, nil or zero port skipped and reported",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-1", v4, eps{endpoint("10.0.0.1")}, func(s *discoveryv1.EndpointSlice) {
					s.Ports = []discoveryv1.EndpointPort{
						slicePort("", 1),     // unnamed: no such service port
						slicePort("HTTP", 2), // names are case sensitive
						{Name: ptr("http"), Port: ptr[int32](3), Protocol: ptr(corev1.ProtocolUDP)},
						{Name: nil, Port: ptr[int32](4)},
						{Name: ptr("http"), Port: nil},
						{Name: ptr("http"), Port: ptr[int32](0)},
					}
				}),
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.2")}, func(s *discoveryv1.EndpointSlice) {
					s.Ports = []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](9090)}} // nil protocol is TCP
				}),
			},
			wantCluster: []string{"10.0.0.2:9090"},
			wantProblems: []string{
				`EndpointSlice demo/web-1: ports[0]: port name "" with protocol TCP matches no port of Service demo/web`,
				`EndpointSlice demo/web-1: ports[1]: port name "HTTP" with protocol TCP matches no port of Service demo/web`,
				`EndpointSlice demo/web-1: ports[2].protocol: port "http" is UDP here but TCP in Service demo/web`,
				"EndpointSlice demo/web-1: ports[3].name: not set: the port is skipped, as kube-proxy skips it",
				"EndpointSlice demo/web-1: ports[4].port: not set: the port is skipped, as kube-proxy skips it",
				`EndpointSlice demo/web-1: ports[5].port: 0 (all ports): the port is skipped, as kube-proxy skips it`,
			},
		},
		{
			name: "unnamed service port matches the empty name",
			service: service("web", func(s *corev1.Service) {
				s.Spec.Ports[0].Name = ""
			}),
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("10.0.0.1")}, func(s *discoveryv1.EndpointSlice) {
				s.Ports = []discoveryv1.EndpointPort{slicePort("", 8080)}
			})},
			wantCluster: []string{"10.0.0.1:8080"},
		},
		{
			name: "slices of other services and namespaces, or without the label, are not used",
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("other-1", v4, eps{endpoint("10.0.0.1")}, func(s *discoveryv1.EndpointSlice) {
					s.Labels[discoveryv1.LabelServiceName] = "other"
				}),
				endpointSlice("web-1", v4, eps{endpoint("10.0.0.2")}, func(s *discoveryv1.EndpointSlice) { s.Namespace = "prod" }),
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.3")}, func(s *discoveryv1.EndpointSlice) { s.Labels = nil }),
				nil,
			},
			wantProblems: []string{"EndpointSlice demo/web-2: metadata.labels: no kubernetes.io/service-name label"},
		},
		{
			name:    "refused addresses, loopback not allowed",
			service: dualStack,
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-1", v4, eps{
					endpoint("169.254.169.254"), endpoint("169.254.1.1"), endpoint("224.0.0.251"),
					endpoint("0.0.0.0"), endpoint("0.1.2.3"), endpoint("255.255.255.255"),
					endpoint("127.0.0.1"), endpoint("127.1.2.3"), endpoint("10.0.0.1"),
					endpoint("::ffff:127.0.0.1"), endpoint("::ffff:169.254.169.254"),
				}),
				endpointSlice("web-2", v6, eps{
					endpoint("fe80::1"), endpoint("::1"), endpoint("::"), endpoint("ff02::1"), endpoint("fd00::1"),
				}),
			},
			wantCluster: []string{"10.0.0.1:8080", "[fd00::1]:8080"},
			wantProblems: []string{
				"EndpointSlice demo/web-1: endpoints[0].addresses[0]: address refused: 169.254.169.254 is link-local",
				"endpoints[1].addresses[0]: address refused: 169.254.1.1 is link-local",
				"endpoints[2].addresses[0]: address refused: 224.0.0.251 is a multicast address",
				"endpoints[3].addresses[0]: address refused: 0.0.0.0 is the unspecified address",
				"endpoints[4].addresses[0]: address refused: 0.1.2.3 is in 0.0.0.0/8",
				"endpoints[5].addresses[0]: address refused: 255.255.255.255 is the broadcast address",
				"endpoints[6].addresses[0]: address refused: 127.0.0.1 is a loopback address",
				"endpoints[7].addresses[0]: address refused: 127.1.2.3 is a loopback address",
				// IPv4-mapped, as IPv4 slices stored before 1.36 may hold.
				"endpoints[9].addresses[0]: address refused: 127.0.0.1 is a loopback address",
				"endpoints[10].addresses[0]: address refused: 169.254.169.254 is link-local",
				"EndpointSlice demo/web-2: endpoints[0].addresses[0]: address refused: fe80::1 is link-local",
				"endpoints[1].addresses[0]: address refused: ::1 is a loopback address",
				"endpoints[2].addresses[0]: address refused: :: is the unspecified address",
				"endpoints[3].addresses[0]: address refused: ff02::1 is a multicast address",
			},
		},
		{
			// With a portal the proxy's own dial would be captured again,
			// and each connection would open another until descriptors
			// ran out. The cluster IP on another port is a fine endpoint.
			name: "an endpoint that is the Service's own frontend is ignored",
			service: service("web", func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1"}
			}),
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("10.96.0.10"), endpoint("192.0.2.1"), endpoint("10.0.0.1")},
				func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{slicePort("http", 80)} }),
				endpointSlice("web-2", v4, eps{endpoint("10.96.0.10")})},
			wantCluster: []string{"10.0.0.1:80", "10.96.0.10:8080"},
			wantProblems: []string{
				"EndpointSlice demo/web-1: endpoints[0].addresses[0]: 10.96.0.10:80 is Service demo/web:http/TCP's own frontend; the proxy would capture its own connection to it; ignored",
				"endpoints[1].addresses[0]: 192.0.2.1:80 is Service demo/web:http/TCP's own frontend",
			},
		},
		{
			// Two Services pointing at each other's cluster IP would pass a
			// connection between them for ever, and one that is a node
			// port on this host's address back to the proxy: kube-proxy
			// translates a connection once. The same port on an address
			// that is not this host's is a fine endpoint, as is the other
			// Service's cluster IP on another protocol.
			name: "an endpoint that another Service's frontend or a node port on this host would capture is ignored",
			others: []*corev1.Service{service("db", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.20", []string{"10.96.0.20"}
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.Ports = []corev1.ServicePort{{Name: "sql", Port: 5432, NodePort: 31888, Protocol: corev1.ProtocolTCP},
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}
			})},
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("10.96.0.20"), endpoint("10.0.0.9"), endpoint("10.0.0.1")},
				func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{slicePort("http", 5432)} }),
				endpointSlice("web-2", v4, eps{endpoint("10.0.0.9"), endpoint("10.0.0.2")},
					func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{slicePort("http", 31888)} }),
				endpointSlice("web-3", v4, eps{endpoint("10.96.0.20")},
					func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{slicePort("http", 53)} })},
			opts:        Options{HostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("10.0.0.9")}, nil }},
			wantCluster: []string{"10.0.0.1:5432", "10.0.0.2:31888", "10.0.0.9:5432", "10.96.0.20:53"},
			wantProblems: []string{
				"EndpointSlice demo/web-1: endpoints[0].addresses[0]: 10.96.0.20:5432 is Service demo/db:sql/TCP's frontend; the proxy would capture its own connection to it; ignored",
				"EndpointSlice demo/web-2: endpoints[0].addresses[0]: 10.0.0.9:31888 is an address of this host with Service demo/db:sql/TCP's node port; the proxy would capture its own connection to it; ignored",
			},
		},
		{
			// Any 127/8 address is this host's; a node port is captured only
			// in the families of its Service.
			name:    "a node port is captured on every loopback address, and only in its Service's families",
			service: dualStack,
			others: []*corev1.Service{service("db", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.20", []string{"10.96.0.20"}
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.Ports = []corev1.ServicePort{{Name: "sql", Port: 5432, NodePort: 31888, Protocol: corev1.ProtocolTCP}}
			})},
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-4", v4, eps{endpoint("127.0.0.5")}, func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{slicePort("http", 31888)} }),
				endpointSlice("web-6", v6, eps{endpoint("fd00::9")}, func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{slicePort("http", 31888)} }),
			},
			opts: Options{AllowLoopback: true, HostAddrs: func() ([]netip.Addr, error) {
				return []netip.Addr{netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("fd00::9")}, nil
			}},
			wantCluster:  []string{"[fd00::9]:31888"},
			wantProblems: []string{"EndpointSlice demo/web-4: endpoints[0].addresses[0]: 127.0.0.5:31888 is an address of this host with Service demo/db:sql/TCP's node port"},
		},
		{
			name: "a node port is not captured on an address --nodeport-addresses leaves out",
			others: []*corev1.Service{service("db", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.20", []string{"10.96.0.20"}
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.Ports = []corev1.ServicePort{{Name: "sql", Port: 5432, NodePort: 31888, Protocol: corev1.ProtocolTCP}}
			})},
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("10.0.0.9"), endpoint("10.1.0.9")},
				func(s *discoveryv1.EndpointSlice) { s.Ports = []discoveryv1.EndpointPort{slicePort("http", 31888)} })},
			opts: Options{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, HostAddrs: func() ([]netip.Addr, error) {
				return []netip.Addr{netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("10.1.0.9")}, nil
			}},
			wantCluster:  []string{"10.0.0.9:31888"},
			wantProblems: []string{"EndpointSlice demo/web-1: endpoints[1].addresses[0]: 10.1.0.9:31888 is an address of this host with Service demo/db:sql/TCP's node port"},
		},
		{
			name:    "loopback allowed in manifest mode, IPv4-mapped in an IPv4 slice normalised",
			service: dualStack,
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-1", v4, eps{endpoint("127.0.0.1"), endpoint("169.254.169.254"), endpoint("::ffff:127.0.0.2"), endpoint("::ffff:10.0.0.5")}),
				endpointSlice("web-2", v6, eps{endpoint("::1")}),
			},
			opts:         Options{AllowLoopback: true},
			wantCluster:  []string{"10.0.0.5:8080", "127.0.0.1:8080", "127.0.0.2:8080", "[::1]:8080"},
			wantProblems: []string{"endpoints[1].addresses[0]: address refused: 169.254.169.254 is link-local"},
		},
		{
			name:    "malformed addresses, wrong family, no address",
			service: dualStack,
			slices: []*discoveryv1.EndpointSlice{
				endpointSlice("web-1", v4, eps{
					endpoint("10.0.0.256"), endpoint("fd00::1"), endpoint("fe80::1%eth0"), {}, endpoint("10.0.0.1"),
				}),
				endpointSlice("web-2", v6, eps{endpoint("10.0.0.2"), endpoint("::ffff:10.0.0.4")}),
				endpointSlice("web-3", "IPX", eps{endpoint("10.0.0.3")}),
			},
			wantCluster: []string{"10.0.0.1:8080"},
			wantProblems: []string{
				`EndpointSlice demo/web-1: endpoints[0].addresses[0]: "10.0.0.256" is not a valid IP address`,
				"EndpointSlice demo/web-1: endpoints[1].addresses[0]: fd00::1 is not an IPv4 address",
				`EndpointSlice demo/web-1: endpoints[2].addresses[0]: "fe80::1%eth0" has a zone`,
				"EndpointSlice demo/web-1: endpoints[3].addresses: no address; endpoint ignored",
				"EndpointSlice demo/web-2: endpoints[0].addresses[0]: 10.0.0.2 is not an IPv6 address",
				// Not IPv6 to the API server (IsIPv6String), which refuses it;
				// it became an IPv4 endpoint of an IPv6 slice.
				"EndpointSlice demo/web-2: endpoints[1].addresses[0]: ::ffff:10.0.0.4 is an IPv4-mapped address, not an IPv6 address; endpoint ignored",
				`EndpointSlice demo/web-3: addressType: unknown address type "IPX"; ignored`,
			},
		},
		{
			name: "bad slice ports reported",
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("10.0.0.1")}, func(s *discoveryv1.EndpointSlice) {
				s.Ports = []discoveryv1.EndpointPort{
					slicePort("http", 70000),
					{Name: ptr("http"), Port: ptr[int32](80), Protocol: ptr[corev1.Protocol]("tcp")},
					slicePort("http", 8080),
					slicePort("http", 8081),
				}
			})},
			wantCluster: []string{"10.0.0.1:8080"},
			wantProblems: []string{
				"EndpointSlice demo/web-1: ports[0].port: 70000 is out of range 1-65535",
				`EndpointSlice demo/web-1: ports[1].protocol: unsupported protocol "tcp"`,
				`EndpointSlice demo/web-1: ports[3]: duplicate port "http"/TCP; the first one is used`,
			},
		},
		{
			name: "endpoints of a skipped service are not looked at",
			service: service("web", func(s *corev1.Service) {
				s.Labels = map[string]string{LabelServiceProxyName: "other"}
			}),
			slices: []*discoveryv1.EndpointSlice{endpointSlice("web-1", v4, eps{endpoint("169.254.169.254")})},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := tc.service
			if svc == nil {
				svc = service("web")
			}
			snap, problems := BuildSnapshot(append([]*corev1.Service{svc}, tc.others...), tc.slices, tc.opts)
			checkProblems(t, problems, tc.wantProblems)
			name := state.ServicePortName{Namespace: "demo", Name: "web", Port: svc.Spec.Ports[0].Name, Protocol: state.TCP}
			sp := snap.Get(name)
			if sp == nil {
				if tc.wantCluster != nil || tc.wantLocal != nil {
					t.Fatalf("no port %s in %v", name, snap.Names())
				}
				return
			}
			if got := addrs(sp.ClusterEndpoints); !slices.Equal(got, tc.wantCluster) {
				t.Errorf("cluster endpoints: got %q, want %q", got, tc.wantCluster)
			}
			if got := addrs(sp.LocalEndpoints); !slices.Equal(got, tc.wantLocal) {
				t.Errorf("local endpoints: got %q, want %q", got, tc.wantLocal)
			}
			if sp.TopologyHintsIgnored != tc.wantHints {
				t.Errorf("topology hints ignored: got %q, want %q", sp.TopologyHintsIgnored, tc.wantHints)
			}
		})
	}
}

// TestBuildSnapshotServingEndpoints: the endpoints UDP sessions may stay
// on are every serving one, ready or terminating, on any node, whatever
// the hints; not those that stopped serving.
func TestBuildSnapshotServingEndpoints(t *testing.T) {
	type eps = []discoveryv1.Endpoint
	here := Options{NodeName: "node-a", NodeLabels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}
	svc := service("web")
	slice := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, eps{
		endpoint("10.0.0.1", zoneHints("zone-a"), onNode("node-a")),
		endpoint("10.0.0.2", zoneHints("zone-b"), onNode("node-b")),   // hinted away
		endpoint("10.0.0.3", terminatingServing, zoneHints("zone-a")), // draining
		endpoint("10.0.0.4", conditions(false, false, true)),          // terminating, no longer serving
		endpoint("10.0.0.5", conditions(false, false, false)),         // not ready
	})
	snap, _ := BuildSnapshot([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{slice}, here)
	sp := snap.Get(state.ServicePortName{Namespace: "demo", Name: "web", Port: svc.Spec.Ports[0].Name, Protocol: state.TCP})
	if sp == nil {
		t.Fatal("no port")
	}
	var got []string
	for _, a := range sp.ServingEndpoints {
		got = append(got, a.String())
	}
	if want := []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"}; !slices.Equal(got, want) {
		t.Errorf("serving endpoints %q, want %q", got, want)
	}
	if got := addrs(sp.ClusterEndpoints); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
		t.Errorf("cluster endpoints %q: want the ready one the hints leave", got)
	}
}

// TestBuildSnapshotEndpointFields checks every field of state.Endpoint, and
// that one slice feeds every service port it names.
func TestBuildSnapshotEndpointFields(t *testing.T) {
	svc := service("web", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}
		s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	})
	s := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{
		endpoint("10.0.0.1", onNode("node-a")),
		endpoint("10.0.0.2", onNode("node-b"), terminatingServing),
		endpoint("10.0.0.3"),
	}, func(s *discoveryv1.EndpointSlice) {
		s.Ports = []discoveryv1.EndpointPort{slicePort("http", 8080), {Name: ptr("dns"), Port: ptr[int32](5353), Protocol: ptr(corev1.ProtocolUDP)}}
	})
	snap, problems := BuildSnapshot([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{s}, Options{NodeName: "node-a"})
	checkProblems(t, problems, nil)

	http := snap.Get(state.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: state.TCP})
	dns := snap.Get(state.ServicePortName{Namespace: "demo", Name: "web", Port: "dns", Protocol: state.UDP})
	if http == nil || dns == nil {
		t.Fatalf("got ports %v, want http/TCP and dns/UDP", snap.Names())
	}
	wantCluster := []state.Endpoint{
		{Addr: netip.MustParseAddrPort("10.0.0.1:8080"), Ready: true, Serving: true, NodeName: "node-a", Local: true},
		{Addr: netip.MustParseAddrPort("10.0.0.3:8080"), Ready: true, Serving: true},
	}
	if !slices.Equal(http.ClusterEndpoints, wantCluster) {
		t.Errorf("http cluster endpoints:\n got %+v\nwant %+v", http.ClusterEndpoints, wantCluster)
	}
	if !slices.Equal(http.LocalEndpoints, wantCluster[:1]) || !slices.Equal(http.InternalEndpoints(), wantCluster[:1]) {
		t.Errorf("http local endpoints: got %+v, want %+v", http.LocalEndpoints, wantCluster[:1])
	}
	if got := addrs(dns.ClusterEndpoints); !slices.Equal(got, []string{"10.0.0.1:5353", "10.0.0.3:5353"}) {
		t.Errorf("dns cluster endpoints: got %q", got)
	}

	// The terminating endpoint, seen alone, keeps its conditions.
	s.Endpoints = s.Endpoints[1:2]
	snap, _ = BuildSnapshot([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{s}, Options{NodeName: "node-a"})
	want := []state.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.2:8080"), Serving: true, Terminating: true, NodeName: "node-b"}}
	if got := snap.Get(http.Name).ClusterEndpoints; !slices.Equal(got, want) {
		t.Errorf("terminating endpoint:\n got %+v\nwant %+v", got, want)
	}
}
