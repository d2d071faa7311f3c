package userspace

import (
	"bufio"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"runtime"
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
