package conntrack

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

var (
	dns = state.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: state.UDP}
	web = state.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: state.TCP}
)

func ips(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func portals(ports []state.ServicePort, proxy map[state.ServicePortName]uint16) []portal.Portal {
	return portal.FromSnapshot(state.NewSnapshot(ports), func(n state.ServicePortName) uint16 { return proxy[n] }, nil)
}

func TestStaleUDP(t *testing.T) {
	dnsPort := state.ServicePort{Name: dns, Port: 53, ClusterIPs: ips("198.18.0.53", "fd5e:b1b5::53"), ExternalIPs: ips("198.19.0.53"),
		LoadBalancerIPs: ips("198.19.1.53"), NodePort: 30053,
		ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.2.1:53")}, {Addr: netip.MustParseAddrPort("[fd5e:b1b5:2::1]:53")},
			{Addr: netip.MustParseAddrPort("198.18.2.2:53")}}}
	webPort := state.ServicePort{Name: web, Port: 80, ClusterIPs: ips("198.18.0.10"), NodePort: 30080}
	fewerEndpoints := dnsPort
	fewerEndpoints.ClusterEndpoints = dnsPort.ClusterEndpoints[:2]
	noIPv6Endpoints := dnsPort
	noIPv6Endpoints.ClusterEndpoints = slices.Delete(slices.Clone(dnsPort.ClusterEndpoints), 1, 2)
	noExternal := dnsPort
	noExternal.ExternalIPs = nil
	noEndpoints := dnsPort
	noEndpoints.ClusterEndpoints = nil
	pp := map[state.ServicePortName]uint16{dns: 41235, web: 41234}
	movedPP := map[state.ServicePortName]uint16{dns: 42000, web: 41234}
	all := func() []Filter { // every frontend of dnsPort, on its old proxy port
		return []Filter{
			{Family: portal.IPv4, OrigDstPort: 30053, ReplySrcPort: 41235},
			{Family: portal.IPv4, OrigDst: netip.MustParseAddr("198.18.0.53"), OrigDstPort: 53},
			{Family: portal.IPv4, OrigDst: netip.MustParseAddr("198.19.0.53"), OrigDstPort: 53},
			{Family: portal.IPv4, OrigDst: netip.MustParseAddr("198.19.1.53"), OrigDstPort: 53},
			{Family: portal.IPv6, OrigDstPort: 30053, ReplySrcPort: 41235},
			{Family: portal.IPv6, OrigDst: netip.MustParseAddr("fd5e:b1b5::53"), OrigDstPort: 53},
		}
	}
	added := all() // a new frontend: its unredirected entries
	added[0] = Filter{Family: portal.IPv4, OrigDstPort: 30053, NoNAT: true}
	added[4] = Filter{Family: portal.IPv6, OrigDstPort: 30053, NoNAT: true}
	tests := []struct {
		name     string
		old, new []portal.Portal
		want     []Filter
	}{
		{name: "nothing changes", old: portals([]state.ServicePort{dnsPort}, pp), new: portals([]state.ServicePort{dnsPort}, pp)},
		{name: "UDP service removed: every frontend", old: portals([]state.ServicePort{dnsPort, webPort}, pp), new: portals([]state.ServicePort{webPort}, pp), want: all()},
		{name: "UDP service added: every frontend", old: nil, new: portals([]state.ServicePort{dnsPort}, pp), want: added},
		{name: "bind portal to proxy ports: unredirected entries", old: portals([]state.ServicePort{dnsPort}, nil), new: portals([]state.ServicePort{dnsPort}, pp), want: added},
		{name: "proxy port moved: every frontend", old: portals([]state.ServicePort{dnsPort}, pp), new: portals([]state.ServicePort{dnsPort}, movedPP), want: all()},
		{name: "one frontend removed", old: portals([]state.ServicePort{dnsPort}, pp), new: portals([]state.ServicePort{noExternal}, pp),
			want: []Filter{{Family: portal.IPv4, OrigDst: netip.MustParseAddr("198.19.0.53"), OrigDstPort: 53}}},
		{name: "endpoint removed: nothing (see StaleUDP)", old: portals([]state.ServicePort{dnsPort}, pp), new: portals([]state.ServicePort{fewerEndpoints}, pp)},
		{name: "last endpoint removed (the portal now rejects): every frontend", old: portals([]state.ServicePort{dnsPort}, pp), new: portals([]state.ServicePort{noEndpoints}, pp), want: all()},
		{name: "last IPv6 endpoint removed: the IPv6 frontends", old: portals([]state.ServicePort{dnsPort}, pp), new: portals([]state.ServicePort{noIPv6Endpoints}, pp),
			want: all()[4:]},
		{name: "first endpoint added: nothing", old: portals([]state.ServicePort{noEndpoints}, pp), new: portals([]state.ServicePort{dnsPort}, pp)},
		{name: "bind portal, last endpoint removed: nothing", old: portals([]state.ServicePort{dnsPort}, nil), new: portals([]state.ServicePort{noEndpoints}, nil)},
		{name: "TCP changes: nothing", old: portals([]state.ServicePort{webPort}, pp), new: nil},
		{name: "bind portal (no proxy ports): nothing", old: portals([]state.ServicePort{dnsPort}, nil), new: nil},
		{name: "service loses its proxy port", old: portals([]state.ServicePort{dnsPort}, pp), new: portals([]state.ServicePort{dnsPort}, nil), want: all()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := StaleUDP(tc.old, tc.new)
			if !slices.Equal(got, tc.want) {
				t.Errorf("StaleUDP =\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
}

// TestRemovedUDP: the rules of removed portals leave every UDP frontend
// with a proxy port stale, and nothing else.
func TestRemovedUDP(t *testing.T) {
	dnsPort := state.ServicePort{Name: dns, Port: 53, ClusterIPs: ips("198.18.0.53"), NodePort: 30053,
		ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.2.1:53")}}}
	webPort := state.ServicePort{Name: web, Port: 80, ClusterIPs: ips("198.18.0.10"), NodePort: 30080}
	pp := map[state.ServicePortName]uint16{dns: 41235, web: 41234}
	want := []Filter{
		{Family: portal.IPv4, OrigDstPort: 30053, ReplySrcPort: 41235},
		{Family: portal.IPv4, OrigDst: netip.MustParseAddr("198.18.0.53"), OrigDstPort: 53},
	}
	if got := RemovedUDP(portals([]state.ServicePort{dnsPort, webPort}, pp)); !slices.Equal(got, want) {
		t.Errorf("RemovedUDP =\n%v\nwant\n%v", got, want)
	}
	if got := RemovedUDP(nil); len(got) != 0 {
		t.Errorf("RemovedUDP(nil) = %v, want nothing", got)
	}
}

func TestFilterMatch(t *testing.T) {
	// A pod's DNS flow REDIRECTed to the proxy port, and the proxy's own
	// flow to the endpoint.
	client := Flow{Family: portal.IPv4, Protocol: ProtocolUDP,
		OrigSrc: netip.MustParseAddrPort("198.18.3.2:5353"), OrigDst: netip.MustParseAddrPort("198.18.0.53:53"),
		ReplySrc: netip.MustParseAddrPort("198.18.3.1:41235"), ReplyDst: netip.MustParseAddrPort("198.18.3.2:5353")}
	proxied := Flow{Family: portal.IPv4, Protocol: ProtocolUDP,
		OrigSrc: netip.MustParseAddrPort("198.18.2.254:40000"), OrigDst: netip.MustParseAddrPort("198.18.2.1:53"),
		ReplySrc: netip.MustParseAddrPort("198.18.2.1:53"), ReplyDst: netip.MustParseAddrPort("198.18.2.254:40000")}
	tcp := client
	tcp.Protocol = 6
	tests := []struct {
		name string
		f    Filter
		fl   Flow
		want bool
	}{
		{"frontend", Filter{OrigDst: netip.MustParseAddr("198.18.0.53"), OrigDstPort: 53}, client, true},
		{"frontend, other port", Filter{OrigDst: netip.MustParseAddr("198.18.0.53"), OrigDstPort: 54}, client, false},
		{"node port by port", Filter{Family: portal.IPv4, OrigDstPort: 53}, client, true},
		{"node port, wrong family", Filter{Family: portal.IPv6, OrigDstPort: 53}, client, false},
		{"reply from the proxy port", Filter{ReplySrcPort: 41235}, client, true},
		{"reply from the endpoint", Filter{ReplySrc: netip.MustParseAddr("198.18.2.1")}, proxied, true},
		{"reply from the endpoint: not the client's", Filter{ReplySrc: netip.MustParseAddr("198.18.2.1")}, client, false},
		{"no NAT: the REDIRECTed flow is not", Filter{OrigDstPort: 53, NoNAT: true}, client, false},
		{"no NAT: the proxy's flow is", Filter{OrigDstPort: 53, NoNAT: true}, proxied, true},
		{"no NAT alone matches nothing", Filter{NoNAT: true}, proxied, false},
		{"TCP never", Filter{OrigDstPort: 53}, tcp, false},
		{"empty filter matches nothing", Filter{}, client, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.f.Match(tc.fl); got != tc.want {
				t.Errorf("%v.Match = %v, want %v", tc.f, got, tc.want)
			}
		})
	}
}

func TestFake(t *testing.T) {
	f := &Fake{}
	f.Add(Flow{Family: portal.IPv4, Protocol: ProtocolUDP, OrigDst: netip.MustParseAddrPort("198.18.0.53:53")},
		Flow{Family: portal.IPv4, Protocol: ProtocolUDP, OrigDst: netip.MustParseAddrPort("198.18.0.54:53")})
	n, err := f.ClearUDP(context.Background(), Filter{OrigDst: netip.MustParseAddr("198.18.0.53"), OrigDstPort: 53})
	if err != nil || n != 1 || len(f.Flows()) != 1 || len(f.Calls()) != 1 {
		t.Errorf("ClearUDP = %d, %v; flows %v; calls %v", n, err, f.Flows(), f.Calls())
	}
	var _ Interface = Noop{}
}

// TestNodePortFiltersSpareForeignFlows: node-port numbers are cluster-wide,
// so a pod's flow to another host's node port (masqueraded by some other
// rule) has the same original destination port as this host's node port.
// The filters of a removed, moved or added node port delete this host's
// entries only: the REDIRECTed one (the reply comes from the proxy port)
// or, for a new one, the unredirected one.
func TestNodePortFiltersSpareForeignFlows(t *testing.T) {
	dnsPort := state.ServicePort{Name: dns, Port: 53, ClusterIPs: ips("198.18.0.53"), NodePort: 30053,
		ClusterEndpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.2.1:53")}}}
	pp := map[state.ServicePortName]uint16{dns: 41235}
	flow := func(src, dst, rsrc, rdst string) Flow {
		return Flow{Family: portal.IPv4, Protocol: ProtocolUDP, OrigSrc: netip.MustParseAddrPort(src), OrigDst: netip.MustParseAddrPort(dst),
			ReplySrc: netip.MustParseAddrPort(rsrc), ReplyDst: netip.MustParseAddrPort(rdst)}
	}
	foreign := flow("198.18.2.2:7002", "198.18.1.1:30053", "198.18.1.1:30053", "198.18.1.2:7002") // masqueraded to another host
	redirected := flow("198.18.1.1:7003", "198.18.1.2:30053", "198.18.1.2:41235", "198.18.1.1:7003")
	unredirected := flow("198.18.1.1:7004", "198.18.1.2:30053", "198.18.1.2:30053", "198.18.1.1:7004")
	for _, tc := range []struct {
		name     string
		filters  []Filter
		gone     []Flow
		keptOnly []Flow
	}{
		{"removed", RemovedUDP(portals([]state.ServicePort{dnsPort}, pp)), []Flow{redirected}, []Flow{foreign, unredirected}},
		{"added", StaleUDP(nil, portals([]state.ServicePort{dnsPort}, pp)), []Flow{unredirected}, []Flow{foreign, redirected}},
		{"retargeted", RetargetedUDP(portals([]state.ServicePort{dnsPort}, pp), portal.IPv4), []Flow{redirected}, []Flow{foreign, unredirected}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &Fake{}
			f.Add(foreign, redirected, unredirected)
			if _, err := f.ClearUDP(context.Background(), tc.filters...); err != nil {
				t.Fatal(err)
			}
			if got := f.Flows(); !slices.Equal(got, tc.keptOnly) {
				t.Errorf("filters %v left\n%v\nwant\n%v", tc.filters, got, tc.keptOnly)
			}
		})
	}
}
