package portal

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

var (
	webHTTP   = state.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: state.TCP}
	dnsUDP    = state.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: state.UDP}
	sigSCTP   = state.ServicePortName{Namespace: "tel", Name: "sig", Protocol: state.SCTP}
	v6Only    = state.ServicePortName{Namespace: "default", Name: "six", Port: "http", Protocol: state.TCP}
	elsewhere = state.ServicePortName{Namespace: "default", Name: "elsewhere", Port: "http", Protocol: state.TCP}
)

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// fixedSnapshot is the snapshot of the golden tests: every kind of
// frontend, both families and all three protocols; the SCTP service port
// has no endpoints; the load-balancer IP has source ranges.
func fixedSnapshot() state.Snapshot {
	ep := []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.12.2:8080"), Ready: true, Serving: true}}
	ep6 := []state.Endpoint{{Addr: netip.MustParseAddrPort("[fd5e:b1b5:12::2]:8080"), Ready: true, Serving: true}}
	return state.NewSnapshot([]state.ServicePort{
		{Name: webHTTP, Port: 80, ClusterIPs: addrs("198.18.0.10", "fd5e:b1b5::10"), NodePort: 30080,
			ExternalIPs: addrs("198.19.0.5"), LoadBalancerIPs: addrs("198.19.1.1"), ClusterEndpoints: slices.Concat(ep, ep6),
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.18.11.0/24"), netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("fd5e:b1b5:11::/64")}},
		{Name: dnsUDP, Port: 53, ClusterIPs: addrs("198.18.0.53"), NodePort: 30053, ClusterEndpoints: ep},
		{Name: sigSCTP, Port: 3868, ClusterIPs: addrs("198.18.0.99")},
		{Name: v6Only, Port: 8080, ClusterIPs: addrs("fd5e:b1b5::80"), NodePort: 30081, ClusterEndpoints: ep6, LocalEndpoints: ep6},
		// Local policies, and its only endpoint on another node; the
		// external one has a health-check node port.
		{Name: elsewhere, Port: 80, ClusterIPs: addrs("198.18.0.70", "fd5e:b1b5::70"), NodePort: 30070,
			InternalLocal: true, ExternalLocal: true, HealthCheckNodePort: 30071, ClusterEndpoints: slices.Concat(ep, ep6)},
	})
}

var fixedProxyPorts = map[state.ServicePortName]uint16{webHTTP: 41234, dnsUDP: 41235, sigSCTP: 41236, v6Only: 41237, elsewhere: 41238}

// fixedExternalPorts are the proxy ports of external traffic where a Local
// policy splits it from cluster traffic.
var fixedExternalPorts = map[state.ServicePortName]uint16{elsewhere: 41239}

func fixedPortals() []Portal {
	ps := FromSnapshot(fixedSnapshot(), func(n state.ServicePortName) uint16 { return fixedProxyPorts[n] }, nil)
	for i, p := range ps {
		if pp := fixedExternalPorts[p.Service]; pp != 0 && p.Kind != ClusterIP {
			ps[i].ProxyPort = pp
		}
	}
	return ps
}

func TestFromSnapshot(t *testing.T) {
	tests := []struct {
		name  string
		ports []state.ServicePort
		proxy map[state.ServicePortName]uint16
		want  []string
	}{
		// Without endpoints every portal rejects (see the case below).
		{
			name:  "every kind",
			ports: []state.ServicePort{{Name: webHTTP, Port: 80, ClusterIPs: addrs("198.18.0.10"), ExternalIPs: addrs("198.19.0.5"), LoadBalancerIPs: addrs("198.19.1.1"), NodePort: 30080}},
			proxy: map[state.ServicePortName]uint16{webHTTP: 41234},
			want: []string{
				"ClusterIP 198.18.0.10:80/TCP -> :41234 reject",
				"ExternalIP 198.19.0.5:80/TCP -> :41234 reject",
				"LoadBalancerIP 198.19.1.1:80/TCP -> :41234 reject",
				"NodePort NodePort(IPv4) 30080/TCP -> :41234 reject",
			},
		},
		{
			name:  "dual stack node port gets both families",
			ports: []state.ServicePort{{Name: webHTTP, Port: 80, ClusterIPs: addrs("198.18.0.10", "fd5e:b1b5::10"), NodePort: 30080}},
			proxy: map[state.ServicePortName]uint16{webHTTP: 41234},
			want: []string{
				"ClusterIP 198.18.0.10:80/TCP -> :41234 reject",
				"ClusterIP [fd5e:b1b5::10]:80/TCP -> :41234 reject",
				"NodePort NodePort(IPv4) 30080/TCP -> :41234 reject",
				"NodePort NodePort(IPv6) 30080/TCP -> :41234 reject",
			},
		},
		{
			name:  "no frontends: node port on IPv4",
			ports: []state.ServicePort{{Name: dnsUDP, Port: 53, NodePort: 30053}},
			proxy: map[state.ServicePortName]uint16{dnsUDP: 41235},
			want:  []string{"NodePort NodePort(IPv4) 30053/UDP -> :41235 reject"},
		},
		{
			name:  "no proxy port kept as zero",
			ports: []state.ServicePort{{Name: dnsUDP, Port: 53, ClusterIPs: addrs("198.18.0.53")}},
			want:  []string{"ClusterIP 198.18.0.53:53/UDP -> :0 reject"},
		},
		{
			name: "a service port without endpoints rejects",
			ports: []state.ServicePort{
				{Name: webHTTP, Port: 80, ClusterIPs: addrs("198.18.0.10"), NodePort: 30080},
				{Name: dnsUDP, Port: 53, ClusterIPs: addrs("198.18.0.53"), ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.12.2:53")}}},
			},
			proxy: map[state.ServicePortName]uint16{webHTTP: 41234, dnsUDP: 41235},
			want: []string{
				"ClusterIP 198.18.0.10:80/TCP -> :41234 reject",
				"NodePort NodePort(IPv4) 30080/TCP -> :41234 reject",
				"ClusterIP 198.18.0.53:53/UDP -> :41235",
			},
		},
		{
			name: "a family without endpoints rejects, the other does not",
			ports: []state.ServicePort{{Name: webHTTP, Port: 80, ClusterIPs: addrs("198.18.0.10", "fd5e:b1b5::10"), NodePort: 30080,
				ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.12.2:8080")}}}},
			proxy: map[state.ServicePortName]uint16{webHTTP: 41234},
			want: []string{
				"ClusterIP 198.18.0.10:80/TCP -> :41234",
				"ClusterIP [fd5e:b1b5::10]:80/TCP -> :41234 reject",
				"NodePort NodePort(IPv4) 30080/TCP -> :41234",
				"NodePort NodePort(IPv6) 30080/TCP -> :41234 reject",
			},
		},
		{
			// As kube-proxy's filter rules: a Local policy without a local
			// endpoint drops its own traffic (internal: cluster IPs;
			// external: the rest), while endpoints elsewhere exist.
			name: "a Local policy without a local endpoint drops",
			ports: []state.ServicePort{
				{Name: webHTTP, Port: 80, ClusterIPs: addrs("198.18.0.10", "fd5e:b1b5::10"), ExternalIPs: addrs("198.19.0.5"), NodePort: 30080, InternalLocal: true,
					ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.12.2:8080")}, {Addr: netip.MustParseAddrPort("[fd5e:b1b5:12::2]:8080")}},
					LocalEndpoints:   []state.Endpoint{{Addr: netip.MustParseAddrPort("[fd5e:b1b5:12::2]:8080"), Local: true}}},
				{Name: dnsUDP, Port: 53, ClusterIPs: addrs("198.18.0.53"), NodePort: 30053, ExternalLocal: true,
					ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.12.2:53")}}},
			},
			proxy: map[state.ServicePortName]uint16{webHTTP: 41234, dnsUDP: 41235},
			want: []string{
				"ClusterIP 198.18.0.10:80/TCP -> :41234 drop",
				"ClusterIP [fd5e:b1b5::10]:80/TCP -> :41234",
				"ExternalIP 198.19.0.5:80/TCP -> :41234",
				"NodePort NodePort(IPv4) 30080/TCP -> :41234",
				"NodePort NodePort(IPv6) 30080/TCP -> :41234",
				"ClusterIP 198.18.0.53:53/UDP -> :41235",
				"NodePort NodePort(IPv4) 30053/UDP -> :41235 drop",
			},
		},
		{
			// Every portal of the Service carries it, so each family that
			// serves the Service accepts it.
			name: "health check node port on every portal",
			ports: []state.ServicePort{{Name: webHTTP, Port: 80, ClusterIPs: addrs("198.18.0.10"), LoadBalancerIPs: addrs("198.19.1.1", "fd5e:b1b5:19::1"),
				ExternalLocal: true, HealthCheckNodePort: 30071}},
			proxy: map[state.ServicePortName]uint16{webHTTP: 41234},
			want: []string{
				"ClusterIP 198.18.0.10:80/TCP -> :41234 reject hc 30071",
				"LoadBalancerIP 198.19.1.1:80/TCP -> :41234 reject hc 30071",
				"LoadBalancerIP [fd5e:b1b5:19::1]:80/TCP -> :41234 reject hc 30071",
			},
		},
		{
			name:  "mapped IPv4 is unmapped, duplicates collapse",
			ports: []state.ServicePort{{Name: dnsUDP, Port: 53, ClusterIPs: addrs("::ffff:198.18.0.53", "198.18.0.53")}},
			proxy: map[state.ServicePortName]uint16{dnsUDP: 41235},
			want:  []string{"ClusterIP 198.18.0.53:53/UDP -> :41235 reject"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := FromSnapshot(state.NewSnapshot(tc.ports), func(n state.ServicePortName) uint16 { return tc.proxy[n] }, nil)
			var s []string
			for _, p := range got {
				line := string(p.Kind) + " " + p.String()
				if p.Reject {
					line += " reject"
				}
				if p.NoLocal {
					line += " drop"
				}
				if p.HealthCheckNodePort != 0 {
					line += fmt.Sprintf(" hc %d", p.HealthCheckNodePort)
				}
				s = append(s, line)
			}
			if !slices.Equal(s, tc.want) {
				t.Errorf("FromSnapshot =\n%q\nwant\n%q", s, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	good := Portal{Service: webHTTP, Kind: ClusterIP, Family: IPv4, IP: netip.MustParseAddr("198.18.0.10"), Port: 80, ProxyPort: 1}
	tests := []struct {
		name   string
		mutate func(*Portal)
		ok     bool
	}{
		{"good", func(*Portal) {}, true},
		{"no port", func(p *Portal) { p.Port = 0 }, false},
		{"bad protocol", func(p *Portal) { p.Service.Protocol = "ICMP" }, false},
		{"family mismatch", func(p *Portal) { p.Family = IPv6 }, false},
		{"no address", func(p *Portal) { p.IP = netip.Addr{} }, false},
		{"node port with address", func(p *Portal) { p.Kind = NodePort }, false},
		{"node port", func(p *Portal) { p.Kind, p.IP = NodePort, netip.Addr{} }, true},
		{"unknown kind", func(p *Portal) { p.Kind = "Magic" }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := good
			tc.mutate(&p)
			if err := p.validate(); (err == nil) != tc.ok {
				t.Errorf("validate(%v) = %v, want ok=%v", p, err, tc.ok)
			}
		})
	}
}
