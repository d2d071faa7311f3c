package source

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func TestBuildSnapshotServices(t *testing.T) {
	http := state.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: state.TCP}
	none := state.Affinity{Type: state.AffinityNone}
	// base is the ServicePort of service("web") without changes.
	base := state.ServicePort{Name: http, Port: 80, ClusterIPs: ips("10.96.0.10"), Affinity: none}
	with := func(mod func(*state.ServicePort)) state.ServicePort {
		sp := base
		mod(&sp)
		return sp
	}

	tests := []struct {
		name         string
		services     []*corev1.Service
		opts         Options
		want         []state.ServicePort
		wantProblems []string
	}{
		{
			name:     "cluster IP service",
			services: []*corev1.Service{service("web")},
			want:     []state.ServicePort{base},
		},
		{
			name:     "nil services are ignored",
			services: []*corev1.Service{nil, service("web"), nil},
			want:     []state.ServicePort{base},
		},
		{
			name: "another proxy's service is skipped",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Labels = map[string]string{LabelServiceProxyName: "other"}
			})},
		},
		{
			name: "as an alternative proxy, only its own services are served",
			services: []*corev1.Service{
				service("web", func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "userspace"} }),
				service("other", func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other"} }),
				service("plain"),
			},
			opts: Options{ServiceProxyName: "userspace"},
			want: []state.ServicePort{base},
		},
		{
			name: "headless label is skipped",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Labels = map[string]string{corev1.IsHeadlessService: ""}
			})},
		},
		{
			name: "clusterIP None is skipped",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
			})},
			opts: Options{AllowNoClusterIP: true},
		},
		{
			name: "ExternalName is skipped",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
			})},
		},
		{
			name: "no cluster IP is skipped in cluster mode",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
			})},
		},
		{
			name: "no cluster IP is served in manifest mode",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
			})},
			opts: Options{AllowNoClusterIP: true},
			want: []state.ServicePort{with(func(sp *state.ServicePort) { sp.ClusterIPs = nil })},
		},
		{
			name: "ipFamilies are kept, without unknown or repeated ones",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, "IPv5", corev1.IPv6Protocol}
			})},
			opts:         Options{AllowNoClusterIP: true},
			want:         []state.ServicePort{with(func(sp *state.ServicePort) { sp.ClusterIPs, sp.IPFamilies = nil, []state.IPFamily{state.IPv6} })},
			wantProblems: []string{`Service demo/web: spec.ipFamilies[1]: unknown IP family "IPv5" (want IPv4 or IPv6), ignored`},
		},
		{
			name: "clusterIPs wins over clusterIP, both families",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.10", []string{"10.96.0.10", "fd00::10"}
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) { sp.ClusterIPs = ips("10.96.0.10", "fd00::10") })},
		},
		{
			name: "clusterIP alone is read, IPv4-mapped normalised",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "::ffff:10.96.0.10", nil
			})},
			want: []state.ServicePort{base},
		},
		{
			name: "malformed cluster IP: service not served",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ClusterIPs = []string{"10.96.0.300"}
			})},
			opts:         Options{AllowNoClusterIP: true},
			wantProblems: []string{`Service demo/web: spec.clusterIPs[0]: "10.96.0.300" is not a valid IP address; Service not served`},
		},
		{
			name: "link-local cluster IP refused",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "169.254.169.254", nil
			})},
			wantProblems: []string{
				"Service demo/web: spec.clusterIP: address refused: 169.254.169.254 is link-local",
				"spec.clusterIP: no usable cluster IP; Service not served",
			},
		},
		{
			name: "one port per name and protocol; empty protocol is TCP",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{
					{Name: "http", Port: 80},
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
					{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
					{Name: "sig", Port: 3868, Protocol: corev1.ProtocolSCTP},
				}
			})},
			want: []state.ServicePort{
				base,
				with(func(sp *state.ServicePort) {
					sp.Name = state.ServicePortName{Namespace: "demo", Name: "web", Port: "dns", Protocol: state.UDP}
					sp.Port = 53
				}),
				with(func(sp *state.ServicePort) {
					sp.Name = state.ServicePortName{Namespace: "demo", Name: "web", Port: "dns-tcp", Protocol: state.TCP}
					sp.Port = 53
				}),
				with(func(sp *state.ServicePort) {
					sp.Name = state.ServicePortName{Namespace: "demo", Name: "web", Port: "sig", Protocol: state.SCTP}
					sp.Port = 3868
				}),
			},
		},
		{
			name: "bad ports are skipped and reported",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{
					{Name: "http", Port: 80},
					{Name: "big", Port: 70000},
					{Name: "quic", Port: 443, Protocol: "QUIC"},
					{Name: "np", Port: 81, NodePort: -1},
					{Name: "http", Port: 8080},
				}
			})},
			want: []state.ServicePort{base},
			wantProblems: []string{
				"Service demo/web: spec.ports[1].port: 70000 is out of range 1-65535",
				`Service demo/web: spec.ports[2].protocol: unsupported protocol "QUIC"`,
				"Service demo/web: spec.ports[3].nodePort: -1 is out of range",
				"Service demo/web: spec.ports[4]: duplicate port demo/web:http/TCP",
			},
		},
		{
			name: "node port, external IPs and load-balancer IPs by ipMode",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalIPs = []string{"192.0.2.1", "192.0.2.1"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					{IP: "198.51.100.1"},
					{IP: "198.51.100.2", IPMode: ptr(corev1.LoadBalancerIPModeVIP)},
					{IP: "198.51.100.3", IPMode: ptr(corev1.LoadBalancerIPModeProxy)},
					{Hostname: "lb.example.com"},
				}
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.NodePort = 30080
				sp.ExternalIPs = ips("192.0.2.1")
				sp.LoadBalancerIPs = ips("198.51.100.1", "198.51.100.2")
			})},
		},
		{
			// kube-proxy's IPv6 proxier skips a Service without an IPv6
			// cluster IP, so its IPv6 addresses go unserved.
			name: "external and load-balancer IPs of a family the Service lacks are ignored",
			services: []*corev1.Service{
				service("web", func(s *corev1.Service) {
					s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"}
					s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "2001:db8::2"}, {IP: "198.51.100.1"}}
				}),
				service("six", func(s *corev1.Service) {
					s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
					s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
					s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"}
				}),
			},
			opts: Options{AllowNoClusterIP: true},
			want: []state.ServicePort{
				with(func(sp *state.ServicePort) {
					sp.ExternalIPs, sp.LoadBalancerIPs = ips("192.0.2.1"), ips("198.51.100.1")
				}),
				{Name: state.ServicePortName{Namespace: "demo", Name: "six", Port: "http", Protocol: state.TCP}, Port: 80,
					IPFamilies: []state.IPFamily{state.IPv6}, ExternalIPs: ips("2001:db8::1"), Affinity: state.Affinity{Type: state.AffinityNone}},
			},
			wantProblems: []string{
				"Service demo/six: spec.externalIPs[0]: 192.0.2.1 is IPv4, not an IP family of the Service ([IPv6]); ignored, as kube-proxy does",
				"Service demo/web: spec.externalIPs[1]: 2001:db8::1 is IPv6, not an IP family of the Service ([IPv4]); ignored, as kube-proxy does",
				"Service demo/web: status.loadBalancer.ingress[0].ip: 2001:db8::2 is IPv6, not an IP family of the Service ([IPv4]); ignored, as kube-proxy does",
			},
		},
		{
			name: "loadBalancerSourceRanges as the API server takes them: padded, host bits, leading zeros",
			services: []*corev1.Service{
				service("web", func(s *corev1.Service) {
					s.Spec.Type = corev1.ServiceTypeLoadBalancer
					s.Spec.LoadBalancerSourceRanges = []string{" 203.0.113.0/24 ", "198.18.10.7/16", "010.001.0.0/16", "fd5e:b1b5::1/48", "nope"}
					s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
				}),
			},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.LoadBalancerIPs = ips("198.51.100.1")
				sp.LoadBalancerSourceRanges = []netip.Prefix{
					netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("198.18.0.0/16"),
					netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd5e:b1b5::/48"),
				}
			})},
			wantProblems: []string{`Service demo/web: spec.loadBalancerSourceRanges[4]: "nope" is not a CIDR; left out`},
		},
		{
			name: "metadata, multicast and malformed external IPs refused",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"169.254.169.254", "224.0.0.1", "0.0.0.0", "nope", "192.0.2.1"}
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) { sp.ExternalIPs = ips("192.0.2.1") })},
			wantProblems: []string{
				"spec.externalIPs[0]: address refused: 169.254.169.254 is link-local",
				"spec.externalIPs[1]: address refused: 224.0.0.1 is a multicast address",
				"spec.externalIPs[2]: address refused: 0.0.0.0 is the unspecified address",
				`spec.externalIPs[3]: "nope" is not a valid IP address`,
			},
		},
		{
			name: "loopback external IP only with AllowLoopback",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"127.0.0.2"}
			})},
			opts: Options{AllowLoopback: true},
			want: []state.ServicePort{with(func(sp *state.ServicePort) { sp.ExternalIPs = ips("127.0.0.2") })},
		},
		{
			name: "ClientIP affinity defaults to 10800s",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.Affinity = state.Affinity{Type: state.AffinityClientIP, Timeout: 10800 * time.Second}
			})},
		},
		{
			name: "ClientIP affinity timeout",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.Affinity = state.Affinity{Type: state.AffinityClientIP, Timeout: time.Minute}
			})},
		},
		{
			name: "ClientIP affinity timeout out of range uses the default",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](86401)}}
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.Affinity = state.Affinity{Type: state.AffinityClientIP, Timeout: state.DefaultAffinityTimeout}
			})},
			wantProblems: []string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds: 86401 is out of range 1-86400"},
		},
		{
			// The API server accepts 1 to 86400 (timeoutSeconds "must be
			// >0 && <=86400").
			name: "ClientIP affinity timeout of 1 accepted",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](1)}}
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.Affinity = state.Affinity{Type: state.AffinityClientIP, Timeout: time.Second}
			})},
		},
		{
			// The API server accepts 1 to 86400 (timeoutSeconds "must be
			// >0 && <=86400").
			name: "ClientIP affinity timeout of 86400 accepted",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](86400)}}
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.Affinity = state.Affinity{Type: state.AffinityClientIP, Timeout: 24 * time.Hour}
			})},
		},
		{
			name: "ClientIP affinity timeout of 0 uses the default",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](0)}}
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.Affinity = state.Affinity{Type: state.AffinityClientIP, Timeout: state.DefaultAffinityTimeout}
			})},
			wantProblems: []string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds: 0 is out of range 1-86400"},
		},
		{
			name: "affinity config without ClientIP affinity is ignored",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityNone
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
			})},
			want: []state.ServicePort{base},
		},
		{
			name: "unknown affinity is None",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.SessionAffinity = "Cookie"
			})},
			want:         []state.ServicePort{base},
			wantProblems: []string{`spec.sessionAffinity: unknown affinity "Cookie", using None`},
		},
		{
			name: "internal traffic policy Local",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) { sp.InternalLocal = true })},
		},
		{
			name: "external traffic policy Local with a node port and health check",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.Ports[0].NodePort = 30080
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.NodePort, sp.ExternalLocal, sp.HealthCheckNodePort = 30080, true, 32000
			})},
		},
		{
			name: "external traffic policy Local with external IPs only",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.ExternalIPs = []string{"192.0.2.1"}
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) {
				sp.ExternalIPs, sp.ExternalLocal = ips("192.0.2.1"), true
			})},
		},
		{
			// kube-proxy's NeedsHealthCheck: no node port and no
			// ingress yet, or one the proxy does not capture.
			name: "a LoadBalancer without node ports or ingress keeps its health check",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.AllocateLoadBalancerNodePorts = ptr(false)
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) { sp.ExternalLocal, sp.HealthCheckNodePort = true, 32000 })},
		},
		{
			name: "a NodePort Service serves no health check",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.Ports[0].NodePort = 30080
			})},
			want: []state.ServicePort{with(func(sp *state.ServicePort) { sp.NodePort, sp.ExternalLocal = 30080, true })},
		},
		{
			name: "external traffic policy Local on an unreachable port means nothing",
			services: []*corev1.Service{service("web", func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			})},
			want: []state.ServicePort{base},
		},
		{
			name:         "duplicate services: the first is served",
			services:     []*corev1.Service{service("web"), service("web", func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 })},
			want:         []state.ServicePort{base},
			wantProblems: []string{"Service demo/web: duplicate Service; the first one is served"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap, problems := BuildSnapshot(tc.services, nil, tc.opts)
			checkProblems(t, problems, tc.wantProblems)
			want := state.NewSnapshot(tc.want)
			if snap.Len() != want.Len() {
				t.Fatalf("got ports %v, want %v", snap.Names(), want.Names())
			}
			for _, n := range want.Names() {
				got, w := snap.Get(n), want.Get(n)
				if got == nil {
					t.Fatalf("missing port %s; got %v", n, snap.Names())
				}
				if !got.Equal(w) {
					t.Errorf("port %s:\n got %s\nwant %s", n, describe(got), describe(w))
				}
			}
		})
	}
}

func TestBuildSnapshotProblemsAreObjectErrors(t *testing.T) {
	svc := service("web", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"169.254.169.254"} })
	_, problems := BuildSnapshot([]*corev1.Service{svc}, nil, Options{})
	if len(problems) != 1 {
		t.Fatalf("got %v, want one problem", problems)
	}
	var oe *ObjectError
	if !errors.As(problems[0], &oe) || oe.Kind != "Service" || oe.Namespace != "demo" || oe.Name != "web" || oe.Field != "spec.externalIPs[0]" {
		t.Errorf("got %#v, want an ObjectError naming Service demo/web spec.externalIPs[0]", problems[0])
	}
	if !errors.Is(problems[0], ErrRefusedAddress) {
		t.Errorf("%v does not wrap ErrRefusedAddress", problems[0])
	}
}

func TestBuildSnapshotDoesNotModifyInputs(t *testing.T) {
	svc := service("web")
	s := endpointSlice("web-1", "IPv6", []discoveryv1.Endpoint{endpoint("::ffff:10.0.0.1")}, func(s *discoveryv1.EndpointSlice) {
		s.Ports[0].Protocol = nil
	})
	before, beforeSlice := svc.DeepCopy(), s.DeepCopy()
	snap, _ := BuildSnapshot([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{s}, Options{})
	if snap.Len() != 1 {
		t.Fatalf("got %v, want one port", snap.Names())
	}
	if !apiequality.Semantic.DeepEqual(svc, before) {
		t.Errorf("service changed: %+v", svc)
	}
	if !apiequality.Semantic.DeepEqual(s, beforeSlice) {
		t.Errorf("slice changed: %+v", s)
	}
}
