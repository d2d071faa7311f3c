package state

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

// TestAffinityZeroValues: the zero Affinity is None, and a zero or
// negative timeout means Kubernetes' default.
func TestAffinityZeroValues(t *testing.T) {
	tests := []struct {
		name       string
		a          Affinity
		wantSticky bool
		wantTTL    time.Duration
	}{
		{name: "zero value", a: Affinity{}, wantTTL: DefaultAffinityTimeout},
		{name: "None", a: Affinity{Type: AffinityNone}, wantTTL: DefaultAffinityTimeout},
		{name: "ClientIP, zero timeout", a: Affinity{Type: AffinityClientIP}, wantSticky: true, wantTTL: DefaultAffinityTimeout},
		{name: "ClientIP, negative timeout", a: Affinity{Type: AffinityClientIP, Timeout: -time.Second}, wantSticky: true, wantTTL: DefaultAffinityTimeout},
		{name: "ClientIP, 1ns", a: Affinity{Type: AffinityClientIP, Timeout: time.Nanosecond}, wantSticky: true, wantTTL: time.Nanosecond},
		{name: "ClientIP, 60s", a: Affinity{Type: AffinityClientIP, Timeout: time.Minute}, wantSticky: true, wantTTL: time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.a.Sticky(); got != tc.wantSticky {
				t.Errorf("Sticky() = %v, want %v", got, tc.wantSticky)
			}
			if got := tc.a.TTL(); got != tc.wantTTL {
				t.Errorf("TTL() = %v, want %v", got, tc.wantTTL)
			}
		})
	}
}

// TestTrafficPolicyEndpoints: traffic to cluster IPs follows
// internalTrafficPolicy, traffic to node ports, external and
// load-balancer IPs follows externalTrafficPolicy, each on its own; a
// port has endpoints when either set has one.
func TestTrafficPolicyEndpoints(t *testing.T) {
	cluster := []Endpoint{{Addr: netip.MustParseAddrPort("198.18.0.1:80"), Ready: true, Serving: true}}
	local := []Endpoint{{Addr: netip.MustParseAddrPort("198.18.0.2:80"), Ready: true, Serving: true, Local: true}}
	tests := []struct {
		name                         string
		internalLocal, externalLocal bool
		wantInternal, wantExternal   []Endpoint
	}{
		{name: "both Cluster", wantInternal: cluster, wantExternal: cluster},
		{name: "internal Local", internalLocal: true, wantInternal: local, wantExternal: cluster},
		{name: "external Local", externalLocal: true, wantInternal: cluster, wantExternal: local},
		{name: "both Local", internalLocal: true, externalLocal: true, wantInternal: local, wantExternal: local},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sp := ServicePort{ClusterEndpoints: cluster, LocalEndpoints: local, InternalLocal: tc.internalLocal, ExternalLocal: tc.externalLocal}
			if got := sp.InternalEndpoints(); !slices.Equal(got, tc.wantInternal) {
				t.Errorf("InternalEndpoints() = %v, want %v", got, tc.wantInternal)
			}
			if got := sp.ExternalEndpoints(); !slices.Equal(got, tc.wantExternal) {
				t.Errorf("ExternalEndpoints() = %v, want %v", got, tc.wantExternal)
			}
		})
	}

	for _, tc := range []struct {
		name string
		sp   ServicePort
		want bool
	}{
		{name: "none", want: false},
		{name: "cluster only", sp: ServicePort{ClusterEndpoints: cluster}, want: true},
		{name: "local only", sp: ServicePort{LocalEndpoints: local, InternalLocal: true}, want: true},
		{name: "empty, not nil", sp: ServicePort{ClusterEndpoints: []Endpoint{}, LocalEndpoints: []Endpoint{}}, want: false},
	} {
		if got := tc.sp.HasEndpoints(); got != tc.want {
			t.Errorf("%s: HasEndpoints() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestServicePortEqualEveryField: ports that differ in any one field are
// not equal, so that no change to a Service or its endpoints is taken
// for none.
func TestServicePortEqualEveryField(t *testing.T) {
	ep := func(s string) Endpoint { return Endpoint{Addr: netip.MustParseAddrPort(s), Ready: true, Serving: true} }
	base := func() ServicePort {
		return ServicePort{
			Name:                     ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: TCP},
			Port:                     80,
			ClusterIPs:               []netip.Addr{netip.MustParseAddr("198.18.0.10")},
			NodePort:                 30080,
			ExternalIPs:              []netip.Addr{netip.MustParseAddr("192.0.2.1")},
			LoadBalancerIPs:          []netip.Addr{netip.MustParseAddr("192.0.2.2")},
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
			IPFamilies:               []IPFamily{IPv4},
			Affinity:                 Affinity{Type: AffinityClientIP, Timeout: time.Hour},
			HealthCheckNodePort:      30999,
			ProxyProtocol:            ProxyProtocolV1,
			ClusterEndpoints:         []Endpoint{ep("198.18.1.1:8080"), ep("198.18.1.2:8080")},
			LocalEndpoints:           []Endpoint{ep("198.18.1.1:8080")},
			TopologyHintsIgnored:     "zone hints ignored: none is for zone zone-a",
			ServingEndpoints:         []netip.AddrPort{netip.MustParseAddrPort("198.18.1.1:8080"), netip.MustParseAddrPort("198.18.1.2:8080")},
		}
	}
	tests := []struct {
		field  string
		change func(*ServicePort)
	}{
		{"Name", func(sp *ServicePort) { sp.Name.Protocol = UDP }},
		{"Port", func(sp *ServicePort) { sp.Port = 81 }},
		{"ClusterIPs", func(sp *ServicePort) { sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr("fd00::10")) }},
		{"NodePort", func(sp *ServicePort) { sp.NodePort = 0 }},
		{"ExternalIPs", func(sp *ServicePort) { sp.ExternalIPs = nil }},
		{"LoadBalancerIPs", func(sp *ServicePort) { sp.LoadBalancerIPs = nil }},
		{"LoadBalancerSourceRanges", func(sp *ServicePort) { sp.LoadBalancerSourceRanges = nil }},
		{"IPFamilies", func(sp *ServicePort) { sp.IPFamilies = []IPFamily{IPv4, IPv6} }},
		{"Affinity", func(sp *ServicePort) { sp.Affinity.Timeout = time.Minute }},
		{"InternalLocal", func(sp *ServicePort) { sp.InternalLocal = true }},
		{"ExternalLocal", func(sp *ServicePort) { sp.ExternalLocal = true }},
		{"HealthCheckNodePort", func(sp *ServicePort) { sp.HealthCheckNodePort = 0 }},
		{"ProxyProtocol", func(sp *ServicePort) { sp.ProxyProtocol = ProxyProtocolV2 }},
		{"ClusterEndpoints", func(sp *ServicePort) { sp.ClusterEndpoints = sp.ClusterEndpoints[:1] }},
		{"ClusterEndpoints conditions", func(sp *ServicePort) { sp.ClusterEndpoints[1].Terminating = true }},
		{"LocalEndpoints", func(sp *ServicePort) { sp.LocalEndpoints = nil }},
		{"ServingEndpoints", func(sp *ServicePort) { sp.ServingEndpoints = sp.ServingEndpoints[:1] }},
		{"TopologyHintsIgnored", func(sp *ServicePort) { sp.TopologyHintsIgnored = "" }},
	}
	a, b := base(), base()
	if !a.Equal(&b) {
		t.Fatal("two copies of one port are not equal")
	}
	for _, tc := range tests {
		t.Run(tc.field, func(t *testing.T) {
			a, b := base(), base()
			tc.change(&b)
			if a.Equal(&b) || b.Equal(&a) {
				t.Errorf("ports that differ in %s are equal", tc.field)
			}
		})
	}
}

// TestSnapshotAllStops: a range over All may stop early, as a
// range-over-func iterator must allow.
func TestSnapshotAllStops(t *testing.T) {
	var ports []ServicePort
	for _, n := range []string{"a", "b", "c"} {
		ports = append(ports, ServicePort{Name: ServicePortName{Namespace: "demo", Name: n, Protocol: TCP}})
	}
	s := NewSnapshot(ports)
	var seen []string
	for sp := range s.All {
		seen = append(seen, sp.Name.Name)
		if len(seen) == 2 {
			break
		}
	}
	if !slices.Equal(seen, []string{"a", "b"}) {
		t.Errorf("saw %q, want a and b", seen)
	}
}

// TestServicePortNameForms: the printed forms, with and without a port
// name, and the order by namespace, name, port name, then protocol.
func TestServicePortNameForms(t *testing.T) {
	named := ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: TCP}
	unnamed := ServicePortName{Namespace: "demo", Name: "web", Protocol: UDP}
	for _, tc := range []struct{ got, want string }{
		{named.String(), "demo/web:http/TCP"},
		{unnamed.String(), "demo/web/UDP"},
		{named.Comment(), "demo/web:http"},
		{unnamed.Comment(), "demo/web"},
		{named.Service().String(), "demo/web"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}

	// Sorted, each name comes before the next.
	sorted := []ServicePortName{
		{Namespace: "a", Name: "z", Port: "z", Protocol: UDP},
		{Namespace: "b", Name: "a", Port: "z", Protocol: UDP},
		{Namespace: "b", Name: "b", Port: "", Protocol: UDP},
		{Namespace: "b", Name: "b", Port: "a", Protocol: UDP},
		{Namespace: "b", Name: "b", Port: "b", Protocol: SCTP},
		{Namespace: "b", Name: "b", Port: "b", Protocol: TCP},
		{Namespace: "b", Name: "b", Port: "b", Protocol: UDP},
	}
	for i := range sorted {
		for j := range sorted {
			want := 0
			switch {
			case i < j:
				want = -1
			case i > j:
				want = 1
			}
			if got := sorted[i].Compare(sorted[j]); got != want {
				t.Errorf("%v.Compare(%v) = %d, want %d", sorted[i], sorted[j], got, want)
			}
		}
	}
}

// TestParseProtocol: the three protocols in any case, nothing else, and
// no space around them.
func TestParseProtocol(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Protocol
	}{{"TCP", TCP}, {"tcp", TCP}, {"Udp", UDP}, {"sctp", SCTP}} {
		if got, err := ParseProtocol(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseProtocol(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "ICMP", "tcp "} {
		if got, err := ParseProtocol(in); err == nil {
			t.Errorf("ParseProtocol(%q) = %q, want an error", in, got)
		}
	}
}
