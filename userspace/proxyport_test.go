package userspace

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

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
