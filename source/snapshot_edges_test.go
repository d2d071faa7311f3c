package source

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestSkippedServiceEdges: the forms of a Service kube-proxy leaves alone
// are skipped silently, whichever of its fields says so. Its label
// selector is "service.kubernetes.io/service-proxy-name does not exist",
// so the label with an empty value gives the Service to another proxy
// too; and clusterIP: None is headless whether spec.clusterIP or
// spec.clusterIPs[0] says it (an object written before dual-stack has
// only the first, a manifest may have only the second).
func TestSkippedServiceEdges(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*corev1.Service)
	}{
		{
			name: "service-proxy-name label with an empty value",
			mod:  func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: ""} },
		},
		{
			name: "clusterIP None alone",
			mod:  func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, nil },
		},
		{
			name: "clusterIPs None alone",
			mod:  func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", []string{corev1.ClusterIPNone} },
		},
	}
	for _, tc := range tests {
		for _, opts := range []Options{{}, {AllowNoClusterIP: true, AllowLoopback: true}} {
			t.Run(fmt.Sprintf("%s/AllowNoClusterIP=%v", tc.name, opts.AllowNoClusterIP), func(t *testing.T) {
				snap, problems := BuildSnapshot([]*corev1.Service{service("web", tc.mod)}, nil, opts)
				checkProblems(t, problems, nil)
				if snap.Len() != 0 {
					t.Errorf("got ports %v, want the Service skipped", snap.Names())
				}
			})
		}
	}
}

// TestServicePortNumberBounds: spec.ports[].port is served when it is
// 1-65535 and spec.ports[].nodePort when it is 0-65535 (0: none); any
// other number leaves the port out, reported, rather than wrap into the
// uint16 range (65536 would become 0: no port, or no node port).
func TestServicePortNumberBounds(t *testing.T) {
	tests := []struct {
		name         string
		port         int32
		nodePort     int32
		wantNodePort uint16 // if the port is served
		wantProblem  string // if not
	}{
		{name: "port 1", port: 1},
		{name: "port 65535", port: 65535},
		{name: "port 0", port: 0, wantProblem: "Service demo/web: spec.ports[0].port: 0 is out of range 1-65535"},
		{name: "port 65536", port: 65536, wantProblem: "Service demo/web: spec.ports[0].port: 65536 is out of range 1-65535"},
		{name: "node port 1", port: 80, nodePort: 1, wantNodePort: 1},
		{name: "node port 65535", port: 80, nodePort: 65535, wantNodePort: 65535},
		{name: "node port 65536", port: 80, nodePort: 65536, wantProblem: "Service demo/web: spec.ports[0].nodePort: 65536 is out of range 1-65535"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := service("web", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.Ports[0].Port, s.Spec.Ports[0].NodePort = tc.port, tc.nodePort
			})
			snap, problems := BuildSnapshot([]*corev1.Service{svc}, nil, Options{})
			if tc.wantProblem != "" {
				checkProblems(t, problems, []string{tc.wantProblem})
				if snap.Len() != 0 {
					t.Errorf("got ports %v, want none", snap.Names())
				}
				return
			}
			checkProblems(t, problems, nil)
			sp := snap.Get(webHTTP)
			if sp == nil {
				t.Fatalf("no port %s in %v", webHTTP, snap.Names())
			}
			if sp.Port != uint16(tc.port) || sp.NodePort != tc.wantNodePort {
				t.Errorf("got port %d, node port %d; want %d, %d", sp.Port, sp.NodePort, tc.port, tc.wantNodePort)
			}
		})
	}
}

// TestHealthCheckNodePortBounds: a LoadBalancer with
// externalTrafficPolicy: Local serves spec.healthCheckNodePort when it is
// a port number, 65535 included; a number outside 0-65535 is reported and
// no health check is served, rather than one on the number wrapped into
// the uint16 range (-1 would become 65535, 65536 would become 0 unreported).
func TestHealthCheckNodePortBounds(t *testing.T) {
	tests := []struct {
		name        string
		hc          int32
		want        uint16
		wantProblem string
	}{
		{name: "1", hc: 1, want: 1},
		{name: "65535", hc: 65535, want: 65535},
		{name: "-1", hc: -1, wantProblem: "Service demo/web: spec.healthCheckNodePort: -1 is out of range 1-65535"},
		{name: "65536", hc: 65536, wantProblem: "Service demo/web: spec.healthCheckNodePort: 65536 is out of range 1-65535"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := service("web", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = tc.hc
				s.Spec.Ports[0].NodePort = 30080
			})
			var want []string
			if tc.wantProblem != "" {
				want = []string{tc.wantProblem}
			}
			sp, problems := buildWeb(t, svc, nil, Options{})
			checkProblems(t, problems, want)
			if sp.HealthCheckNodePort != tc.want || !sp.ExternalLocal {
				t.Errorf("got health check node port %d, ExternalLocal %v; want %d, true", sp.HealthCheckNodePort, sp.ExternalLocal, tc.want)
			}
		})
	}
}

// TestExternalPolicyLocalAsKubeProxy: externalTrafficPolicy: Local holds
// for a Service that kube-proxy's ExternallyAccessible calls so: a
// LoadBalancer, a NodePort, or a ClusterIP (spelt out, as every Service
// from an API server has it, or left empty in a manifest) with
// spec.externalIPs, counted as written, even when none of them is served
// here (kube-proxy's ExternalPolicyLocal reads the spec, not the
// addresses of one family).
func TestExternalPolicyLocalAsKubeProxy(t *testing.T) {
	tests := []struct {
		name            string
		typ             corev1.ServiceType
		externalIPs     []string
		wantExternalIPs []string
		wantProblems    []string
	}{
		{name: "type ClusterIP with an external IP", typ: corev1.ServiceTypeClusterIP,
			externalIPs: []string{"192.0.2.1"}, wantExternalIPs: []string{"192.0.2.1"}},
		{name: "type left empty with an external IP", typ: "",
			externalIPs: []string{"192.0.2.1"}, wantExternalIPs: []string{"192.0.2.1"}},
		{name: "type ClusterIP with an external IP of another family", typ: corev1.ServiceTypeClusterIP,
			externalIPs:  []string{"2001:db8::1"},
			wantProblems: []string{"spec.externalIPs[0]: 2001:db8::1 is IPv6, not an IP family of the Service ([IPv4]); ignored, as kube-proxy does"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := service("web", func(s *corev1.Service) {
				s.Spec.Type = tc.typ
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.ExternalIPs = tc.externalIPs
			})
			sp, problems := buildWeb(t, svc, nil, Options{})
			checkProblems(t, problems, tc.wantProblems)
			if got := ipStrings(sp.ExternalIPs); !slices.Equal(got, tc.wantExternalIPs) {
				t.Errorf("external IPs: got %q, want %q", got, tc.wantExternalIPs)
			}
			if !sp.ExternalLocal || sp.HealthCheckNodePort != 0 {
				t.Errorf("got ExternalLocal %v, health check node port %d; want true, 0", sp.ExternalLocal, sp.HealthCheckNodePort)
			}
		})
	}
}

// TestFrontendEdges: which cluster, external and load-balancer IPs a
// Service's ports are served on.
func TestFrontendEdges(t *testing.T) {
	tests := []struct {
		name         string
		mod          func(*corev1.Service)
		opts         Options
		wantCluster  []string
		wantExternal []string
		wantLB       []string
		wantProblems []string
	}{
		{
			// The Service's families are those of its cluster IPs, else of
			// its ipFamilies; a manifest may give neither, and then every
			// address counts.
			name: "no cluster IP and no ipFamilies: external and load-balancer IPs of both families",
			mod: func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
				s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "2001:db8::2"}, {IP: "198.51.100.1"}}
			},
			opts:         Options{AllowNoClusterIP: true},
			wantExternal: []string{"192.0.2.1", "2001:db8::1"},
			wantLB:       []string{"2001:db8::2", "198.51.100.1"},
		},
		{
			// An IPv4-mapped address is IPv4 (an API server before 1.36
			// stored it): served as the IPv4 address, once.
			name: "IPv4-mapped external and load-balancer IPs are their IPv4 addresses",
			mod: func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"::ffff:192.0.2.1", "192.0.2.1"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "::ffff:198.51.100.1"}}
			},
			wantCluster:  []string{"10.96.0.10"},
			wantExternal: []string{"192.0.2.1"},
			wantLB:       []string{"198.51.100.1"},
		},
		{
			// kube-proxy's IsVIPMode: an ingress IP is captured when its
			// ipMode is unset or VIP, and only then; a mode this proxy does
			// not know (a newer API server's) is not VIP.
			name: "an ingress IP with an unknown ipMode is not captured",
			mod: func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					{IP: "198.51.100.1", IPMode: ptr(corev1.LoadBalancerIPMode("Tunnel"))},
					{IP: "198.51.100.2"},
				}
			},
			wantCluster: []string{"10.96.0.10"},
			wantLB:      []string{"198.51.100.2"},
		},
		{
			// An IPv4-mapped cluster IP is the IPv4 one; the same address
			// twice is one frontend, not two listeners on one address.
			name: "a cluster IP given twice is served once",
			mod: func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.10", []string{"10.96.0.10", "::ffff:10.96.0.10"}
			},
			wantCluster: []string{"10.96.0.10"},
		},
		{
			// With AllowNoClusterIP a Service whose cluster IPs are all
			// refused is served all the same (on its other frontends), so
			// the only problem is the refusal: no "not served".
			name: "refused cluster IP in manifest mode: served, the refusal reported alone",
			mod: func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "169.254.169.254", nil
				s.Spec.ExternalIPs = []string{"192.0.2.1"}
			},
			opts:         Options{AllowNoClusterIP: true},
			wantExternal: []string{"192.0.2.1"},
			wantProblems: []string{"Service demo/web: spec.clusterIP: address refused: 169.254.169.254 is link-local"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sp, problems := buildWeb(t, service("web", tc.mod), nil, tc.opts)
			checkProblems(t, problems, tc.wantProblems)
			for _, f := range []struct {
				what string
				got  []string
				want []string
			}{
				{"cluster IPs", ipStrings(sp.ClusterIPs), tc.wantCluster},
				{"external IPs", ipStrings(sp.ExternalIPs), tc.wantExternal},
				{"load-balancer IPs", ipStrings(sp.LoadBalancerIPs), tc.wantLB},
			} {
				if !slices.Equal(f.got, f.want) {
					t.Errorf("%s: got %q, want %q", f.what, f.got, f.want)
				}
			}
		})
	}
}

// TestUnknownInternalTrafficPolicy: an internalTrafficPolicy this proxy
// does not know (a newer API server's) is reported and taken as Cluster,
// so cluster-IP traffic keeps going to every endpoint.
func TestUnknownInternalTrafficPolicy(t *testing.T) {
	svc := service("web", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicy("Nearest"))
	})
	sl := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.0.1", onNode("node-b"))})
	sp, problems := buildWeb(t, svc, []*discoveryv1.EndpointSlice{sl}, Options{NodeName: "node-a"})
	checkProblems(t, problems, []string{`Service demo/web: spec.internalTrafficPolicy: unknown policy "Nearest", using Cluster`})
	if sp.InternalLocal {
		t.Error("InternalLocal is true, want false (Cluster)")
	}
	if got, want := addrs(sp.InternalEndpoints()), []string{"10.0.0.1:8080"}; !slices.Equal(got, want) {
		t.Errorf("internal endpoints: got %q, want %q", got, want)
	}
}

// TestSlicePortOfUnservedServicePort: a slice port that feeds a port of
// the Service that is not served (reported with the Service) is not
// reported again as matching nothing. A Service port without a protocol
// is TCP, as the API server defaults it: objects from files have no
// defaults applied.
func TestSlicePortOfUnservedServicePort(t *testing.T) {
	svc := service("web", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "big", Port: 70000}}
	})
	sl := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.0.1")},
		func(s *discoveryv1.EndpointSlice) {
			s.Ports = []discoveryv1.EndpointPort{slicePort("http", 8080), slicePort("big", 8081)}
		})
	sp, problems := buildWeb(t, svc, []*discoveryv1.EndpointSlice{sl}, Options{})
	checkProblems(t, problems, []string{"Service demo/web: spec.ports[1].port: 70000 is out of range 1-65535"})
	if got, want := addrs(sp.ClusterEndpoints), []string{"10.0.0.1:8080"}; !slices.Equal(got, want) {
		t.Errorf("cluster endpoints: got %q, want %q", got, want)
	}
}

// TestManifestServiceCheckEdges: manifest checks of a Service at the
// edges of what the API server accepts.
func TestManifestServiceCheckEdges(t *testing.T) {
	const head = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\n"
	tests := []struct {
		name         string
		spec         string
		wantErrs     []string
		wantWarnings []string
	}{
		{
			// The API server requires a name on every port of a Service
			// with more than one, two included.
			name:     "two ports, one without a name",
			spec:     "spec: {ports: [{name: http, port: 80}, {port: 81}]}\n",
			wantErrs: []string{"spec.ports[1].name: is required when a Service has more than one port"},
		},
		{
			// The default --service-node-port-range, 30000-32767, holds
			// both its ends.
			name: "node ports at the ends of the default range",
			spec: "spec: {type: NodePort, ports: [{name: a, port: 80, nodePort: 30000}, {name: b, port: 81, nodePort: 32767}]}\n",
		},
		{
			name: "node ports just outside the default range",
			spec: "spec: {type: NodePort, ports: [{name: a, port: 80, nodePort: 29999}, {name: b, port: 81, nodePort: 32768}]}\n",
			wantWarnings: []string{
				"spec.ports[0].nodePort: 29999 is outside 30000-32767",
				"spec.ports[1].nodePort: 32768 is outside 30000-32767",
			},
		},
		{
			// The API server requires ports of every Service but a headless
			// or ExternalName one; a headless one is skipped here.
			name:         "headless without ports",
			spec:         "spec: {clusterIP: None}\n",
			wantWarnings: []string{"headless (clusterIP: None) is served by DNS, not by the proxy; skipped"},
		},
		{
			// The API server: when clusterIPs[0] is None, it must be the
			// only entry.
			name:     "None with another cluster IP",
			spec:     "spec: {clusterIP: None, clusterIPs: [None, \"fd00::1\"], ports: [{port: 80}]}\n",
			wantErrs: []string{"spec.clusterIPs[0]: None must be the only entry"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, warnings, err := ParseManifests("demo.yaml", []byte(head+tc.spec))
			checkProblems(t, flatten(err), tc.wantErrs)
			if err == nil {
				checkProblems(t, warnings, tc.wantWarnings)
			}
		})
	}
}

func ipStrings(ips []netip.Addr) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}
