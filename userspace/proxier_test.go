package userspace

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func TestMultiPortService(t *testing.T) {
	tb := startTCPBackend(t, "tcp")
	ub := startUDPBackend(t, "udp")
	p := newTestProxier(t, Config{})
	pn, qn := spn("multi", "p", state.TCP), spn("multi", "q", state.UDP)
	mustApply(t, p,
		state.ServicePort{Name: pn, Port: 80, ClusterEndpoints: eps(tb.addr())},
		state.ServicePort{Name: qn, Port: 53, ClusterEndpoints: eps(ub.addr())})
	if got := tcpWho(t, proxyAddr(t, p, pn)); got != "tcp" {
		t.Fatalf("port p reached %q", got)
	}
	if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, qn)), []byte("who")); err != nil || string(got) != "udp" {
		t.Fatalf("port q: %q, %v", got, err)
	}
	if p.ProxyPort(spn("multi", "x", state.TCP)) != 0 {
		t.Fatal("a port the service does not have got a proxy port")
	}
}

func TestProxyStopAndReAdd(t *testing.T) {
	for _, proto := range []state.Protocol{state.TCP, state.UDP} {
		t.Run(string(proto), func(t *testing.T) {
			tb, ub := startTCPBackend(t, "a"), startUDPBackend(t, "a")
			ep := tb.addr()
			if proto == state.UDP {
				ep = ub.addr()
			}
			p := newTestProxier(t, Config{})
			name := spn("svc", "", proto)
			svc := state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ep)}
			check := func(addr string) error {
				if proto == state.TCP {
					_, err := tcpWhoErr(addr)
					return err
				}
				_, err := udpExchangeTimeout(dialUDP(t, addr), []byte("who"), 2*time.Second)
				return err
			}
			mustApply(t, p, svc)
			addr := proxyAddr(t, p, name)
			if err := check(addr); err != nil {
				t.Fatal(err)
			}
			// Delete.
			mustApply(t, p)
			if p.ProxyPort(name) != 0 {
				t.Fatal("deleted service still has a proxy port")
			}
			if proto == state.TCP {
				expectClosedTCP(t, addr)
			} else if err := checkUDPClosed(addr); err != nil {
				t.Fatal(err)
			}
			// Re-add: served again.
			mustApply(t, p, svc)
			if err := check(proxyAddr(t, p, name)); err != nil {
				t.Fatalf("re-added service: %v", err)
			}
		})
	}
}

// checkUDPClosed expects ICMP port unreachable (ECONNREFUSED) from addr.
func checkUDPClosed(addr string) error {
	ua, _ := net.ResolveUDPAddr("udp4", addr)
	c, err := net.DialUDP("udp4", nil, ua)
	if err != nil {
		return err
	}
	defer c.Close()
	for range 3 {
		c.Write([]byte("x"))
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, err := c.Read(make([]byte, 10))
		if err != nil && strings.Contains(err.Error(), "refused") {
			return nil
		}
	}
	return fmt.Errorf("%s still answers", addr)
}

// TestEndpointUpdateKeepsListenerAndConnections: endpoint changes apply to
// new connections at once; the listener and a live connection are untouched.
func TestEndpointUpdateKeepsListenerAndConnections(t *testing.T) {
	a, b := startTCPBackend(t, "a"), startTCPBackend(t, "b")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(a.addr())})
	addr := proxyAddr(t, p, name)
	live, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	r := bufio.NewReader(live)
	if g, _ := r.ReadString('\n'); g != "a\n" {
		t.Fatalf("greeting %q", g)
	}
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(b.addr())})
	if proxyAddr(t, p, name) != addr {
		t.Fatal("an endpoint change moved the proxy port")
	}
	for range 3 {
		if got := tcpWho(t, addr); got != "b" {
			t.Fatalf("new connection after the update reached %q", got)
		}
	}
	live.Write([]byte("still\n"))
	live.SetReadDeadline(time.Now().Add(5 * time.Second))
	if e, err := r.ReadString('\n'); e != "still\n" {
		t.Fatalf("live connection after the update: %q, %v", e, err)
	}
}

// TestPortChangeReplacesOnlyThatListener: changing one service's port or
// frontends leaves other services' connections alone.
func TestPortChangeReplacesOnlyThatListener(t *testing.T) {
	a := startTCPBackend(t, "a")
	p := newTestProxier(t, loopbackNodePorts(Config{}))
	one, two := spn("one", "", state.TCP), spn("two", "", state.TCP)
	np1, np2 := freePort(t), freePort(t)
	svcOne := state.ServicePort{Name: one, Port: 80, NodePort: np1, ClusterEndpoints: eps(a.addr())}
	svcTwo := state.ServicePort{Name: two, Port: 80, ClusterEndpoints: eps(a.addr())}
	mustApply(t, p, svcOne, svcTwo)
	other, err := net.Dial("tcp", proxyAddr(t, p, two))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	r := bufio.NewReader(other)
	r.ReadString('\n')
	if got := tcpWho(t, fmt.Sprintf("127.0.0.1:%d", np1)); got != "a" {
		t.Fatalf("node port %d reached %q", np1, got)
	}
	svcOne.NodePort = np2
	svcOne.Port = 81
	mustApply(t, p, svcOne, svcTwo)
	expectClosedTCP(t, fmt.Sprintf("127.0.0.1:%d", np1))
	if got := tcpWho(t, fmt.Sprintf("127.0.0.1:%d", np2)); got != "a" {
		t.Fatalf("new node port %d reached %q", np2, got)
	}
	other.Write([]byte("alive\n"))
	other.SetReadDeadline(time.Now().Add(5 * time.Second))
	if e, err := r.ReadString('\n'); e != "alive\n" {
		t.Fatalf("other service's connection after the change: %q, %v", e, err)
	}
}

// freePortRun returns the first of n consecutive ports that are free for
// TCP and UDP, below the kernel's ephemeral range (see freePort).
func freePortRun(t *testing.T, n int) uint16 {
	t.Helper()
	free := func(port int) bool {
		ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return false
		}
		ln.Close()
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			return false
		}
		u.Close()
		return true
	}
	for range 200 {
		base := 20000 + rand.IntN(12000)
		ok := true
		for i := range n {
			ok = ok && free(base+i)
		}
		if ok {
			return uint16(base)
		}
	}
	t.Fatal("no run of free ports")
	return 0
}

// TestNodePortsAreNotProxyPorts: with a proxy port range that overlaps the
// node ports (a user's --proxy-port-range inside 30000-32767), no proxy
// port takes a node port, and a proxy port that a Service now asks for as
// its node port moves. A proxy port on a node port made it serve the
// wrong Service there.
func TestNodePortsAreNotProxyPorts(t *testing.T) {
	a, b := startTCPBackend(t, "a"), startTCPBackend(t, "b")
	base := freePortRun(t, 4)
	p := newTestProxier(t, loopbackNodePorts(Config{PortRange: PortRange{Base: base, Size: 4}}))
	sa, sb := spn("a", "", state.TCP), spn("b", "", state.TCP)

	// Two node ports in the range: the proxy ports get the other two.
	mustApply(t, p,
		state.ServicePort{Name: sa, Port: 80, NodePort: base, ClusterEndpoints: eps(a.addr())},
		state.ServicePort{Name: sb, Port: 80, NodePort: base + 1, ClusterEndpoints: eps(b.addr())})
	if got := []uint16{p.ProxyPort(sa), p.ProxyPort(sb)}; slices.Contains(got, base) || slices.Contains(got, base+1) {
		t.Fatalf("proxy ports %v take node ports %d and %d", got, base, base+1)
	}
	for port, want := range map[uint16]string{base: "a", base + 1: "b"} {
		if got := tcpWho(t, fmt.Sprintf("127.0.0.1:%d", port)); got != want {
			t.Fatalf("node port %d reached %q, want %q", port, got, want)
		}
	}

	// b's node port becomes a's proxy port: a's proxy port moves.
	taken := p.ProxyPort(sa)
	mustApply(t, p,
		state.ServicePort{Name: sa, Port: 80, ClusterEndpoints: eps(a.addr())},
		state.ServicePort{Name: sb, Port: 80, NodePort: taken, ClusterEndpoints: eps(b.addr())})
	if got := p.ProxyPort(sa); got == taken || !(PortRange{Base: base, Size: 4}).Contains(got) {
		t.Fatalf("a's proxy port is %d; want it moved off %d, within the range", got, taken)
	}
	if got := tcpWho(t, fmt.Sprintf("127.0.0.1:%d", taken)); got != "b" {
		t.Fatalf("node port %d reached %q, want b", taken, got)
	}
	if got := tcpWho(t, proxyAddr(t, p, sa)); got != "a" {
		t.Fatalf("a's new proxy port reached %q", got)
	}
}

// TestHealthCheckPortsAreNotProxyPorts: a health-check node port has a
// listener of its own whatever the portal, so no proxy port takes it, with
// iptables portals too (node ports not served by the proxier).
func TestHealthCheckPortsAreNotProxyPorts(t *testing.T) {
	a := startTCPBackend(t, "a")
	base := freePortRun(t, 3)
	name := spn("lb", "", state.TCP)
	for range 6 { // the allocator starts at a random port
		p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1"), PortRange: PortRange{Base: base, Size: 3}})
		err := p.Apply(state.NewSnapshot([]state.ServicePort{{Name: name, Port: 80, NodePort: 30080, ExternalLocal: true,
			HealthCheckNodePort: base, ClusterEndpoints: eps(a.addr())}}))
		got := []uint16{p.ProxyPort(name), p.ExternalProxyPort(name)}
		p.Close()
		if err != nil || slices.Contains(got, base) {
			t.Fatalf("proxy ports %v (%v); want neither on the health-check node port %d", got, err, base)
		}
	}
}

// TestNoExternalProxyPortNoExternalRedirect: a Service whose Local policy
// wants a proxy port of its own for external traffic, which the range
// cannot give, has no external proxy port at all: redirecting its node
// port to the proxy port would send outside clients to endpoints on other
// nodes.
func TestNoExternalProxyPortNoExternalRedirect(t *testing.T) {
	a := startTCPBackend(t, "a")
	base := freePort(t)
	p := newTestProxier(t, Config{PortRange: PortRange{Base: base, Size: 1}})
	name := spn("local", "", state.TCP)
	err := p.Apply(state.NewSnapshot([]state.ServicePort{{Name: name, Port: 80, NodePort: 30080, ExternalLocal: true,
		ClusterEndpoints: eps(a.addr())}}))
	if !errors.Is(err, ErrPortRangeExhausted) {
		t.Fatalf("two proxy ports from a one-port range: %v, want ErrPortRangeExhausted", err)
	}
	if pp, ext := p.ProxyPort(name), p.ExternalProxyPort(name); pp != base || ext != 0 {
		t.Errorf("proxy port %d, external proxy port %d; want %d and none", pp, ext, base)
	}
}

// TestNodePortSwap: two Services that swap node ports in one change are
// both served at once; the second was refused its new port until the next
// retry, because the first still held it.
func TestNodePortSwap(t *testing.T) {
	a, b := startTCPBackend(t, "a"), startTCPBackend(t, "b")
	p := newTestProxier(t, loopbackNodePorts(Config{}))
	sa, sb := spn("a", "", state.TCP), spn("b", "", state.TCP)
	x, y := freePort(t), freePort(t)
	for _, ports := range [][2]uint16{{x, y}, {y, x}} {
		mustApply(t, p,
			state.ServicePort{Name: sa, Port: 80, NodePort: ports[0], ClusterEndpoints: eps(a.addr())},
			state.ServicePort{Name: sb, Port: 80, NodePort: ports[1], ClusterEndpoints: eps(b.addr())})
		for port, want := range map[uint16]string{ports[0]: "a", ports[1]: "b"} {
			if got := tcpWho(t, fmt.Sprintf("127.0.0.1:%d", port)); got != want {
				t.Fatalf("node port %d reached %q, want %q", port, got, want)
			}
		}
	}
}

// loopbackNodePorts sets cfg to serve node ports itself on 127.0.0.1, a
// host whose only address that is.
func loopbackNodePorts(cfg Config) Config {
	cfg.ServeNodePorts = true
	cfg.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	cfg.LocalAddrs = func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil }
	return cfg
}

func TestNodePortServedDirectly(t *testing.T) {
	tb, ub := startTCPBackend(t, "t"), startUDPBackend(t, "u")
	p := newTestProxier(t, Config{ServeNodePorts: true, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		LocalAddrs: func() ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.255.255.1")}, nil
		}})
	np := freePort(t)
	mustApply(t, p,
		state.ServicePort{Name: spn("np", "t", state.TCP), Port: 80, NodePort: np, ClusterEndpoints: eps(tb.addr())},
		state.ServicePort{Name: spn("np", "u", state.UDP), Port: 80, NodePort: np, ClusterEndpoints: eps(ub.addr())})
	addr := fmt.Sprintf("127.0.0.1:%d", np)
	if got := tcpWho(t, addr); got != "t" {
		t.Fatalf("TCP node port reached %q", got)
	}
	if got, err := udpExchange(t, dialUDP(t, addr), []byte("who")); err != nil || string(got) != "u" {
		t.Fatalf("UDP node port: %q, %v", got, err)
	}
	var roles []string
	for _, l := range p.Listeners() {
		roles = append(roles, l.Addr.String()+"/"+l.Role)
	}
	want := fmt.Sprintf("127.0.0.1:%d/node-port", np)
	if n := strings.Count(strings.Join(roles, " "), want); n != 2 {
		t.Fatalf("listeners %v: want %s for TCP and UDP only (10.255.255.1 is outside --nodeport-addresses)", roles, want)
	}
}

// TestExternalTrafficPolicyLocal: node-port traffic uses the local
// endpoints, proxy-port (cluster) traffic the cluster set. The external
// clients come from 127.0.0.2, which the test's host does not have; a
// client on one of the host's own addresses (127.0.0.1) gets the cluster
// endpoints on the node port too, as kube-proxy routes such traffic (see
// TestExternalTrafficFromTheHost).
func TestExternalTrafficPolicyLocal(t *testing.T) {
	local, remote := startTCPBackend(t, "local"), startTCPBackend(t, "remote")
	p := newTestProxier(t, loopbackNodePorts(Config{}))
	np := freePort(t)
	name := spn("etp", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: np, ExternalLocal: true,
		ClusterEndpoints: eps(local.addr(), remote.addr()), LocalEndpoints: eps(local.addr())})
	for range 4 {
		if got := tcpWhoFrom(t, outsider, fmt.Sprintf("127.0.0.1:%d", np)); got != "local" {
			t.Fatalf("node port with eTP=Local reached %q", got)
		}
	}
	seen := map[string]bool{}
	for range 4 {
		seen[tcpWhoFrom(t, outsider, proxyAddr(t, p, name))] = true
	}
	if !seen["remote"] {
		t.Fatalf("cluster traffic only reached %v", seen)
	}
	// Redirected external traffic has a proxy port of its own.
	ext := p.ExternalProxyPort(name)
	if ext == 0 || ext == p.ProxyPort(name) {
		t.Fatalf("external proxy port %d, proxy port %d: want a separate one", ext, p.ProxyPort(name))
	}
	for range 4 {
		if got := tcpWhoFrom(t, outsider, fmt.Sprintf("127.0.0.1:%d", ext)); got != "local" {
			t.Fatalf("external proxy port with eTP=Local reached %q", got)
		}
	}
	// Back to Cluster: the separate port goes away.
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: np,
		ClusterEndpoints: eps(local.addr(), remote.addr()), LocalEndpoints: eps(local.addr())})
	if got := p.ExternalProxyPort(name); got != p.ProxyPort(name) {
		t.Fatalf("with no Local policy the external proxy port is %d, want the proxy port %d", got, p.ProxyPort(name))
	}
	expectClosedTCP(t, fmt.Sprintf("127.0.0.1:%d", ext))
}

// outsider is a client address the test host of TestExternalTrafficPolicyLocal
// and TestExternalTrafficFromTheHost does not have.
var outsider = netip.MustParseAddr("127.0.0.2")

// TestExternalTrafficFromTheHost: external traffic that starts on this
// host (its source is one of the host's addresses) goes to the cluster
// endpoints even with externalTrafficPolicy: Local, as kube-proxy routes
// it, so the node is not cut off from its own Service when it has no
// endpoint of it. With internalTrafficPolicy: Local as well, cluster
// traffic stays local, and the host's external traffic still uses every
// endpoint. The legacy answer was a reset for a node without endpoints.
func TestExternalTrafficFromTheHost(t *testing.T) {
	local, remote := startTCPBackend(t, "local"), startTCPBackend(t, "remote")
	p := newTestProxier(t, loopbackNodePorts(Config{}))
	np := freePort(t)
	name := spn("etp", "", state.TCP)
	host := netip.MustParseAddr("127.0.0.1")
	reached := func(from netip.Addr, addr string) map[string]int {
		seen := map[string]int{}
		for range 6 {
			seen[tcpWhoFrom(t, from, addr)]++
		}
		return seen
	}
	nodePort := fmt.Sprintf("127.0.0.1:%d", np)
	for _, internalLocal := range []bool{false, true} {
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: np, ExternalLocal: true, InternalLocal: internalLocal,
			ClusterEndpoints: eps(local.addr(), remote.addr()), LocalEndpoints: eps(local.addr())})
		if got := reached(host, nodePort); got["local"] != 3 || got["remote"] != 3 {
			t.Fatalf("iTP Local %v: the host's own node-port traffic reached %v; want both endpoints, round robin", internalLocal, got)
		}
		if got := reached(outsider, nodePort); got["local"] != 6 {
			t.Fatalf("iTP Local %v: outside node-port traffic reached %v; want the local endpoint only", internalLocal, got)
		}
		// The same through the external proxy port, where the iptables
		// portal redirects node-port traffic.
		extPort := fmt.Sprintf("127.0.0.1:%d", p.ExternalProxyPort(name))
		if got := reached(host, extPort); got["local"] != 3 || got["remote"] != 3 {
			t.Fatalf("iTP Local %v: the host's own redirected node-port traffic reached %v; want both endpoints, round robin", internalLocal, got)
		}
		if got := reached(outsider, extPort); got["local"] != 6 {
			t.Fatalf("iTP Local %v: outside redirected node-port traffic reached %v; want the local endpoint only", internalLocal, got)
		}
		wantCluster := map[bool]int{false: 3, true: 6}[internalLocal]
		if got := reached(host, proxyAddr(t, p, name)); got["local"] != wantCluster {
			t.Fatalf("iTP Local %v: cluster traffic reached %v", internalLocal, got)
		}
	}
	// No local endpoint: the node's own traffic is still served.
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: np, ExternalLocal: true,
		ClusterEndpoints: eps(remote.addr())})
	if got := tcpWhoFrom(t, host, nodePort); got != "remote" {
		t.Fatalf("the host's own node-port traffic with no local endpoint reached %q", got)
	}
	if _, err := tcpWhoFromErr(outsider, nodePort); err == nil {
		t.Fatal("outside node-port traffic with no local endpoint was served")
	}
}

// TestExternalTrafficFromPods: with ClusterCIDRs (--cluster-cidr), a
// pod's traffic to a node port of an externalTrafficPolicy: Local Service
// goes to all its endpoints, as kube-proxy's "pod traffic for external
// destinations" rule sends it; traffic from outside the cluster still gets
// the local endpoints only, and so would the pod's without ClusterCIDRs.
func TestExternalTrafficFromPods(t *testing.T) {
	local, remote := startTCPBackend(t, "local"), startTCPBackend(t, "remote")
	pod := netip.MustParseAddr("127.0.0.3")
	np := freePort(t)
	name := spn("etp", "", state.TCP)
	nodePort := fmt.Sprintf("127.0.0.1:%d", np)
	for _, cidrs := range [][]netip.Prefix{nil, {netip.MustParsePrefix("127.0.0.3/32"), netip.MustParsePrefix("fd5e:b1b5:10::/64")}} {
		p := newTestProxier(t, loopbackNodePorts(Config{ClusterCIDRs: cidrs}))
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: np, ExternalLocal: true,
			ClusterEndpoints: eps(local.addr(), remote.addr()), LocalEndpoints: eps(local.addr())})
		seen := map[string]int{}
		for range 6 {
			seen[tcpWhoFrom(t, pod, nodePort)]++
		}
		want := map[string]int{"local": 6}
		if cidrs != nil {
			want = map[string]int{"local": 3, "remote": 3}
		}
		if !maps.Equal(seen, want) {
			t.Errorf("ClusterCIDRs %v: the pod's node-port traffic reached %v, want %v", cidrs, seen, want)
		}
		if got := tcpWhoFrom(t, outsider, nodePort); got != "local" {
			t.Errorf("ClusterCIDRs %v: outside traffic reached %q, want local", cidrs, got)
		}
		p.Close()
	}
}

// tcpWhoFrom is tcpWho from a client bound to address from.
func tcpWhoFrom(t testing.TB, from netip.Addr, addr string) string {
	t.Helper()
	name, err := tcpWhoFromErr(from, addr)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func tcpWhoFromErr(from netip.Addr, addr string) (string, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: 5 * time.Second}
	return tcpWhoDial(func() (net.Conn, error) { return d.Dial("tcp", addr) }, addr)
}

func TestApplyReportsFailuresAndServesTheRest(t *testing.T) {
	a := startTCPBackend(t, "a")
	// Take a port so the node port cannot be opened.
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := uint16(busy.Addr().(*net.TCPAddr).Port)
	p := newTestProxier(t, loopbackNodePorts(Config{}))
	bad, good := spn("bad", "", state.TCP), spn("good", "", state.TCP)
	err = p.Apply(state.NewSnapshot([]state.ServicePort{
		{Name: bad, Port: 80, NodePort: busyPort, ClusterEndpoints: eps(a.addr())},
		{Name: good, Port: 80, ClusterEndpoints: eps(a.addr())},
	}))
	if err == nil || !strings.Contains(err.Error(), "test/bad") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Apply error = %v; want it to name test/bad and the busy port", err)
	}
	if got := tcpWho(t, proxyAddr(t, p, good)); got != "a" {
		t.Fatalf("good service reached %q", got)
	}
	if got := tcpWho(t, proxyAddr(t, p, bad)); got != "a" {
		t.Fatalf("bad service's proxy port reached %q", got)
	}
	// Free the port: the next Apply retries and serves it.
	busy.Close()
	if err := p.Apply(state.NewSnapshot([]state.ServicePort{
		{Name: bad, Port: 80, NodePort: busyPort, ClusterEndpoints: eps(a.addr())},
		{Name: good, Port: 80, ClusterEndpoints: eps(a.addr())},
	})); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := tcpWho(t, fmt.Sprintf("127.0.0.1:%d", busyPort)); got != "a" {
		t.Fatalf("node port after retry reached %q", got)
	}
}

func TestPortRangeUsed(t *testing.T) {
	a := startTCPBackend(t, "a")
	base := freePort(t)
	p := newTestProxier(t, Config{PortRange: PortRange{Base: base, Size: 1}})
	one, two := spn("one", "", state.TCP), spn("two", "", state.TCP)
	err := p.Apply(state.NewSnapshot([]state.ServicePort{
		{Name: one, Port: 80, ClusterEndpoints: eps(a.addr())},
		{Name: two, Port: 80, ClusterEndpoints: eps(a.addr())},
	}))
	if !errors.Is(err, ErrPortRangeExhausted) {
		t.Fatalf("two services in a one-port range: %v, want ErrPortRangeExhausted", err)
	}
	got := p.ProxyPort(one) + p.ProxyPort(two)
	if got != base {
		t.Fatalf("proxy ports %d and %d; want one of them on %d", p.ProxyPort(one), p.ProxyPort(two), base)
	}
}

func TestCloseStopsEverything(t *testing.T) {
	a := startTCPBackend(t, "a")
	u := startUDPBackend(t, "u")
	base := runtime.NumGoroutine()
	p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1")})
	tn, un := spn("t", "", state.TCP), spn("u", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: tn, Port: 80, ClusterEndpoints: eps(a.addr())},
		state.ServicePort{Name: un, Port: 80, ClusterEndpoints: eps(u.addr())})
	taddr := proxyAddr(t, p, tn)
	c, err := net.Dial("tcp", taddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bufio.NewReader(c).ReadString('\n') // the connection is proxied now
	if _, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, un)), []byte("x")); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	p.Close() // idempotent
	expectClosedTCP(t, taddr)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("proxied connection survived Close")
	}
	settle(t, "goroutines after Close", func() error {
		if g := runtime.NumGoroutine(); g > base {
			return fmt.Errorf("%d goroutines, %d before", g, base)
		}
		return nil
	})
	if err := p.Apply(state.NewSnapshot(nil)); err == nil {
		t.Fatal("Apply after Close succeeded")
	}
}

// TestUnsupportedProtocolIsSkipped: where the kernel has no SCTP, an SCTP
// port is reported and skipped; Apply succeeds and the other ports are
// served.
func TestUnsupportedProtocolIsSkipped(t *testing.T) {
	if sctpAvailable() == nil {
		t.Skip("this kernel has SCTP; sctp_linux_test.go covers serving it")
	}
	a := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	tn, sn := spn("mixed", "t", state.TCP), spn("mixed", "s", state.SCTP)
	for range 2 {
		mustApply(t, p,
			state.ServicePort{Name: tn, Port: 80, ClusterEndpoints: eps(a.addr())},
			state.ServicePort{Name: sn, Port: 80, ClusterEndpoints: eps(a.addr())})
	}
	if p.ProxyPort(sn) != 0 {
		t.Fatal("an SCTP port got a proxy port")
	}
	if got := tcpWho(t, proxyAddr(t, p, tn)); got != "a" {
		t.Fatalf("TCP port beside the SCTP one reached %q", got)
	}
}

// TestPreferredProxyPorts: a restarted proxy takes the proxy ports the
// previous run used, when they are free.
func TestPreferredProxyPorts(t *testing.T) {
	a := startTCPBackend(t, "a")
	want := freePort(t)
	name := spn("keep", "", state.TCP)
	p := newTestProxier(t, Config{PreferredProxyPort: func(sp *state.ServicePort, external bool) uint16 {
		n := sp.Name
		if n == name && !external {
			return want
		}
		return 0
	}})
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(a.addr())})
	if got := p.ProxyPort(name); got != want {
		t.Fatalf("proxy port %d, want the previous one, %d", got, want)
	}
	if got := tcpWho(t, proxyAddr(t, p, name)); got != "a" {
		t.Fatalf("reached %q", got)
	}
	// Taken by someone else: another port, no error.
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	want = uint16(busy.Addr().(*net.TCPAddr).Port)
	other := spn("other", "", state.TCP)
	p2 := newTestProxier(t, Config{PreferredProxyPort: func(*state.ServicePort, bool) uint16 { return want }})
	mustApply(t, p2, state.ServicePort{Name: other, Port: 80, ClusterEndpoints: eps(a.addr())})
	if got := p2.ProxyPort(other); got == 0 || got == want {
		t.Fatalf("proxy port %d with the preferred %d busy", got, want)
	}
}

// TestReleasedProxyPortsAreHeld: with HoldReleasedPorts (a redirecting
// portal), a proxy port one service port gave up, or that a previous run's
// rules point at for another, goes to no other service port until the
// portal has synced: Apply leaves the newcomer waiting, without an error,
// and PortalSynced says to apply again, which then gives it the port.
// Without HoldReleasedPorts the port changes hands at once.
func TestReleasedProxyPortsAreHeld(t *testing.T) {
	a := startTCPBackend(t, "a")
	base := freePort(t)
	one, two := spn("one", "", state.TCP), spn("two", "", state.TCP)
	svc := func(n state.ServicePortName) state.ServicePort {
		return state.ServicePort{Name: n, Port: 80, ClusterEndpoints: eps(a.addr())}
	}
	handOver := func(t *testing.T, p *Proxier) {
		t.Helper()
		mustApply(t, p, svc(two))
		if got := p.ProxyPort(two); got != 0 {
			t.Fatalf("service port two took proxy port %d before the portal synced", got)
		}
		if !p.PortalSynced() {
			t.Fatal("PortalSynced does not say a service port waits")
		}
		mustApply(t, p, svc(two))
		if got := p.ProxyPort(two); got != base {
			t.Fatalf("after the portal synced, proxy port %d, want %d", got, base)
		}
		if p.PortalSynced() {
			t.Error("PortalSynced says a service port still waits")
		}
		if got := tcpWho(t, proxyAddr(t, p, two)); got != "a" {
			t.Errorf("reached %q", got)
		}
	}
	t.Run("released at a sync", func(t *testing.T) {
		p := newTestProxier(t, Config{PortRange: PortRange{Base: base, Size: 1}, HoldReleasedPorts: true})
		mustApply(t, p, svc(one))
		if got := p.ProxyPort(one); got != base {
			t.Fatalf("proxy port %d, want %d", got, base)
		}
		p.PortalSynced()
		handOver(t, p)
	})
	t.Run("a previous run's", func(t *testing.T) {
		p := newTestProxier(t, Config{PortRange: PortRange{Base: base, Size: 1}, HoldReleasedPorts: true,
			PreviousProxyPorts: map[uint16]state.ServicePortName{base: one}})
		handOver(t, p)
	})
	t.Run("its owner takes it back at once", func(t *testing.T) {
		p := newTestProxier(t, Config{PortRange: PortRange{Base: base, Size: 1}, HoldReleasedPorts: true,
			PreviousProxyPorts: map[uint16]state.ServicePortName{base: one}})
		mustApply(t, p, svc(one))
		if got := p.ProxyPort(one); got != base || p.PortalSynced() {
			t.Fatalf("proxy port %d, want %d at once", got, base)
		}
	})
	t.Run("without HoldReleasedPorts", func(t *testing.T) {
		p := newTestProxier(t, Config{PortRange: PortRange{Base: base, Size: 1}})
		mustApply(t, p, svc(one))
		mustApply(t, p, svc(two))
		if got := p.ProxyPort(two); got != base {
			t.Fatalf("proxy port %d, want %d at once", got, base)
		}
	})
}

// TestReleasedProxyPortServesUntilPortalSynced: with HoldReleasedPorts, a
// proxy-port socket that Apply gives up serves on, as before, until the
// portal no longer redirects to it, whose rules still send clients there
// meanwhile: the socket of a service port that is removed (a renamed
// port's, whose new service port waits for the rules), and the external
// proxy port of a Service whose externalTrafficPolicy goes from Local to
// Cluster. PortalSynced closes it, and Close; a failed sync does not
// call it, as the rules of the last one that worked still redirect. A removed service port's
// balancers keep their endpoints until then. Without HoldReleasedPorts
// it closes at Apply.
func TestReleasedProxyPortServesUntilPortalSynced(t *testing.T) {
	a, u := startTCPBackend(t, "a"), startUDPBackend(t, "u")
	tcpSvc := func(n state.ServicePortName) state.ServicePort {
		return state.ServicePort{Name: n, Port: 80, ClusterEndpoints: eps(a.addr())}
	}
	udpSvc := func(n state.ServicePortName) state.ServicePort {
		return state.ServicePort{Name: n, Port: 53, ClusterEndpoints: eps(u.addr())}
	}
	httpPort, webPort := spn("ren", "http", state.TCP), spn("ren", "web", state.TCP)
	dnsPort, domainPort := spn("ren", "dns", state.UDP), spn("ren", "domain", state.UDP)
	// Each way of giving sockets up returns the TCP and UDP addresses
	// given up, and the balancers that empty once they close (if any).
	type givenUp struct {
		tcp, udp string
		drained  []*balancer
	}
	renamed := func(t *testing.T, p *Proxier) givenUp {
		mustApply(t, p, tcpSvc(httpPort), udpSvc(dnsPort))
		g := givenUp{tcp: proxyAddr(t, p, httpPort), udp: proxyAddr(t, p, dnsPort)}
		p.PortalSynced()
		p.mu.Lock()
		g.drained = []*balancer{p.services[httpPort].internal, p.services[dnsPort].internal}
		p.mu.Unlock()
		mustApply(t, p, tcpSvc(webPort), udpSvc(domainPort))
		return g
	}
	etpT, etpU := spn("etp", "http", state.TCP), spn("etp", "dns", state.UDP)
	localToCluster := func(t *testing.T, p *Proxier) givenUp {
		tcp, udp := tcpSvc(etpT), udpSvc(etpU)
		tcp.NodePort, udp.NodePort = 30080, 30053
		for _, sp := range []*state.ServicePort{&tcp, &udp} {
			sp.ExternalLocal, sp.LocalEndpoints = true, sp.ClusterEndpoints
		}
		mustApply(t, p, tcp, udp)
		g := givenUp{tcp: fmt.Sprintf("127.0.0.1:%d", p.ExternalProxyPort(etpT)), udp: fmt.Sprintf("127.0.0.1:%d", p.ExternalProxyPort(etpU))}
		if g.tcp == proxyAddr(t, p, etpT) || g.udp == proxyAddr(t, p, etpU) {
			t.Fatal("externalTrafficPolicy Local: no external proxy port of its own")
		}
		p.PortalSynced()
		tcp.ExternalLocal, udp.ExternalLocal = false, false
		mustApply(t, p, tcp, udp)
		return g
	}
	serves := func(t *testing.T, g givenUp) {
		t.Helper()
		if got, err := tcpWhoErr(g.tcp); err != nil || got != "a" {
			t.Fatalf("TCP to %s, given up, before the portal synced: %q, %v; want served", g.tcp, got, err)
		}
		if got, err := udpExchange(t, dialUDP(t, g.udp), []byte("who")); err != nil || string(got) != "u" {
			t.Fatalf("UDP to %s, given up, before the portal synced: %q, %v; want served", g.udp, got, err)
		}
		for _, b := range g.drained {
			if !b.has(a.addr()) && !b.has(u.addr()) {
				t.Fatal("a removed service port's balancer emptied before its sockets closed")
			}
		}
	}
	closed := func(t *testing.T, g givenUp) {
		t.Helper()
		expectClosedTCP(t, g.tcp)
		if got, err := udpExchangeTimeout(dialUDP(t, g.udp), []byte("who"), time.Second); err == nil {
			t.Fatalf("UDP to %s answered %q after its socket was to close", g.udp, got)
		}
		for _, b := range g.drained {
			if b.has(a.addr()) || b.has(u.addr()) {
				t.Fatal("a removed service port's balancer keeps its endpoints after its sockets closed")
			}
		}
	}
	for _, way := range []struct {
		name   string
		giveUp func(*testing.T, *Proxier) givenUp
	}{
		{"service port renamed", renamed},
		{"externalTrafficPolicy Local to Cluster", localToCluster},
	} {
		t.Run(way.name, func(t *testing.T) {
			for _, end := range []struct {
				name  string
				close func(*Proxier)
			}{
				{"PortalSynced", func(p *Proxier) { p.PortalSynced() }},
				{"Close", func(p *Proxier) { p.Close() }},
			} {
				t.Run(end.name, func(t *testing.T) {
					p := newTestProxier(t, Config{HoldReleasedPorts: true, UDPIdleTimeout: time.Minute})
					g := way.giveUp(t, p)
					serves(t, g)
					serves(t, g) // again: Apply alone closes nothing
					if n := givenUpListeners(p); n != 2 {
						t.Errorf("%d listeners said to be given up, want 2 (TCP and UDP)", n)
					}
					end.close(p)
					closed(t, g)
					if n := givenUpListeners(p); n != 0 {
						t.Errorf("%d listeners said to be given up once closed, want 0", n)
					}
				})
			}
			t.Run("without HoldReleasedPorts", func(t *testing.T) {
				p := newTestProxier(t, Config{UDPIdleTimeout: time.Minute})
				closed(t, way.giveUp(t, p))
			})
		})
	}
	// An externalTrafficPolicy flipped back to Local before the portal
	// synced takes back the external proxy port it gave up, whose
	// sockets, still open, would otherwise keep it from its previous
	// port (the one the portal's rules still point at).
	t.Run("taken back before the portal synced", func(t *testing.T) {
		var ext uint16
		p := newTestProxier(t, Config{HoldReleasedPorts: true,
			PreferredProxyPort: func(_ *state.ServicePort, external bool) uint16 {
				if external {
					return ext
				}
				return 0
			}})
		svc := tcpSvc(etpT)
		svc.NodePort, svc.ExternalLocal, svc.LocalEndpoints = 30081, true, svc.ClusterEndpoints
		mustApply(t, p, svc)
		ext = p.ExternalProxyPort(etpT)
		p.PortalSynced()
		svc.ExternalLocal = false
		mustApply(t, p, svc)
		svc.ExternalLocal = true
		mustApply(t, p, svc)
		if got := p.ExternalProxyPort(etpT); got != ext {
			t.Fatalf("external proxy port %d after flipping back, want %d again", got, ext)
		}
		p.PortalSynced()
		if got := tcpWho(t, fmt.Sprintf("127.0.0.1:%d", ext)); got != "a" {
			t.Fatalf("the external proxy port taken back reached %q", got)
		}
	})
	// However long the portal goes without syncing, at most maxReleased
	// sockets wait for it: the oldest close.
	t.Run("bounded", func(t *testing.T) {
		p := newTestProxier(t, Config{HoldReleasedPorts: true})
		var first, last string
		for i := range maxReleased + 1 {
			name := spn("many", fmt.Sprint("p", i), state.TCP)
			mustApply(t, p, tcpSvc(name))
			if i == 0 {
				first = proxyAddr(t, p, name)
			}
			last = proxyAddr(t, p, name)
		}
		mustApply(t, p)
		expectClosedTCP(t, first)
		if got := tcpWho(t, last); got != "a" {
			t.Fatalf("the newest socket given up reached %q", got)
		}
	})
	// A proxy port a Service now has as its health-check node port
	// closes at once: that node port is to listen at this sync.
	t.Run("now a node port", func(t *testing.T) {
		p := newTestProxier(t, Config{HoldReleasedPorts: true})
		svc := tcpSvc(httpPort)
		mustApply(t, p, svc)
		port := p.ProxyPort(httpPort)
		svc.HealthCheckNodePort = port
		mustApply(t, p, svc)
		if got := p.ProxyPort(httpPort); got == 0 || got == port {
			t.Fatalf("proxy port %d, want another than %d", got, port)
		}
		expectClosedTCP(t, fmt.Sprintf("127.0.0.1:%d", port))
	})
}

// givenUpListeners counts the listeners p says it gave up and keeps open
// until the portal syncs.
func givenUpListeners(p *Proxier) int {
	n := 0
	for _, l := range p.Listeners() {
		if strings.HasSuffix(l.Role, givenUpRole) {
			n++
		}
	}
	return n
}

// TestInternalLocalAloneOpensNoExternalPort: a ClusterIP Service with
// internalTrafficPolicy: Local has no external traffic, so it gets no
// external proxy port (one would balance over every endpoint, round the
// policy); the same Service with a node port gets one.
func TestInternalLocalAloneOpensNoExternalPort(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, loopbackNodePorts(Config{}))
	name := spn("web", "", state.TCP)
	sp := state.ServicePort{Name: name, Port: 80, InternalLocal: true,
		ClusterEndpoints: eps(be.addr()), LocalEndpoints: nil}
	roles := func() map[string]int {
		got := map[string]int{}
		for _, l := range p.Listeners() {
			got[l.Role]++
		}
		return got
	}
	mustApply(t, p, sp)
	if got := roles(); got["external-proxy-port"] != 0 || got["proxy-port"] == 0 {
		t.Fatalf("ClusterIP Service with internalTrafficPolicy Local: listeners %v, want a proxy port and no external one", got)
	}
	sp.NodePort = freePort(t)
	mustApply(t, p, sp)
	if got := roles(); got["external-proxy-port"] == 0 {
		t.Fatalf("with a node port: listeners %v, want an external proxy port too", got)
	}
}

// TestActivity: each service port counts the connections and UDP
// sessions it carried, and those open now.
func TestActivity(t *testing.T) {
	tb, ub := startTCPBackend(t, "t"), startUDPBackend(t, "u")
	p := newTestProxier(t, Config{UDPIdleTimeout: time.Minute}) // sessions stay open for the count
	tn, un := spn("act", "t", state.TCP), spn("act", "u", state.UDP)
	mustApply(t, p,
		state.ServicePort{Name: tn, Port: 80, ClusterEndpoints: eps(tb.addr())},
		state.ServicePort{Name: un, Port: 53, ClusterEndpoints: eps(ub.addr())})
	for range 3 {
		tcpWho(t, proxyAddr(t, p, tn))
	}
	held, err := net.Dial("tcp", proxyAddr(t, p, tn))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for range 2 {
		if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, un)), []byte("who")); err != nil || string(got) != "u" {
			t.Fatalf("UDP: %q, %v", got, err)
		}
	}
	settle(t, "activity", func() error {
		a := p.Activity()
		want := map[state.ServicePortName]Activity{
			tn: {Connections: 4, OpenConnections: 1},
			un: {UDPSessions: 2, OpenUDPSessions: 2},
		}
		if !maps.Equal(a, want) {
			return fmt.Errorf("activity %+v, want %+v", a, want)
		}
		return nil
	})
}
