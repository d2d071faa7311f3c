package userspace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// dualStack is a proxier whose proxy ports listen in both families, a TCP
// and a UDP backend in each family (answering t4, t6, u4 and u6), and a
// dual-stack TCP and UDP service port, without endpoints.
type dualStack struct {
	p        *Proxier
	t4, t6   *tcpBackend
	u4, u6   *udpBackend
	tcp, udp state.ServicePort
}

func newDualStack(t *testing.T) *dualStack {
	needIPv6Loopback(t)
	d := &dualStack{
		p:  newTestProxier(t, Config{BindAddress: netip.IPv6Unspecified()}),
		t4: startTCPBackend(t, "t4"), t6: startTCPBackendOn(t, "t6", "[::1]:0"),
		u4: startUDPBackend(t, "u4"), u6: startUDPBackendOn(t, "u6", "[::1]:0"),
	}
	cips := []netip.Addr{netip.MustParseAddr("198.18.0.30"), netip.MustParseAddr("fd5e:b1b5::30")}
	d.tcp = state.ServicePort{Name: spn("ds", "t", state.TCP), Port: 80, ClusterIPs: cips}
	d.udp = state.ServicePort{Name: spn("ds", "u", state.UDP), Port: 53, ClusterIPs: cips}
	return d
}

// TestDualStackProxyPort: a service with IPv4 and IPv6 ClusterIPs gets one
// proxy port, open on both families, when the bind address is unspecified,
// and each family's clients go to that family's endpoints, as kube-proxy's
// proxier of each family sends them.
func TestDualStackProxyPort(t *testing.T) {
	d := newDualStack(t)
	p, tn, un := d.p, d.tcp.Name, d.udp.Name
	d.tcp.ClusterEndpoints = eps(d.t4.addr(), d.t6.addr())
	d.udp.ClusterEndpoints = eps(d.u6.addr(), d.u4.addr())
	mustApply(t, p, d.tcp, d.udp)
	for _, c := range []struct{ host, tcp, udp string }{{"127.0.0.1", "t4", "u4"}, {"[::1]", "t6", "u6"}} {
		// Round robin over both families would alternate.
		for range 3 {
			if got := tcpWho(t, fmt.Sprintf("%s:%d", c.host, p.ProxyPort(tn))); got != c.tcp {
				t.Fatalf("TCP via %s reached %q, want %q", c.host, got, c.tcp)
			}
			conn := dialUDP(t, fmt.Sprintf("%s:%d", c.host, p.ProxyPort(un)))
			got, err := udpExchange(t, conn, []byte("who"))
			conn.Close()
			if err != nil || string(got) != c.udp {
				t.Fatalf("UDP via %s: %q, %v; want %q", c.host, got, err, c.udp)
			}
		}
	}
	fams := listenIPs(p, tn)
	if !fams["0.0.0.0"] || !fams["::"] || len(fams) != 2 {
		t.Fatalf("TCP listeners on %v, want 0.0.0.0 and ::", fams)
	}
}

// TestDualStackFamilyWithoutEndpoints: a dual-stack service whose
// endpoints are all IPv4 refuses IPv6 clients (a reset, no UDP reply), as
// kube-proxy's IPv6 proxier does, rather than carry them to IPv4 pods;
// once an IPv6 endpoint comes, IPv6 clients reach it.
func TestDualStackFamilyWithoutEndpoints(t *testing.T) {
	d := newDualStack(t)
	p, tn, un := d.p, d.tcp.Name, d.udp.Name
	tsp, usp := d.tcp, d.udp
	tsp.ClusterEndpoints, usp.ClusterEndpoints = eps(d.t4.addr()), eps(d.u4.addr())
	mustApply(t, p, tsp, usp)
	v4t, v6t := fmt.Sprintf("127.0.0.1:%d", p.ProxyPort(tn)), fmt.Sprintf("[::1]:%d", p.ProxyPort(tn))
	v4u, v6u := fmt.Sprintf("127.0.0.1:%d", p.ProxyPort(un)), fmt.Sprintf("[::1]:%d", p.ProxyPort(un))

	if got := tcpWho(t, v4t); got != "t4" {
		t.Fatalf("TCP via IPv4 reached %q", got)
	}
	if err := connectAndRead(v6t); !isReset(err) {
		t.Fatalf("TCP via IPv6 without IPv6 endpoints: %v, want a reset", err)
	}
	// A reply on loopback takes well under a millisecond; wait 1 s for one
	// that must not come.
	conn := dialUDP(t, v6u)
	conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("who")); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(make([]byte, 16)); err == nil {
		t.Fatalf("UDP via IPv6 without IPv6 endpoints got %d bytes back", n)
	}
	conn.Close()

	tsp.ClusterEndpoints = eps(d.t4.addr(), d.t6.addr())
	usp.ClusterEndpoints = eps(d.u4.addr(), d.u6.addr())
	mustApply(t, p, tsp, usp)
	for _, c := range []struct{ tcp, udp, want string }{{v4t, v4u, "4"}, {v6t, v6u, "6"}} {
		if got := tcpWho(t, c.tcp); got != "t"+c.want {
			t.Fatalf("TCP via %s reached %q", c.tcp, got)
		}
		conn := dialUDP(t, c.udp)
		got, err := udpExchange(t, conn, []byte("who"))
		conn.Close()
		if err != nil || string(got) != "u"+c.want {
			t.Fatalf("UDP via %s: %q, %v", c.udp, got, err)
		}
	}
}

// TestIPv6EndpointsAndClients: an IPv6 service reaches IPv6 endpoints, and
// ClientIP affinity keys on the IPv6 client address the proxy read from
// accept.
func TestIPv6EndpointsAndClients(t *testing.T) {
	needIPv6Loopback(t)
	b1 := startTCPBackendOn(t, "b1", "[::1]:0")
	b2 := startTCPBackendOn(t, "b2", "[::1]:0")
	p := newTestProxier(t, Config{BindAddress: netip.IPv6Loopback()})
	name := spn("v6", "t", state.TCP)
	mustApply(t, p, state.ServicePort{
		Name: name, Port: 80,
		ClusterIPs:       []netip.Addr{netip.MustParseAddr("fd5e:b1b5::31")},
		ClusterEndpoints: eps(b1.addr(), b2.addr()),
		Affinity:         state.Affinity{Type: state.AffinityClientIP, Timeout: time.Hour},
	})
	addr := fmt.Sprintf("[::1]:%d", p.ProxyPort(name))
	first := tcpWho(t, addr)
	if first != "b1" && first != "b2" {
		t.Fatalf("reached %q", first)
	}
	for range 5 {
		if got := tcpWho(t, addr); got != first {
			t.Fatalf("affinity broken: %q then %q", first, got)
		}
	}
	p.mu.Lock()
	b := p.services[name].internal
	p.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.clients[netip.IPv6Loopback()]; !ok || len(b.clients) != 1 {
		t.Fatalf("affinity clients %v, want only ::1", b.clients)
	}
}

// TestIPFamiliesWithoutFrontends: a manifest Service without cluster IPs
// is served on the families of its spec.ipFamilies, so an IPv6-only one
// gets its proxy port on :: and not on 0.0.0.0; a change of families moves
// the listeners.
func TestIPFamiliesWithoutFrontends(t *testing.T) {
	needIPv6Loopback(t)
	b := startTCPBackendOn(t, "b6", "[::1]:0")
	p := newTestProxier(t, Config{BindAddress: netip.IPv4Unspecified()})
	name := spn("v6", "nofrontend", state.TCP)
	sp := state.ServicePort{Name: name, Port: 80, IPFamilies: []state.IPFamily{state.IPv6}, ClusterEndpoints: eps(b.addr())}
	mustApply(t, p, sp)
	if on := listenIPs(p, name); !on["::"] || len(on) != 1 {
		t.Fatalf("listening on %v, want :: alone", on)
	}
	if got := tcpWho(t, fmt.Sprintf("[::1]:%d", p.ProxyPort(name))); got != "b6" {
		t.Fatalf("reached %q", got)
	}

	b4 := startTCPBackend(t, "b4")
	sp.IPFamilies = []state.IPFamily{state.IPv6, state.IPv4}
	sp.ClusterEndpoints = eps(b.addr(), b4.addr())
	mustApply(t, p, sp)
	if on := listenIPs(p, name); !on["::"] || !on["0.0.0.0"] || len(on) != 2 {
		t.Fatalf("dual stack: listening on %v, want :: and 0.0.0.0", on)
	}
	if got := tcpWho(t, fmt.Sprintf("127.0.0.1:%d", p.ProxyPort(name))); got != "b4" {
		t.Fatalf("via IPv4 reached %q", got)
	}
}

// TestNodePortsKeepToTheirFamilies: with --nodeport-addresses matching
// host addresses of both families, a single-stack Service's node port is
// served on the addresses of its own family only, as without
// --nodeport-addresses (the wildcard of each of its families), and a
// dual-stack one on both.
func TestNodePortsKeepToTheirFamilies(t *testing.T) {
	needIPv6Loopback(t)
	p := newTestProxier(t, Config{ServeNodePorts: true,
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")},
		LocalAddrs: func() ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}, nil
		}})
	v4 := netip.MustParseAddr("198.18.0.1")
	v6 := netip.MustParseAddr("fd5e:b1b5::1")
	tests := map[string]struct {
		ips  []netip.Addr
		want []string
	}{
		"v4":   {[]netip.Addr{v4}, []string{"127.0.0.1"}},
		"v6":   {[]netip.Addr{v6}, []string{"::1"}},
		"dual": {[]netip.Addr{v4, v6}, []string{"127.0.0.1", "::1"}},
	}
	var ports []state.ServicePort
	for svc, tc := range tests {
		ports = append(ports, state.ServicePort{Name: spn(svc, "", state.TCP), Port: 80, NodePort: freePort(t), ClusterIPs: tc.ips})
	}
	mustApply(t, p, ports...)
	for svc, tc := range tests {
		var got []string
		for _, l := range p.Listeners() {
			if l.Service == spn(svc, "", state.TCP) && l.Role == "node-port" {
				got = append(got, l.Addr.Addr().String())
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: node port on %v, want %v", svc, got, tc.want)
		}
	}
}

// TestNodePortAddressesOfOneFamily: --nodeport-addresses with CIDRs of
// one family narrows that family's node ports only; the other family's
// are served on every address (its wildcard), as kube-proxy adds 0.0.0.0/0
// or ::/0 for a family none of the CIDRs is in.
func TestNodePortAddressesOfOneFamily(t *testing.T) {
	needIPv6Loopback(t)
	local := func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}, nil
	}
	tests := []struct {
		name  string
		cidrs []netip.Prefix
		want  []string
	}{
		{"IPv4 CIDR", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, []string{"127.0.0.1", "::"}},
		{"IPv6 CIDR", []netip.Prefix{netip.MustParsePrefix("::1/128")}, []string{"0.0.0.0", "::1"}},
		{"IPv4 CIDR matching nothing", []netip.Prefix{netip.MustParsePrefix("198.18.77.0/24")}, []string{"::"}},
		{"zero CIDR of IPv6", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::/0")}, []string{"127.0.0.1", "::"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestProxier(t, Config{ServeNodePorts: true, NodePortAddresses: tc.cidrs, LocalAddrs: local})
			name := spn("dual", "", state.TCP)
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: freePort(t),
				ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd5e:b1b5::1")}})
			var got []string
			for _, l := range p.Listeners() {
				if l.Service == name && l.Role == "node-port" {
					got = append(got, l.Addr.Addr().String())
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("node port on %v, want %v", got, tc.want)
			}
		})
	}
}

// listenIPs is the set of addresses name's listeners are bound to.
func listenIPs(p *Proxier, name state.ServicePortName) map[string]bool {
	on := map[string]bool{}
	for _, l := range p.Listeners() {
		if l.Service == name {
			on[l.Addr.Addr().String()] = true
		}
	}
	return on
}

// TestProxyPortMovesWhenTakenInANewFamily: a service port that gains an IP
// family whose half of its proxy port another program holds moves to a
// port free in both families, rather than retrying the taken one for ever.
func TestProxyPortMovesWhenTakenInANewFamily(t *testing.T) {
	needIPv6Loopback(t)
	b := startTCPBackendOn(t, "b6", "[::1]:0")
	p := newTestProxier(t, Config{BindAddress: netip.IPv4Unspecified()})
	name := spn("v6", "moves", state.TCP)
	sp := state.ServicePort{Name: name, Port: 80, IPFamilies: []state.IPFamily{state.IPv6}, ClusterEndpoints: eps(b.addr())}
	mustApply(t, p, sp)
	old := p.ProxyPort(name)
	squatter, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", old))
	switch {
	case err == nil:
		defer squatter.Close()
	case errors.Is(err, syscall.EADDRINUSE):
		// Another program's socket holds it already (the kernel chose the
		// port from the range it gives outgoing connections too), which
		// is just as good.
	default:
		t.Fatalf("hold the IPv4 half of proxy port %d: %v", old, err)
	}
	held, err := net.Dial("tcp6", fmt.Sprintf("[::1]:%d", old)) // open across the move
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// Wait for the greeting: the connection is then accepted, not only
	// queued (closing a listener resets what it has not accepted).
	r := bufio.NewReader(held)
	held.SetDeadline(time.Now().Add(5 * time.Second))
	if greeting, err := r.ReadString('\n'); err != nil || greeting != "b6\n" {
		t.Fatalf("connection before the move: %q, %v", greeting, err)
	}

	b4 := startTCPBackend(t, "b4")
	sp.IPFamilies = []state.IPFamily{state.IPv6, state.IPv4}
	sp.ClusterEndpoints = eps(b.addr(), b4.addr())
	mustApply(t, p, sp)
	moved := p.ProxyPort(name)
	if moved == old || moved == 0 {
		t.Fatalf("proxy port %d after the move, want another than %d", moved, old)
	}
	for addr, want := range map[string]string{fmt.Sprintf("127.0.0.1:%d", moved): "b4", fmt.Sprintf("[::1]:%d", moved): "b6"} {
		if got := tcpWho(t, addr); got != want {
			t.Fatalf("via %s reached %q, want %q", addr, got, want)
		}
	}
	if on := listenIPs(p, name); len(on) != 2 {
		t.Fatalf("listening on %v, want :: and 0.0.0.0 only", on)
	}
	expectClosedTCP(t, fmt.Sprintf("[::1]:%d", old))
	// The connection accepted on the old port still works.
	held.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(held, "still\n")
	if echo, err := r.ReadString('\n'); err != nil || echo != "still\n" {
		t.Fatalf("connection across the move: %q, %v", echo, err)
	}
}

// TestUnservedFrontendsAreNotListenedOn: with the frontends bound (the
// bind portal), the service addresses the portal leaves off the host (the
// IPv6 ones where IPv6 is turned off) are not listened on, and the
// others are served without a failure; when the portal serves them again
// the next Apply listens on them. Every Apply failed listening on them.
func TestUnservedFrontendsAreNotListenedOn(t *testing.T) {
	needIPv6Loopback(t)
	b, b6 := startTCPBackend(t, "be"), startTCPBackendOn(t, "be6", "[::1]:0")
	v4, v6, gone := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"), netip.MustParseAddr("fd5e:b1b5::20")
	unserved := map[netip.Addr]bool{v6: true, gone: true}
	p := newTestProxier(t, Config{ServeFrontends: true, DisableProxyPorts: true,
		UnservedFrontends: func() map[netip.Addr]bool { return unserved }})
	name := spn("ds", "", state.TCP)
	sp := state.ServicePort{Name: name, Port: freePort(t), ClusterIPs: []netip.Addr{v4, v6}, ExternalIPs: []netip.Addr{gone},
		ClusterEndpoints: eps(b.addr(), b6.addr())}
	listening := func() []string {
		var out []string
		for _, l := range p.Listeners() {
			out = append(out, l.Addr.String())
		}
		return out
	}
	at := func(ip netip.Addr) string { return netip.AddrPortFrom(ip, sp.Port).String() }

	if err := p.Apply(state.NewSnapshot([]state.ServicePort{sp})); err != nil {
		t.Fatalf("Apply with IPv6 frontends unserved: %v", err)
	}
	if got := listening(); !slices.Equal(got, []string{at(v4)}) {
		t.Fatalf("listening on %v, want only %s", got, at(v4))
	}
	if got := tcpWho(t, at(v4)); got != "be" {
		t.Fatalf("IPv4 frontend reached %q", got)
	}
	// The portal serves ::1 again (IPv6 turned back on).
	unserved = map[netip.Addr]bool{gone: true}
	mustApply(t, p, sp)
	if got := listening(); !slices.Equal(got, []string{at(v4), at(v6)}) {
		t.Fatalf("listening on %v, want %s and %s", got, at(v4), at(v6))
	}
	if got := tcpWho(t, at(v6)); got != "be6" {
		t.Fatalf("IPv6 frontend reached %q", got)
	}
}
