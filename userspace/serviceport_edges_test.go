package userspace

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// Edge cases of a service port's sockets and balancers (serviceport.go)
// that the broader tests leave open.

// TestInternalLocalExternalCluster: with internalTrafficPolicy: Local and
// externalTrafficPolicy: Cluster, cluster traffic (proxy port, ClusterIP
// bound directly) keeps to this node's endpoint, while external traffic
// (node port, external proxy port, external IP bound directly) goes to
// every endpoint. The clients come from outsider, not one of the host's
// addresses.
func TestInternalLocalExternalCluster(t *testing.T) {
	local, remote := startTCPBackend(t, "local"), startTCPBackend(t, "remote")
	const clusterIP, externalIP = "127.0.0.4", "127.0.0.5"
	port := freePort(t, clusterIP, externalIP)
	np := freePort(t)
	cfg := loopbackNodePorts(Config{ServeFrontends: true})
	p := newTestProxier(t, cfg)
	name := spn("itp", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: port, NodePort: np, InternalLocal: true,
		ClusterIPs:       []netip.Addr{netip.MustParseAddr(clusterIP)},
		ExternalIPs:      []netip.Addr{netip.MustParseAddr(externalIP)},
		ClusterEndpoints: eps(local.addr(), remote.addr()), LocalEndpoints: eps(local.addr())})
	ext := p.ExternalProxyPort(name)
	if ext == 0 || ext == p.ProxyPort(name) {
		t.Fatalf("external proxy port %d, proxy port %d: want one of its own", ext, p.ProxyPort(name))
	}
	reached := func(addr string) map[string]int {
		seen := map[string]int{}
		for range 4 {
			seen[tcpWhoFrom(t, outsider, addr)]++
		}
		return seen
	}
	at := func(ip string, port uint16) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }
	for what, addr := range map[string]string{
		"proxy port": proxyAddr(t, p, name),
		"ClusterIP":  at(clusterIP, port),
	} {
		if got := reached(addr); got["local"] != 4 {
			t.Errorf("cluster traffic to the %s reached %v; want the local endpoint only", what, got)
		}
	}
	for what, addr := range map[string]string{
		"node port":           at("127.0.0.1", np),
		"external proxy port": fmt.Sprintf("127.0.0.1:%d", ext),
		"external IP":         at(externalIP, port),
	} {
		if got := reached(addr); got["local"] != 2 || got["remote"] != 2 {
			t.Errorf("external traffic to the %s reached %v; want every endpoint, round robin", what, got)
		}
	}
}

// TestExternalPolicyLocalToClusterFromTheHost: with internalTrafficPolicy:
// Local, the host's own node-port traffic under externalTrafficPolicy:
// Local has a balancer of its own over the cluster endpoints. Once the
// external policy goes back to Cluster, that traffic uses the external
// balancer and follows the endpoints; the host's balancer is dropped, not
// left to send it to endpoints that are gone. Another
// Service keeps a Local policy throughout, so the host's addresses are
// still told apart.
func TestExternalPolicyLocalToClusterFromTheHost(t *testing.T) {
	a, b, c := startTCPBackend(t, "a"), startTCPBackend(t, "b"), startTCPBackend(t, "c")
	p := newTestProxier(t, loopbackNodePorts(Config{}))
	np := freePort(t)
	name := spn("etp", "", state.TCP)
	host := netip.MustParseAddr("127.0.0.1")
	nodePort := fmt.Sprintf("127.0.0.1:%d", np)
	other := state.ServicePort{Name: spn("other", "", state.TCP), Port: 80, NodePort: freePort(t), ExternalLocal: true,
		ClusterEndpoints: eps(a.addr()), LocalEndpoints: eps(a.addr())}
	mustApply(t, p, other, state.ServicePort{Name: name, Port: 80, NodePort: np, ExternalLocal: true, InternalLocal: true,
		ClusterEndpoints: eps(a.addr(), b.addr()), LocalEndpoints: eps(a.addr())})
	if got := tcpWhoFrom(t, host, nodePort); got != "a" && got != "b" {
		t.Fatalf("under Local, the host's node-port traffic reached %q", got)
	}
	mustApply(t, p, other, state.ServicePort{Name: name, Port: 80, NodePort: np, InternalLocal: true,
		ClusterEndpoints: eps(a.addr(), b.addr()), LocalEndpoints: eps(a.addr())})
	mustApply(t, p, other, state.ServicePort{Name: name, Port: 80, NodePort: np, InternalLocal: true,
		ClusterEndpoints: eps(c.addr()), LocalEndpoints: eps(c.addr())})
	for range 3 {
		if got := tcpWhoFrom(t, host, nodePort); got != "c" {
			t.Fatalf("under Cluster, after the endpoints changed to c, the host's node-port traffic reached %q", got)
		}
	}
}

// TestRemovedServicePortGivesUpEverySocket: with HoldReleasedPorts, a
// removed service port that has two proxy-port sockets (its proxy port and
// its external proxy port, under externalTrafficPolicy: Local) gives up
// both, to serve on until the portal syncs, and PortalSynced closes both.
// Whichever socket is given up first, the other is not forgotten, open for
// good.
func TestRemovedServicePortGivesUpEverySocket(t *testing.T) {
	a := startTCPBackend(t, "a")
	// Not newTestProxier: a socket forgotten open would keep Close from
	// returning, and the test is to fail, not hang.
	p := New(Config{HoldReleasedPorts: true, BindAddress: netip.MustParseAddr("127.0.0.1")})
	t.Cleanup(func() { closeWithin(t, p, 10*time.Second) })
	name := spn("gone", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: 30080, ExternalLocal: true,
		ClusterEndpoints: eps(a.addr()), LocalEndpoints: eps(a.addr())})
	addrs := []string{proxyAddr(t, p, name), fmt.Sprintf("127.0.0.1:%d", p.ExternalProxyPort(name))}
	if addrs[0] == addrs[1] {
		t.Fatalf("one proxy port %s for all traffic; want an external one of its own", addrs[0])
	}
	p.PortalSynced()
	mustApply(t, p)
	if n := givenUpListeners(p); n != 2 {
		t.Errorf("%d listeners given up, want 2: the proxy port and the external proxy port", n)
	}
	for _, addr := range addrs {
		if got, err := tcpWhoErr(addr); err != nil || got != "a" {
			t.Errorf("%s, given up, before the portal synced: %q, %v; want served", addr, got, err)
		}
	}
	p.PortalSynced()
	for _, addr := range addrs {
		expectClosedTCP(t, addr)
	}
}

// closeWithin closes p and fails the test if Close has not returned
// within d: a socket left open keeps its serving goroutine, which Close
// waits for.
func closeWithin(t *testing.T, p *Proxier, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		p.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Errorf("Close has not returned after %v: a socket was left serving", d)
	}
}

// TestRemovedServicePortEmptiesEveryBalancer: a removed service port's
// balancers all empty, its external one and the one for the host's own
// external traffic too, not only the internal one: a connection still
// dialing makes no further attempt through any of them.
func TestRemovedServicePortEmptiesEveryBalancer(t *testing.T) {
	a, b := startTCPBackend(t, "a"), startTCPBackend(t, "b")
	p := newTestProxier(t, Config{})
	name := spn("gone", "", state.TCP)
	// Both policies Local: internal and external traffic share the local
	// endpoint's balancer; the host's external traffic has one of its own
	// over every endpoint. Internal Local alone gives external traffic one
	// of its own.
	for _, tc := range []struct {
		name                         string
		internalLocal, externalLocal bool
	}{
		{"both Local", true, true},
		{"internal Local", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: 30080,
				InternalLocal: tc.internalLocal, ExternalLocal: tc.externalLocal,
				ClusterEndpoints: eps(a.addr(), b.addr()), LocalEndpoints: eps(a.addr())})
			p.mu.Lock()
			sp := p.services[name]
			bs := []*balancer{sp.internal, sp.external.Load(), sp.fromHost.Load()}
			p.mu.Unlock()
			mustApply(t, p)
			for i, bal := range bs {
				if bal != nil && (bal.has(a.addr()) || bal.has(b.addr())) {
					t.Errorf("balancer %d (internal, external, the host's) keeps endpoints after its service port is gone", i)
				}
			}
		})
	}
}

// TestUnchangedServicePortSweepsHostAffinity: an Apply that leaves a
// service port as it was drops the ClientIP affinity that expired, in
// the balancer of the host's own external traffic as in the others.
func TestUnchangedServicePortSweepsHostAffinity(t *testing.T) {
	a, b := startTCPBackend(t, "a"), startTCPBackend(t, "b")
	clock := newFakeClock()
	p := newTestProxier(t, loopbackNodePorts(Config{Clock: clock}))
	np := freePort(t)
	spec := state.ServicePort{Name: spn("sticky", "", state.TCP), Port: 80, NodePort: np,
		InternalLocal: true, ExternalLocal: true,
		Affinity:         state.Affinity{Type: state.AffinityClientIP, Timeout: 10 * time.Second},
		ClusterEndpoints: eps(a.addr(), b.addr()), LocalEndpoints: eps(a.addr())}
	mustApply(t, p, spec)
	tcpWhoFrom(t, netip.MustParseAddr("127.0.0.1"), fmt.Sprintf("127.0.0.1:%d", np))
	p.mu.Lock()
	fromHost := p.services[spec.Name].fromHost.Load()
	p.mu.Unlock()
	if fromHost == nil || fromHost.affinityClients() != 1 {
		t.Fatal("the host's node-port traffic left no affinity in a balancer of its own")
	}
	clock.Step(11 * time.Second)
	mustApply(t, p, spec)
	if n := fromHost.affinityClients(); n != 0 {
		t.Errorf("%d clients remembered after their affinity expired and an Apply swept, want 0", n)
	}
}

// TestUDPSessionStaysOnLocalEndpoint: a UDP session whose endpoint leaves
// the cluster endpoints but is still among the local ones goes on there:
// the local endpoints count as serving (see state.ServicePort.ServingEndpoints),
// even when a hand-made port leaves ServingEndpoints nil.
func TestUDPSessionStaysOnLocalEndpoint(t *testing.T) {
	a, b := startUDPBackend(t, "a"), startUDPBackend(t, "b")
	p := newTestProxier(t, Config{UDPIdleTimeout: time.Hour, UDPReplyTimeout: time.Hour})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(a.addr()), LocalEndpoints: eps(a.addr())})
	c := dialUDP(t, proxyAddr(t, p, name))
	if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "a" {
		t.Fatalf("before: %q, %v", got, err)
	}
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(b.addr()), LocalEndpoints: eps(a.addr())})
	if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "a" {
		t.Fatalf("the session to an endpoint still local: %q, %v; want a still", got, err)
	}
	if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil || string(got) != "b" {
		t.Fatalf("a new client: %q, %v; want b", got, err)
	}
}

// TestUDPWithoutEndpointsGivesBackItsPlace: a datagram that finds no
// endpoint is dropped and counted, and the session place it took under the
// cap is given back: with a cap of one session, the next client is served
// once an endpoint comes.
func TestUDPWithoutEndpointsGivesBackItsPlace(t *testing.T) {
	u := startUDPBackend(t, "u")
	p := newTestProxier(t, Config{UDPMaxSessions: 1, UDPIdleTimeout: time.Minute})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53})
	if _, err := dialUDP(t, proxyAddr(t, p, name)).Write([]byte("who")); err != nil {
		t.Fatal(err)
	}
	settle(t, "the datagram without an endpoint is counted", func() error {
		if n := p.Stats().UDPNoEndpoints.Load(); n != 1 {
			return fmt.Errorf("UDPNoEndpoints = %d, want 1", n)
		}
		return nil
	})
	if a := p.Activity()[name]; a.OpenUDPSessions != 0 || a.UDPSessions != 0 {
		t.Fatalf("activity %+v after a datagram without an endpoint, want no session", a)
	}
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(u.addr())})
	if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil || string(got) != "u" {
		t.Fatalf("a new client once an endpoint came: %q, %v; want served under the cap", got, err)
	}
}

// TestUDPNegativeCapIsNoCap: a negative UDPMaxSessions means no cap, not
// a cap no session fits under.
func TestUDPNegativeCapIsNoCap(t *testing.T) {
	u := startUDPBackend(t, "u")
	p := newTestProxier(t, Config{UDPMaxSessions: -1, UDPIdleTimeout: time.Minute})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(u.addr())})
	for i := range 3 {
		if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil || string(got) != "u" {
			t.Fatalf("client %d: %q, %v; want served", i, got, err)
		}
	}
	if n := p.Stats().UDPSessionsRejected.Load(); n != 0 {
		t.Errorf("UDPSessionsRejected = %d, want 0", n)
	}
}

// TestTCPGaveUpCountedPerServicePort: a connection reset after every dial
// attempt failed counts in its service port's Activity (GaveUp), not only
// in the proxier's Stats.
func TestTCPGaveUpCountedPerServicePort(t *testing.T) {
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(deadAddr(t))})
	if err := connectAndRead(proxyAddr(t, p, name)); !isReset(err) {
		t.Fatalf("connection after every dial failed: %v, want a reset", err)
	}
	settle(t, "the give-up is counted", func() error {
		if a := p.Activity()[name]; a.GaveUp != 1 || a.OpenConnections != 0 {
			return fmt.Errorf("activity %+v, want GaveUp 1 and no open connection", a)
		}
		return nil
	})
}

// TestSourceRangesRemovedAdmitEveryone: once a Service drops its
// loadBalancerSourceRanges, its load-balancer IP admits every source
// again, the kernel's filter (where there is one) and the proxy's check
// alike: the ranges of before are not kept.
func TestSourceRangesRemovedAdmitEveryone(t *testing.T) {
	const lbIP, allowed, other = "127.0.0.4", "127.0.0.10", "127.0.0.11"
	be := startTCPBackend(t, "be")
	port := freePort(t, lbIP)
	p := newTestProxier(t, Config{ServeFrontends: true, DisableProxyPorts: true,
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil }})
	spec := state.ServicePort{Name: spn("lb", "", state.TCP), Port: port,
		LoadBalancerIPs:          []netip.Addr{netip.MustParseAddr(lbIP)},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix(allowed + "/32")},
		ClusterEndpoints:         eps(be.addr())}
	mustApply(t, p, spec)
	dst := net.JoinHostPort(lbIP, strconv.Itoa(int(port)))
	if got := tcpWhoFrom(t, netip.MustParseAddr(allowed), dst); got != "be" {
		t.Fatalf("from %s, inside the ranges: %q", allowed, got)
	}
	spec.LoadBalancerSourceRanges = nil
	mustApply(t, p, spec)
	if got, err := tcpWhoFromErr(netip.MustParseAddr(other), dst); err != nil || got != "be" {
		t.Fatalf("from %s once the ranges are gone: %q, %v; want served", other, got, err)
	}
}

// TestSourceRangesOnlyOnTheLoadBalancerPort: loadBalancerSourceRanges
// guard the load-balancer IP at the service port, not the node port on
// the same address (a node whose address is also the load-balancer IP,
// as k3s's servicelb makes it), nor the proxy port: a source outside the
// ranges is served there, as kube-proxy serves it.
func TestSourceRangesOnlyOnTheLoadBalancerPort(t *testing.T) {
	const nodeIP, allowed, other = "127.0.0.4", "127.0.0.10", "127.0.0.11"
	be := startTCPBackend(t, "be")
	np := freePort(t, nodeIP)
	p := newTestProxier(t, Config{ServeNodePorts: true,
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix(nodeIP + "/32")},
		LocalAddrs:        func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr(nodeIP)}, nil }})
	name := spn("lb", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: np,
		LoadBalancerIPs:          []netip.Addr{netip.MustParseAddr(nodeIP)},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix(allowed + "/32")},
		ClusterEndpoints:         eps(be.addr())})
	for what, dst := range map[string]string{
		"node port":  net.JoinHostPort(nodeIP, strconv.Itoa(int(np))),
		"proxy port": proxyAddr(t, p, name),
	} {
		if got, err := tcpWhoFromErr(netip.MustParseAddr(other), dst); err != nil || got != "be" {
			t.Errorf("from %s, outside the ranges, to the %s: %q, %v; want served", other, what, got, err)
		}
	}
	if n := p.Stats().SourceRefused.Load(); n != 0 {
		t.Errorf("SourceRefused = %d, want 0", n)
	}
}

// TestUDPSessionsNotMovedUnlessTheExternalPortOpens: the endpoints of the
// UDP sessions on the proxy port are remembered for the external proxy
// port (see movedSessions) only when that port opens for a service port
// that served before, whose external clients the portal then moves there.
// A Service that has it from the start, and keeps it, moved nobody: its
// clients that later come to the external proxy port are balanced there
// afresh, not held to the endpoint of a session on the proxy port.
func TestUDPSessionsNotMovedUnlessTheExternalPortOpens(t *testing.T) {
	a, b := startUDPBackend(t, "a"), startUDPBackend(t, "b")
	p := newTestProxier(t, Config{HoldReleasedPorts: true, UDPIdleTimeout: time.Minute,
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil }})
	name := spn("etp", "dns", state.UDP)
	spec := state.ServicePort{Name: name, Port: 53, NodePort: 30053, ExternalLocal: true,
		ClusterEndpoints: eps(a.addr(), b.addr()), LocalEndpoints: eps(a.addr(), b.addr())}
	mustApply(t, p, spec)
	if ext := p.ExternalProxyPort(name); ext == 0 || ext == p.ProxyPort(name) {
		t.Fatalf("external proxy port %d, proxy port %d: want one of its own", ext, p.ProxyPort(name))
	}
	for i := range 2 {
		if _, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil {
			t.Fatalf("client %d on the proxy port: %v", i, err)
		}
	}
	for _, step := range []struct {
		what string
		do   func()
	}{
		{"the portal synced", func() { p.PortalSynced() }},
		{"an Apply that changed nothing", func() { mustApply(t, p, spec) }},
		{"the portal synced again", func() { p.PortalSynced() }},
	} {
		step.do()
		if n := p.moved.len(); n != 0 {
			t.Fatalf("after %s, %d sessions remembered as moved; want none: the external proxy port was there from the start", step.what, n)
		}
	}
}

// TestUDPFailedDialGivesBackItsPlace: a new session whose endpoint cannot
// be dialled gives back its place under the cap: with a cap of one
// session, the next client is served once the endpoint is a good one. The
// endpoint is loopback's broadcast address, which a socket without SO_BROADCAST
// may not connect to: the event-loop build's sockets. Go's own UDP
// sockets have it, so where the dial connects the test skips.
func TestUDPFailedDialGivesBackItsPlace(t *testing.T) {
	logs := captureLog(t, "2")
	u := startUDPBackend(t, "u")
	p := newTestProxier(t, Config{UDPMaxSessions: 1, UDPIdleTimeout: time.Minute})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(netip.MustParseAddrPort("127.255.255.255:53"))})
	if _, err := dialUDP(t, proxyAddr(t, p, name)).Write([]byte("who")); err != nil {
		t.Fatal(err)
	}
	settle(t, "the dial to the broadcast address fails or connects", func() error {
		klog.Flush()
		if logs.lineWith("UDP dial failed") == "" && p.Stats().UDPSessionsOpened.Load() == 0 {
			return fmt.Errorf("neither yet")
		}
		return nil
	})
	if p.Stats().UDPSessionsOpened.Load() != 0 {
		t.Skip("this build's UDP sockets may connect to the broadcast address: no dial fails here")
	}
	if a := p.Activity()[name]; a.OpenUDPSessions != 0 {
		t.Fatalf("activity %+v after the dial failed, want no open session", a)
	}
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(u.addr())})
	if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil || string(got) != "u" {
		t.Fatalf("a new client once the endpoint is a good one: %q, %v; want served under the cap", got, err)
	}
}

// TestWaitingServicePortListensOnNothing: a service port that waits for
// its proxy port (held for another until the portal syncs) listens on
// nothing meanwhile, not on a port of the kernel's choosing that the
// portal knows nothing of; once it has its port it listens there alone.
func TestWaitingServicePortListensOnNothing(t *testing.T) {
	a := startTCPBackend(t, "a")
	base := freePort(t)
	p := newTestProxier(t, Config{PortRange: PortRange{Base: base, Size: 1}, HoldReleasedPorts: true})
	one, two := spn("one", "", state.TCP), spn("two", "", state.TCP)
	svc := func(n state.ServicePortName) state.ServicePort {
		return state.ServicePort{Name: n, Port: 80, ClusterEndpoints: eps(a.addr())}
	}
	listenersOf := func(name state.ServicePortName) []Listener {
		var out []Listener
		for _, l := range p.Listeners() {
			if l.Service == name {
				out = append(out, l)
			}
		}
		return out
	}
	mustApply(t, p, svc(one))
	p.PortalSynced()
	mustApply(t, p, svc(two))
	if got := p.ProxyPort(two); got != 0 {
		t.Fatalf("proxy port %d before the portal synced; want it to wait", got)
	}
	if ls := listenersOf(two); len(ls) != 0 {
		t.Fatalf("waiting for its proxy port, it listens on %v; want nothing", ls)
	}
	p.PortalSynced()
	mustApply(t, p, svc(two))
	want := []Listener{{Service: two, Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), base), Role: "proxy-port"}}
	if ls := listenersOf(two); !slices.Equal(ls, want) {
		t.Fatalf("with its proxy port, listeners %v; want %v", ls, want)
	}
}

// TestUDPRefusalForgetsAffinity: an endpoint that refuses a ClientIP
// client's session (ICMP port unreachable) loses the client: its
// affinity is forgotten, not left to send the client's next session back
// there once the endpoint's penalty is over.
func TestUDPRefusalForgetsAffinity(t *testing.T) {
	// A UDP port where nothing listens any more.
	dead, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.LocalAddr().(*net.UDPAddr).AddrPort()
	dead.Close()
	// One dial attempt: the refused session ends rather than moves.
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{time.Second}, UDPIdleTimeout: time.Minute})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(deadAddr),
		Affinity: state.Affinity{Type: state.AffinityClientIP}})
	p.mu.Lock()
	b := p.services[name].internal
	p.mu.Unlock()
	if _, err := dialUDP(t, proxyAddr(t, p, name)).Write([]byte("who")); err != nil {
		t.Fatal(err)
	}
	// The refusal is counted just before the affinity goes: wait for both.
	settle(t, "the refusal forgets the client", func() error {
		if n := p.Stats().UDPRefused.Load(); n == 0 {
			return fmt.Errorf("no refusal yet")
		}
		if n := b.affinityClients(); n != 0 {
			return fmt.Errorf("%d clients keep their affinity to the endpoint that refused them, want 0", n)
		}
		return nil
	})
}

// TestUDPCapRejectionTakesNoPlace: a datagram the session cap drops holds
// no place under the cap: the port counts only the sessions open, and
// one that ends makes room for the next client.
func TestUDPCapRejectionTakesNoPlace(t *testing.T) {
	u := startUDPBackend(t, "u")
	p := newTestProxier(t, Config{UDPMaxSessions: 1, UDPIdleTimeout: 100 * time.Millisecond, UDPReplyTimeout: 100 * time.Millisecond})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(u.addr())})
	if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil || string(got) != "u" {
		t.Fatalf("first client: %q, %v", got, err)
	}
	if _, err := dialUDP(t, proxyAddr(t, p, name)).Write([]byte("who")); err != nil {
		t.Fatal(err)
	}
	settle(t, "the second client is dropped at the cap", func() error {
		if n := p.Stats().UDPSessionsRejected.Load(); n != 1 {
			return fmt.Errorf("UDPSessionsRejected = %d, want 1", n)
		}
		return nil
	})
	if a := p.Activity()[name]; a.OpenUDPSessions != 1 {
		t.Fatalf("%d sessions counted open, want 1: the dropped datagram opened none", a.OpenUDPSessions)
	}
	settle(t, "the first session idles out", func() error {
		if a := p.Activity()[name]; a.OpenUDPSessions != 0 {
			return fmt.Errorf("%d sessions counted open, want 0", a.OpenUDPSessions)
		}
		return nil
	})
	if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil || string(got) != "u" {
		t.Fatalf("a client once the session ended: %q, %v; want served", got, err)
	}
}

// TestExternalIPAloneLocal: a Service whose only external traffic comes
// to its external IPs (no node port, no load-balancer IP) still gets an
// external proxy port of its own under externalTrafficPolicy: Local,
// where the portal redirects those IPs; it reaches the local endpoint
// only, while the proxy port reaches every endpoint.
func TestExternalIPAloneLocal(t *testing.T) {
	local, remote := startTCPBackend(t, "local"), startTCPBackend(t, "remote")
	p := newTestProxier(t, Config{
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil }})
	name := spn("xip", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ExternalLocal: true,
		ExternalIPs:      []netip.Addr{netip.MustParseAddr("198.18.67.11")},
		ClusterEndpoints: eps(local.addr(), remote.addr()), LocalEndpoints: eps(local.addr())})
	ext := p.ExternalProxyPort(name)
	if ext == 0 || ext == p.ProxyPort(name) {
		t.Fatalf("external proxy port %d, proxy port %d: want one of its own for the external IP's traffic", ext, p.ProxyPort(name))
	}
	seen := map[string]int{}
	for range 4 {
		seen[tcpWhoFrom(t, outsider, fmt.Sprintf("127.0.0.1:%d", ext))]++
	}
	if seen["local"] != 4 {
		t.Errorf("external proxy port reached %v; want the local endpoint only", seen)
	}
	seen = map[string]int{}
	for range 4 {
		seen[tcpWhoFrom(t, outsider, proxyAddr(t, p, name))]++
	}
	if seen["local"] != 2 || seen["remote"] != 2 {
		t.Errorf("proxy port reached %v; want every endpoint, round robin", seen)
	}
}

// TestUDPSessionsStartedBeforeThePortalSyncedAreMoved: when
// externalTrafficPolicy goes from Cluster to Local, the external proxy
// port opens, and the portal moves external clients there at its next
// sync. A client whose session starts on the proxy port after the edit
// but before that sync is moved as well: its endpoint is remembered when
// the portal syncs, not only those of the sessions live at the edit.
func TestUDPSessionsStartedBeforeThePortalSyncedAreMoved(t *testing.T) {
	a, b := startUDPBackend(t, "a"), startUDPBackend(t, "b")
	p := newTestProxier(t, Config{HoldReleasedPorts: true, UDPIdleTimeout: time.Minute,
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil }})
	name := spn("etp", "dns", state.UDP)
	spec := state.ServicePort{Name: name, Port: 53, NodePort: 30053,
		ClusterEndpoints: eps(a.addr(), b.addr()), LocalEndpoints: eps(a.addr(), b.addr())}
	mustApply(t, p, spec)
	p.PortalSynced()
	exchange := func(what string) {
		t.Helper()
		if _, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	exchange("a client before the edit")
	spec.ExternalLocal = true
	mustApply(t, p, spec)
	if ext := p.ExternalProxyPort(name); ext == 0 || ext == p.ProxyPort(name) {
		t.Fatalf("external proxy port %d, proxy port %d: want one of its own", ext, p.ProxyPort(name))
	}
	if n := p.moved.len(); n != 1 {
		t.Fatalf("%d sessions remembered at the edit, want 1: the one live then", n)
	}
	exchange("a client after the edit")
	p.PortalSynced()
	if n := p.moved.len(); n != 2 {
		t.Fatalf("%d sessions remembered once the portal synced, want 2: the one started after the edit too", n)
	}
}
