package userspace

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestParsePortRangeEdges: the forms of --proxy-port-range at their
// limits. begin+offset may end on 65535 itself; a value that mixes '-'
// and '+' is none of the three forms, and kube-proxy refuses it (it
// took "1-+5" as 1-5, reading "+5" as a signed number); a space inside
// the value is refused with a message that says so.
func TestParsePortRangeEdges(t *testing.T) {
	tests := []struct {
		in      string
		want    PortRange
		wantErr string // a part of the message; "" for none
	}{
		{in: "65000+535", want: PortRange{Base: 65000, Size: 536}},
		{in: "65535+0", want: PortRange{Base: 65535, Size: 1}},
		{in: "1+65534", want: PortRange{Base: 1, Size: 65535}},
		{in: "65535", want: PortRange{Base: 65535, Size: 1}},
		{in: "1-+5", wantErr: "invalid port range"},
		{in: "+1-5", wantErr: "invalid port range"},
		{in: "1+-5", wantErr: "invalid port range"},
		{in: "30000 -30100", wantErr: "spaces"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePortRange(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParsePortRange(%q) = %+v, %v; want an error saying %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParsePortRange(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

// keyStartingAt returns a service port name, made from prefix, whose
// proxy-port search in r starts at port: what a fresh allocator hands it
// first.
func keyStartingAt(t *testing.T, r PortRange, port uint16, prefix string) state.ServicePortName {
	t.Helper()
	for i := range 500 {
		name := spn(fmt.Sprint(prefix, i), "", state.TCP)
		key := name.String() + "/" + roleProxyPort.String()
		if got, _ := newPortAllocator(r, time.Now).allocate(key, name.String()); got == port {
			return name
		}
	}
	t.Fatalf("no name from %q starts at %d in %v", prefix, port, r)
	return state.ServicePortName{}
}

// TestAllocatorNeverHandsOutReservedPorts: a reserved port (a node port
// this host serves) is neither allocated, though the scan starts there
// and every other port is taken, nor claimed. The proxier gives up only
// 16 attempts for a port, so reserved ports it had to pass over one by
// one would soon leave a range with free ports "exhausted".
func TestAllocatorNeverHandsOutReservedPorts(t *testing.T) {
	r := PortRange{Base: 1000, Size: 4}
	a := newPortAllocator(r, time.Now)
	a.reserve(map[uint16]bool{1000: true, 1001: true, 1002: true})
	for i := range 8 {
		key := fmt.Sprint("k", i)
		p, err := a.allocate(key, key)
		if p != 1003 || err != nil {
			t.Fatalf("allocate(%q) = %d, %v; want 1003, the one port not reserved", key, p, err)
		}
		a.release(p)
	}
	if _, err := a.allocate("k", "k"); err != nil {
		t.Fatal(err)
	}
	if p, err := a.allocate("k", "k"); !errors.Is(err, ErrPortRangeExhausted) {
		t.Fatalf("allocate with only reserved ports left = %d, %v; want ErrPortRangeExhausted", p, err)
	}
	if a.claim(1001) {
		t.Fatal("claim of a reserved port succeeded")
	}
}

// TestAllocatorTakenPortIsNoLongerRetired: a retired port that another
// owner took (no other was free) is that owner's from then on: once it
// comes back to the range by a plain release, the first owner's claim on
// it is over, and a key that starts there gets it.
func TestAllocatorTakenPortIsNoLongerRetired(t *testing.T) {
	clock := newFakeClock()
	r := PortRange{Base: 1000, Size: 2}
	a := newPortAllocator(r, clock.Now)
	if !a.claim(1000) || !a.claim(1001) {
		t.Fatal("claim of a free port failed")
	}
	a.retire(1000, "a")
	if p, err := a.allocate("x", "b"); p != 1000 || err != nil {
		t.Fatalf("with no other port free, b got %d, %v; want the retired 1000", p, err)
	}
	a.release(1000) // b's listen failed: a rollback
	a.release(1001)
	key := keyStartingAt(t, r, 1000, "c").String()
	if p, err := a.allocate(key+"/"+roleProxyPort.String(), key); p != 1000 || err != nil {
		t.Fatalf("a key that starts at 1000 got %d, %v; want 1000, which is retired no more", p, err)
	}
}

// TestRetiredPortHeldFiveMinutes: the README's five minutes, during which
// a port a deleted Service gave up goes to another Service only when no
// other port is free; a second later the key decides again.
func TestRetiredPortHeldFiveMinutes(t *testing.T) {
	clock := newFakeClock()
	r := PortRange{Base: 1000, Size: 2}
	a := newPortAllocator(r, clock.Now)
	name := keyStartingAt(t, r, 1000, "b")
	key, owner := name.String()+"/"+roleProxyPort.String(), name.String()
	if !a.claim(1000) {
		t.Fatal("claim of a free port failed")
	}
	a.retire(1000, "a")
	clock.Step(5*time.Minute - time.Second)
	p, err := a.allocate(key, owner)
	if p != 1001 || err != nil {
		t.Fatalf("a second before five minutes, %s got %d, %v; want 1001, not the retired 1000", owner, p, err)
	}
	a.release(p)
	clock.Step(time.Second)
	if p, err := a.allocate(key, owner); p != 1000 || err != nil {
		t.Fatalf("after five minutes, %s got %d, %v; want 1000, where its key starts", owner, p, err)
	}
}

// TestDeletedServicePortIsRetired: the proxy port of a deleted Service
// goes to no other while another port is free, for five minutes of the
// proxier's clock (Config.Clock): with --portal=none its old clients may
// still use it.
func TestDeletedServicePortIsRetired(t *testing.T) {
	be := startTCPBackend(t, "a")
	clock := newFakeClock()
	r := PortRange{Base: freePortRun(t, 3), Size: 3}
	p := newTestProxier(t, Config{PortRange: r, Clock: clock})
	svc := func(n state.ServicePortName) state.ServicePort {
		return state.ServicePort{Name: n, Port: 80, ClusterEndpoints: eps(be.addr())}
	}
	gone := spn("gone", "", state.TCP)
	mustApply(t, p, svc(gone))
	old := p.ProxyPort(gone)
	mustApply(t, p)
	next := keyStartingAt(t, r, old, "next")
	mustApply(t, p, svc(next))
	if got := p.ProxyPort(next); got == old || got == 0 {
		t.Fatalf("%s, whose search starts at %d, got %d; want another port while %s's is retired", next, old, got, gone)
	}
	clock.Step(reuseDelay)
	later := keyStartingAt(t, r, old, "later")
	mustApply(t, p, svc(next), svc(later))
	if got := p.ProxyPort(later); got != old {
		t.Fatalf("after reuseDelay on the proxier's clock, %s got %d; want %d, where its search starts", later, got, old)
	}
	if got := tcpWho(t, proxyAddr(t, p, later)); got != "a" {
		t.Fatalf("reached %q", got)
	}
}

// TestFailedProxyPortsGoBackToTheRange: a port the proxier tried and
// could not listen on is the range's again once the attempt is over:
// one another program held, whether its search passed over it or a
// previous run's port was wanted there, and one whose listen failed
// otherwise. Kept, the range ran out with ports free.
func TestFailedProxyPortsGoBackToTheRange(t *testing.T) {
	be := startTCPBackend(t, "a")
	svc := func(n state.ServicePortName) state.ServicePort {
		return state.ServicePort{Name: n, Port: 80, ClusterEndpoints: eps(be.addr())}
	}
	for _, preferred := range []bool{false, true} {
		t.Run(fmt.Sprint("preferred=", preferred), func(t *testing.T) {
			r := PortRange{Base: freePortRun(t, 2), Size: 2}
			held, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", r.Base))
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			cfg := Config{PortRange: r}
			first := keyStartingAt(t, r, r.Base, "first")
			if preferred {
				first = keyStartingAt(t, r, r.Base+1, "first")
				cfg.PreferredProxyPort = func(*state.ServicePort, bool) uint16 { return r.Base }
			}
			p := newTestProxier(t, cfg)
			mustApply(t, p, svc(first))
			if got := p.ProxyPort(first); got != r.Base+1 {
				t.Fatalf("proxy port %d with %d held by another program; want %d", got, r.Base, r.Base+1)
			}
			held.Close()
			second := spn("second", "", state.TCP)
			mustApply(t, p, svc(first), svc(second))
			if got := p.ProxyPort(second); got != r.Base {
				t.Fatalf("proxy port %d; want %d, free again", got, r.Base)
			}
		})
	}
	t.Run("not in use", func(t *testing.T) {
		// An address this host does not have: the listen fails with
		// EADDRNOTAVAIL, each time, and says so each time.
		bind := netip.MustParseAddr("198.51.100.7")
		if ln, err := net.Listen("tcp4", netip.AddrPortFrom(bind, 0).String()); err == nil {
			ln.Close()
			t.Skipf("this host can listen on %s", bind)
		}
		p := newTestProxier(t, Config{BindAddress: bind, PortRange: PortRange{Base: freePort(t), Size: 1}})
		for i := range 2 {
			err := p.Apply(state.NewSnapshot([]state.ServicePort{svc(spn("nowhere", "", state.TCP))}))
			if !errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, ErrPortRangeExhausted) {
				t.Fatalf("Apply %d: %v; want EADDRNOTAVAIL, the range's one port free again", i+1, err)
			}
		}
	})
}

// TestPreferredPortHeldForAnother: a previous run's port that its rules
// still point at for another service port is not taken before the portal
// syncs, though the preference names it.
func TestPreferredPortHeldForAnother(t *testing.T) {
	be := startTCPBackend(t, "a")
	r := PortRange{Base: freePortRun(t, 2), Size: 2}
	one, two := spn("one", "", state.TCP), spn("two", "", state.TCP)
	p := newTestProxier(t, Config{PortRange: r, HoldReleasedPorts: true,
		PreviousProxyPorts: map[uint16]state.ServicePortName{r.Base: one},
		PreferredProxyPort: func(*state.ServicePort, bool) uint16 { return r.Base }})
	mustApply(t, p, state.ServicePort{Name: two, Port: 80, ClusterEndpoints: eps(be.addr())})
	if got := p.ProxyPort(two); got != r.Base+1 {
		t.Fatalf("proxy port %d; want %d, not %d, held for %s", got, r.Base+1, r.Base, one)
	}
}

// TestPreferredPortNowAHostPort: a previous run's proxy port that a
// Service now has as its health-check node port is not taken again, with
// or without a range: the node port has a listener of its own.
func TestPreferredPortNowAHostPort(t *testing.T) {
	t.Run("range", func(t *testing.T) { preferredPortNowAHostPort(t, true) })
	t.Run("kernel-chosen", func(t *testing.T) { preferredPortNowAHostPort(t, false) })
}

func preferredPortNowAHostPort(t *testing.T, ranged bool) {
	be := startTCPBackend(t, "a")
	// Three proxy ports are wanted: web's, and lb's internal and
	// external ones.
	base := freePortRun(t, 4)
	web, lb := spn("web", "", state.TCP), spn("lb", "", state.TCP)
	cfg := Config{PreferredProxyPort: func(sp *state.ServicePort, _ bool) uint16 {
		if sp.Name == web {
			return base
		}
		return 0
	}}
	if ranged {
		cfg.PortRange = PortRange{Base: base, Size: 4}
	}
	p := newTestProxier(t, cfg)
	mustApply(t, p,
		state.ServicePort{Name: web, Port: 80, ClusterEndpoints: eps(be.addr())},
		state.ServicePort{Name: lb, Port: 80, NodePort: 30080, ExternalLocal: true, HealthCheckNodePort: base,
			ClusterEndpoints: eps(be.addr()), LocalEndpoints: eps(be.addr())})
	for _, got := range []uint16{p.ProxyPort(web), p.ProxyPort(lb), p.ExternalProxyPort(lb)} {
		if got == base || got == 0 {
			t.Fatalf("proxy ports %d, %d and %d; want none on the health-check node port %d",
				p.ProxyPort(web), p.ProxyPort(lb), p.ExternalProxyPort(lb), base)
		}
	}
}

// TestUnservedNodePortMayBeAProxyPort: only node ports the proxier
// listens on itself are kept from proxy ports; with a portal that
// redirects them (ServeNodePorts unset) the range's one port serves,
// though it is a node port number.
func TestUnservedNodePortMayBeAProxyPort(t *testing.T) {
	be := startTCPBackend(t, "a")
	port := freePort(t)
	p := newTestProxier(t, Config{PortRange: PortRange{Base: port, Size: 1}})
	name := spn("np", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: port, ClusterEndpoints: eps(be.addr())})
	if got := p.ProxyPort(name); got != port {
		t.Fatalf("proxy port %d; want %d, a node port the proxier does not listen on", got, port)
	}
}

// TestGivenUpSocketsBoundedInTheView: beyond maxReleased given-up sockets
// the oldest close, and are no longer listed as given up.
func TestGivenUpSocketsBoundedInTheView(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{HoldReleasedPorts: true})
	for i := range maxReleased + 2 {
		mustApply(t, p, state.ServicePort{Name: spn("many", fmt.Sprint("p", i), state.TCP), Port: 80, ClusterEndpoints: eps(be.addr())})
	}
	if n := givenUpListeners(p); n != maxReleased {
		t.Fatalf("%d listeners listed as given up; want %d, the bound", n, maxReleased)
	}
}

// TestGivenUpSocketOfAnotherIsNotTakenBack: a socket one service port
// gave up (its IPv6 half, the Service now IPv4 only) still serves that
// service port until the portal syncs; a service port that had its port
// in the previous run does not take it over: it would get the other's
// endpoints. It takes another port.
func TestGivenUpSocketOfAnotherIsNotTakenBack(t *testing.T) {
	needIPv6Loopback(t)
	b1, b2 := startTCPBackendOn(t, "one", "[::1]:0"), startTCPBackendOn(t, "two", "[::1]:0")
	b1v4 := startTCPBackend(t, "one4")
	one, two := spn("one", "", state.TCP), spn("two", "", state.TCP)
	var prev uint16
	p := newTestProxier(t, Config{BindAddress: netip.IPv6Unspecified(), HoldReleasedPorts: true,
		PreferredProxyPort: func(sp *state.ServicePort, _ bool) uint16 {
			if sp.Name == two {
				return prev
			}
			return 0
		}})
	dual := state.ServicePort{Name: one, Port: 80, IPFamilies: []state.IPFamily{state.IPv4, state.IPv6},
		ClusterEndpoints: eps(b1v4.addr(), b1.addr())}
	mustApply(t, p, dual)
	prev = p.ProxyPort(one)
	p.PortalSynced()
	v4 := dual
	v4.IPFamilies, v4.ClusterEndpoints = []state.IPFamily{state.IPv4}, eps(b1v4.addr())
	v6 := state.ServicePort{Name: two, Port: 80, IPFamilies: []state.IPFamily{state.IPv6}, ClusterEndpoints: eps(b2.addr())}
	mustApply(t, p, v4, v6)
	got := p.ProxyPort(two)
	if got == prev || got == 0 {
		t.Fatalf("%s's proxy port is %d; want another than %d, %s's given-up socket", two, got, prev, one)
	}
	if who := tcpWho(t, fmt.Sprintf("[::1]:%d", got)); who != "two" {
		t.Fatalf("%s's proxy port reached %q", two, who)
	}
}

// TestMovedProxyPortGoesBackToTheRange: a proxy port that moves because
// another program holds it in a family the Service gained is given back
// to the range: it is the last port handed out, but it is handed out.
func TestMovedProxyPortGoesBackToTheRange(t *testing.T) {
	needIPv6Loopback(t)
	b6, b4 := startTCPBackendOn(t, "b6", "[::1]:0"), startTCPBackend(t, "b4")
	r := PortRange{Base: freePortRun(t, 3), Size: 3}
	p := newTestProxier(t, Config{BindAddress: netip.IPv4Unspecified(), PortRange: r})
	name := spn("v6", "moves", state.TCP)
	sp := state.ServicePort{Name: name, Port: 80, IPFamilies: []state.IPFamily{state.IPv6}, ClusterEndpoints: eps(b6.addr())}
	mustApply(t, p, sp)
	old := p.ProxyPort(name)
	squatter, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", old))
	if err != nil {
		t.Fatalf("hold the IPv4 half of proxy port %d: %v", old, err)
	}
	sp.IPFamilies, sp.ClusterEndpoints = []state.IPFamily{state.IPv6, state.IPv4}, eps(b6.addr(), b4.addr())
	mustApply(t, p, sp)
	if moved := p.ProxyPort(name); moved == old || !r.Contains(moved) {
		t.Fatalf("proxy port %d after the move; want another of %v than %d", moved, r, old)
	}
	squatter.Close()
	others := []state.ServicePort{sp}
	for i := range 2 {
		others = append(others, state.ServicePort{Name: spn(fmt.Sprint("more", i), "", state.TCP), Port: 80, ClusterEndpoints: eps(b4.addr())})
		mustApply(t, p, others...)
	}
	if got := p.ProxyPort(others[2].Name); got != old {
		t.Fatalf("the last service port got %d; want %d, the port moved off", got, old)
	}
}

// TestRemovedUnsupportedPortIsForgotten: a service port skipped for its
// protocol is reported as unsupported while the snapshot has it, and no
// longer once it is gone (the debug view asks; a Service added again is
// reported again).
func TestRemovedUnsupportedPortIsForgotten(t *testing.T) {
	p := newTestProxier(t, Config{})
	name := spn("odd", "", state.Protocol("QUIC"))
	mustApply(t, p, state.ServicePort{Name: name, Port: 443})
	if p.Unsupported(name) == nil {
		t.Fatalf("%s is not reported as unsupported", name)
	}
	mustApply(t, p)
	if err := p.Unsupported(name); err != nil {
		t.Fatalf("%s, removed, is still reported as unsupported: %v", name, err)
	}
}

// TestCloseForgetsServicePorts: once closed, the proxier serves nothing,
// and says so: no listener, no proxy port, no service port's activity.
func TestCloseForgetsServicePorts(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	p.Close()
	if port, ls, act := p.ProxyPort(name), p.Listeners(), p.Activity(); port != 0 || len(ls) != 0 || len(act) != 0 {
		t.Fatalf("after Close: proxy port %d, listeners %v, activity %v; want none", port, ls, act)
	}
}

// TestConfigZeroValues: each zero field of Config means its default, and
// a negative UDPMaxSessions means no cap, as the fields say; it is not
// taken for the default.
func TestConfigZeroValues(t *testing.T) {
	var c Config
	c.setDefaults()
	if c.UDPIdleTimeout != DefaultUDPIdleTimeout || c.UDPReplyTimeout != DefaultUDPReplyTimeout ||
		c.UDPMaxSessions != DefaultUDPMaxSessions || c.EndpointPenalty != DefaultEndpointPenalty ||
		c.TCPHalfCloseTimeout != DefaultTCPHalfCloseTimeout || len(c.DialTimeouts) != len(DefaultDialTimeouts) ||
		c.Clock == nil || c.LocalAddrs == nil {
		t.Errorf("zero Config with defaults: %+v", c)
	}
	c = Config{UDPMaxSessions: -1}
	c.setDefaults()
	if c.UDPMaxSessions >= 0 {
		t.Errorf("UDPMaxSessions -1 became %d; want it negative, no cap", c.UDPMaxSessions)
	}
}

// TestIPv4MappedBindAddress: a bind address written as an IPv4-mapped
// IPv6 address is the IPv4 address: the proxy port listens there.
func TestIPv4MappedBindAddress(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{BindAddress: netip.MustParseAddr("::ffff:127.0.0.1")})
	name := spn("mapped", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	for _, l := range p.Listeners() {
		if l.Addr.Addr() != netip.MustParseAddr("127.0.0.1") {
			t.Errorf("listener on %s; want 127.0.0.1", l.Addr)
		}
	}
	if got := tcpWho(t, proxyAddr(t, p, name)); got != "a" {
		t.Fatalf("reached %q", got)
	}
}

// TestCloseCountsNothingOpen: Close returns once every connection and
// session it ended is done with, so the counters of those open are zero
// the moment it returns, without waiting for them to settle.
func TestCloseCountsNothingOpen(t *testing.T) {
	tb, ub := startTCPBackend(t, "t"), startUDPBackend(t, "u")
	p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1"), UDPIdleTimeout: time.Minute})
	tn, un := spn("open", "t", state.TCP), spn("open", "u", state.UDP)
	mustApply(t, p, state.ServicePort{Name: tn, Port: 80, ClusterEndpoints: eps(tb.addr())},
		state.ServicePort{Name: un, Port: 53, ClusterEndpoints: eps(ub.addr())})
	for range 4 {
		c, err := net.Dial("tcp", proxyAddr(t, p, tn))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil { // proxied now
			t.Fatal(err)
		}
		if _, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, un)), []byte("who")); err != nil {
			t.Fatal(err)
		}
	}
	s := p.Stats()
	if tcp, udp := s.TCPActive.Load(), s.UDPSessionsActive.Load(); tcp != 4 || udp != 4 {
		t.Fatalf("before Close: %d connections and %d sessions open; want 4 and 4", tcp, udp)
	}
	p.Close()
	if tcp, udp := s.TCPActive.Load(), s.UDPSessionsActive.Load(); tcp != 0 || udp != 0 {
		t.Fatalf("when Close returned: %d connections and %d sessions counted open; want none", tcp, udp)
	}
}
