package conntrack

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

var sig = state.ServicePortName{Namespace: "tel", Name: "sig", Port: "sig", Protocol: state.SCTP}

// TestStaleUDPOnlyUDP: TCP and SCTP portals give no filter, whatever
// happens to them: the filters delete UDP entries, and an SCTP frontend's
// filter would take the UDP entries of a UDP port on the same address and
// number (a Service may serve 53/UDP and 53/SCTP) that did not change.
func TestStaleUDPOnlyUDP(t *testing.T) {
	for _, name := range []state.ServicePortName{web, sig} {
		sp := state.ServicePort{Name: name, Port: 53, ClusterIPs: ips("198.18.0.53"), NodePort: 30053,
			ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.2.1:53")}}}
		noEndpoints := sp
		noEndpoints.ClusterEndpoints = nil
		pp := map[state.ServicePortName]uint16{name: 41236}
		moved := map[state.ServicePortName]uint16{name: 42000}
		for _, tc := range []struct {
			name     string
			old, new []portal.Portal
		}{
			{"removed", portals([]state.ServicePort{sp}, pp), nil},
			{"added", nil, portals([]state.ServicePort{sp}, pp)},
			{"proxy port moved", portals([]state.ServicePort{sp}, pp), portals([]state.ServicePort{sp}, moved)},
			{"last endpoint removed", portals([]state.ServicePort{sp}, pp), portals([]state.ServicePort{noEndpoints}, pp)},
		} {
			if got := StaleUDP(tc.old, tc.new); len(got) != 0 {
				t.Errorf("%s %s: StaleUDP = %v, want nothing", name.Protocol, tc.name, got)
			}
		}
		if got := RetargetedUDP(portals([]state.ServicePort{sp}, pp), portal.IPv4); len(got) != 0 {
			t.Errorf("%s: RetargetedUDP = %v, want nothing", name.Protocol, got)
		}
	}
}

// TestStaleUDPSharedFrontend: where two service ports claim one UDP
// frontend and only one has a proxy port (the other is not served), the
// rule is the served one's, whichever comes first: its entries are stale
// when its proxy port moves, and not when the unserved one comes or goes.
func TestStaleUDPSharedFrontend(t *testing.T) {
	other := state.ServicePortName{Namespace: "kube-system", Name: "dns2", Port: "dns", Protocol: state.UDP}
	ext := netip.MustParseAddr("198.19.0.53")
	p := func(name state.ServicePortName, pp uint16) portal.Portal {
		return portal.Portal{Service: name, Kind: portal.ExternalIP, Family: portal.IPv4, IP: ext, Port: 53, ProxyPort: pp}
	}
	stale := []Filter{{Family: portal.IPv4, OrigDst: ext, OrigDstPort: 53}}
	for _, order := range []string{"served first", "unserved first"} {
		both := func(pp uint16) []portal.Portal {
			ps := []portal.Portal{p(dns, pp), p(other, 0)}
			if order == "unserved first" {
				slices.Reverse(ps)
			}
			return ps
		}
		for _, tc := range []struct {
			name     string
			old, new []portal.Portal
			want     []Filter
		}{
			{"nothing changes", both(41235), both(41235), nil},
			{"the served one's proxy port moves", both(41235), both(42000), stale},
			{"the unserved one goes", both(41235), []portal.Portal{p(dns, 41235)}, nil},
			{"the unserved one comes", []portal.Portal{p(dns, 41235)}, both(41235), nil},
			{"the served one goes", both(41235), []portal.Portal{p(other, 0)}, stale},
		} {
			if got := StaleUDP(tc.old, tc.new); !slices.Equal(got, tc.want) {
				t.Errorf("%s, %s: StaleUDP = %v, want %v", order, tc.name, got, tc.want)
			}
		}
	}
}

// TestStaleUDPNewUnservedFrontend: a frontend that comes without a proxy
// port (the bind portal, or a service port not served) gets no rule and
// no NAT, so no entry of its is stale: its flows, unredirected, go where
// they went.
func TestStaleUDPNewUnservedFrontend(t *testing.T) {
	dnsPort := state.ServicePort{Name: dns, Port: 53, ClusterIPs: ips("198.18.0.53", "fd5e:b1b5::53"), ExternalIPs: ips("198.19.0.53"), NodePort: 30053,
		ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.2.1:53")}}}
	if got := StaleUDP(nil, portals([]state.ServicePort{dnsPort}, nil)); len(got) != 0 {
		t.Errorf("StaleUDP = %v, want nothing", got)
	}
}

// TestRetargetedUDPEdges: a change of target moves the UDP entries of the
// portals of the family asked for that redirect, and no others: not the
// other family's (its target did not change), not those without a proxy
// port (no rule sent them anywhere), not TCP ones.
func TestRetargetedUDPEdges(t *testing.T) {
	dnsPort := state.ServicePort{Name: dns, Port: 53, ClusterIPs: ips("198.18.0.53", "fd5e:b1b5::53"), NodePort: 30053,
		ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.2.1:53")}, {Addr: netip.MustParseAddrPort("[fd5e:b1b5:2::1]:53")}}}
	webPort := state.ServicePort{Name: web, Port: 80, ClusterIPs: ips("198.18.0.10", "fd5e:b1b5::10"), NodePort: 30080,
		ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.2.1:80")}}}
	served := portals([]state.ServicePort{dnsPort, webPort}, map[state.ServicePortName]uint16{dns: 41235, web: 41234})
	for _, tc := range []struct {
		name    string
		portals []portal.Portal
		fam     portal.Family
		want    []Filter
	}{
		{"IPv4", served, portal.IPv4, []Filter{
			{Family: portal.IPv4, OrigDstPort: 30053, ReplySrcPort: 41235},
			{Family: portal.IPv4, OrigDst: netip.MustParseAddr("198.18.0.53"), OrigDstPort: 53},
		}},
		{"IPv6", served, portal.IPv6, []Filter{
			{Family: portal.IPv6, OrigDstPort: 30053, ReplySrcPort: 41235},
			{Family: portal.IPv6, OrigDst: netip.MustParseAddr("fd5e:b1b5::53"), OrigDstPort: 53},
		}},
		{"without proxy ports", portals([]state.ServicePort{dnsPort, webPort}, nil), portal.IPv4, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RetargetedUDP(tc.portals, tc.fam); !slices.Equal(got, tc.want) {
				t.Errorf("RetargetedUDP =\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
}
