//go:build linux && !goroutines

package userspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// withTwoLoops makes sure the proxier about to be made starts at least two
// event loops (one per P, up to four), and puts GOMAXPROCS back after it.
func withTwoLoops(t *testing.T) {
	if n := runtime.GOMAXPROCS(0); n < 2 {
		runtime.GOMAXPROCS(2)
		t.Cleanup(func() { runtime.GOMAXPROCS(n) })
	}
}

// TestStalledLoopDoesNotStallAccepts: every loop waits on every TCP
// listening socket, so while all loops but one are stuck, new connections
// are still accepted and served, whichever loop is the free one. (With a
// listener owned by one loop, a stuck owner stalled every new connection.)
func TestStalledLoopDoesNotStallAccepts(t *testing.T) {
	withTwoLoops(t)
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("stall", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	addr := proxyAddr(t, p, name)
	if len(p.loops) < 2 {
		t.Fatalf("%d event loops, want at least 2", len(p.loops))
	}
	for free := range p.loops {
		release := make(chan struct{})
		stalled := make(chan struct{})
		for i, lp := range p.loops {
			if i != free {
				go lp.do(func() {
					stalled <- struct{}{}
					<-release
				})
				<-stalled // the loop is stuck before any connection is made
			}
		}
		for range 5 {
			if err := greeting(addr, "a", 3*time.Second); err != nil {
				close(release)
				t.Fatalf("with only loop %d of %d free: %v", free, len(p.loops), err)
			}
		}
		close(release)
	}
}

// greeting connects to addr and expects the tcpBackend's greeting want
// within d.
func greeting(addr, want string, d time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != want {
		return errorf("greeting %q, want %q", got, want)
	}
	return nil
}

// TestIdleLoopsPark: a loop waits in epoll_wait itself, holding its P, only
// while it is busy. Once idle every loop parks in the runtime's poller, and
// a parked loop still wakes for new work, timers included.
func TestIdleLoopsPark(t *testing.T) {
	withTwoLoops(t)
	be := startTCPBackend(t, "a")
	udp := startUDPBackend(t, "u")
	p := newTestProxier(t, Config{UDPIdleTimeout: 100 * time.Millisecond, UDPReplyTimeout: 100 * time.Millisecond})
	tcpName := spn("idle", "tcp", state.TCP)
	udpName := spn("idle", "udp", state.UDP)
	mustApply(t, p,
		state.ServicePort{Name: tcpName, Port: 80, ClusterEndpoints: eps(be.addr())},
		state.ServicePort{Name: udpName, Port: 53, ClusterEndpoints: eps(udp.addr())})
	allParked := func() error {
		for i, lp := range p.loops {
			if !lp.parked.Load() {
				return errorf("loop %d of %d is not parked", i, len(p.loops))
			}
		}
		return nil
	}
	for round := range 3 {
		if got := tcpWho(t, proxyAddr(t, p, tcpName)); got != "a" {
			t.Fatalf("round %d: TCP via the proxy reached %q, want a", round, got)
		}
		c := dialUDP(t, proxyAddr(t, p, udpName))
		if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "u" {
			t.Fatalf("round %d: UDP via the proxy: %q, %v; want u", round, got, err)
		}
		// The session's idle timeout is a timer on a loop that parks
		// before it is due: it must still fire.
		settle(t, "the UDP session times out", func() error {
			if n := p.stats.UDPSessionsActive.Load(); n != 0 {
				return errorf("%d UDP sessions active", n)
			}
			return nil
		})
		settle(t, "every idle loop parks", allParked)
	}
}

// TestGOMAXPROCSFollowsLoops: each running loop adds a P, so the rest of
// the program keeps the ones it had; Close gives them back.
func TestGOMAXPROCSFollowsLoops(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	be := startTCPBackend(t, "a")
	p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1")})
	defer p.Close()
	name := spn("procs", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	if got, want := runtime.GOMAXPROCS(0), before+len(p.loops); len(p.loops) == 0 || got != want {
		t.Fatalf("with %d loops running GOMAXPROCS is %d, want %d", len(p.loops), got, want)
	}
	p.Close()
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("after Close GOMAXPROCS is %d, want %d again", got, before)
	}
}

// udpServiceOnLoops starts a proxier with at least two event loops that
// serves one UDP service port, named after svc, in front of a UDP backend.
func udpServiceOnLoops(t *testing.T, cfg Config, svc string) (*Proxier, state.ServicePortName) {
	t.Helper()
	withTwoLoops(t)
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, cfg)
	name := spn(svc, "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	return p, name
}

// udpMembers returns the sockets of a UDP service port's proxy-port group.
func udpMembers(t *testing.T, p *Proxier, name state.ServicePortName) []*udpListener {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	sp := p.services[name]
	if sp == nil {
		t.Fatalf("no service port %s", name)
	}
	for k, s := range sp.sockets {
		if g, ok := s.(*udpGroup); ok && k.role == roleProxyPort {
			return g.members
		}
	}
	t.Fatalf("%s has no UDP proxy-port group", name)
	return nil
}

// sessionsPerMember counts the sessions in each member's table, on its
// loop.
func sessionsPerMember(members []*udpListener) []int {
	n := make([]int, len(members))
	for i, l := range members {
		l.lp.do(func() { n[i] = len(l.sessions) })
	}
	return n
}

// TestUDPClientsSpreadOverLoops: a UDP service address has a socket in
// every loop, all on one port; the kernel spreads clients over them, and a
// client's later datagrams reach the session it has (no second session on
// another socket).
func TestUDPClientsSpreadOverLoops(t *testing.T) {
	p, name := udpServiceOnLoops(t, Config{UDPIdleTimeout: time.Minute}, "spread")
	members := udpMembers(t, p, name)
	if len(members) != len(p.loops) || len(p.loops) < 2 {
		t.Fatalf("%d sockets for %d loops, want one per loop (and at least 2 loops)", len(members), len(p.loops))
	}
	for i, l := range members {
		if l.lp != p.loops[i] {
			t.Fatalf("socket %d is on the wrong loop", i)
		}
	}
	const clients = 32
	var conns []*net.UDPConn
	for i := range clients {
		c := dialUDP(t, proxyAddr(t, p, name))
		conns = append(conns, c)
		if got, err := udpExchange(t, c, []byte(fmt.Sprint("first ", i))); err != nil || string(got) != fmt.Sprint("first ", i) {
			t.Fatalf("client %d: %q, %v", i, got, err)
		}
	}
	for round := range 3 {
		for i, c := range conns {
			msg := fmt.Sprint("again ", round, i)
			if got, err := udpExchange(t, c, []byte(msg)); err != nil || string(got) != msg {
				t.Fatalf("client %d, round %d: %q, %v", i, round, got, err)
			}
		}
	}
	if n := p.stats.UDPSessionsOpened.Load(); n != clients {
		t.Fatalf("%d sessions opened for %d clients: a client's datagrams reached more than one socket", n, clients)
	}
	per := sessionsPerMember(members)
	total := 0
	for i, n := range per {
		if n == 0 {
			t.Fatalf("sessions per socket %v: socket %d (loop %d) served no client", per, i, i)
		}
		total += n
	}
	if total != clients {
		t.Fatalf("sessions per socket %v add up to %d, want %d", per, total, clients)
	}
}

// TestUDPSessionCapAcrossLoops: the cap is per service port, whichever of
// its sockets (and loops) the clients arrive on.
func TestUDPSessionCapAcrossLoops(t *testing.T) {
	const max = 24
	p, name := udpServiceOnLoops(t, Config{UDPMaxSessions: max, UDPIdleTimeout: time.Minute}, "cap")
	addr := proxyAddr(t, p, name)
	for i := range max {
		if _, err := udpExchange(t, dialUDP(t, addr), []byte("hi")); err != nil {
			t.Fatalf("client %d within the cap of %d: %v", i, max, err)
		}
	}
	per := sessionsPerMember(udpMembers(t, p, name))
	busy := 0
	for _, n := range per {
		if n > 0 {
			busy++
		}
	}
	if busy < 2 {
		// 2^-23 with two loops: the kernel's hash would be broken.
		t.Fatalf("sessions per socket %v: the clients did not spread over the loops", per)
	}
	for i := range 8 {
		extra := dialUDP(t, addr)
		extra.Write([]byte("over"))
		extra.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := extra.Read(make([]byte, 10)); err == nil {
			t.Fatalf("client %d past the cap of %d was served (sessions per socket %v)", max+i+1, max, per)
		}
	}
	if n := p.stats.UDPSessionsRejected.Load(); n != 8 {
		t.Fatalf("rejected = %d, want 8", n)
	}
	if n := p.stats.UDPSessionsActive.Load(); n != max {
		t.Fatalf("active sessions = %d, want %d", n, max)
	}
}

// TestUDPPortHeldWithReusePortIsNotJoined: a port that another socket of
// the same user holds with SO_REUSEPORT is in use. Opening the proxy's
// sockets there with SO_REUSEPORT straight away would succeed and share
// that socket's datagrams; the proxy must fail with EADDRINUSE instead.
func TestUDPPortHeldWithReusePortIsNotJoined(t *testing.T) {
	withTwoLoops(t)
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	other, err := lc.ListenPacket(context.Background(), "udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	port := uint16(other.LocalAddr().(*net.UDPAddr).Port)
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{PortRange: PortRange{Base: port, Size: 1}})
	name := spn("taken", "", state.UDP)
	err = p.Apply(state.NewSnapshot([]state.ServicePort{{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())}}))
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("Apply with the only proxy port %d held by another SO_REUSEPORT socket: %v, want EADDRINUSE", port, err)
	}
	if got := p.ProxyPort(name); got != 0 {
		t.Fatalf("service got proxy port %d, want none", got)
	}
}

// TestUDPGroupClosesEveryMember: removing a UDP service closes the socket
// of every loop, so the port is free again for anyone (a socket left open
// with SO_REUSEPORT would still hold it).
func TestUDPGroupClosesEveryMember(t *testing.T) {
	p, name := udpServiceOnLoops(t, Config{}, "gone")
	if n := len(udpMembers(t, p, name)); n < 2 {
		t.Fatalf("%d sockets, want one per loop (at least 2)", n)
	}
	port := p.ProxyPort(name)
	mustApply(t, p)
	u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(port)})
	if err != nil {
		t.Fatalf("port %d after the service is gone: %v", port, err)
	}
	u.Close()
}

// TestUDPPktinfoOnlyOnWildcard: a UDP socket asks for each datagram's
// destination (IP_PKTINFO, IPV6_RECVPKTINFO) only when bound to the
// wildcard address; one bound to a single address replies from it anyway.
func TestUDPPktinfoOnlyOnWildcard(t *testing.T) {
	for _, tc := range []struct {
		addr       string
		level, opt int
		want       int
	}{
		{"0.0.0.0:0", unix.IPPROTO_IP, unix.IP_PKTINFO, 1},
		{"127.0.0.1:0", unix.IPPROTO_IP, unix.IP_PKTINFO, 0},
		{"[::]:0", unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1},
		{"[::1]:0", unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 0},
	} {
		addr := netip.MustParseAddrPort(tc.addr)
		fd, _, err := bindUDP(familyOf(addr.Addr()), addr, false)
		if err != nil {
			t.Fatalf("bind %s: %v", tc.addr, err)
		}
		got, err := unix.GetsockoptInt(fd, tc.level, tc.opt)
		unix.Close(fd)
		if err != nil || got != tc.want {
			t.Errorf("socket bound to %s: pktinfo option %d, %v; want %d", tc.addr, got, err, tc.want)
		}
	}
}

// TestClientResetDuringDialEndsIt: a client that resets while its endpoint
// is still being dialed (the endpoint drops SYNs) ends the dial at once and
// frees its descriptors, rather than after every dial attempt has timed
// out.
func TestClientResetDuringDialEndsIt(t *testing.T) {
	// An endpoint whose accept queue is full drops SYNs: a listener with a
	// backlog of 0 that never accepts, and one connection already queued.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	port, err := localPort(fd)
	if err != nil {
		t.Fatal(err)
	}
	stuck := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	filler, err := net.Dial("tcp4", stuck.String())
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()

	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{time.Minute}})
	name := spn("stuck", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(stuck)})
	before := openFDs(t)
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	settle(t, "the proxy dials the endpoint", func() error {
		if n := openFDs(t); n < before+3 { // our client, the proxy's client side and its dial
			return fmt.Errorf("%d fds, want %d", n, before+3)
		}
		return nil
	})
	c.(*net.TCPConn).SetLinger(0)
	c.Close() // a reset
	// At once; the bound is only far below the dial's minute, after which
	// the connection would be freed without the reset, so that a busy
	// machine does not fail the test.
	settleWithin(t, 20*time.Second, "the proxy frees the connection after the client's reset", func() error {
		if n := openFDs(t); n != before {
			return fmt.Errorf("%d fds, want %d as before the client came", n, before)
		}
		return nil
	})
}

// TestParsePktinfoKeepsLinkLocalInterface: the event loop reads a link-local
// destination with its receiving interface (ipi6_ifindex) as zone, so the
// reply built from it leaves by that interface; a global one has no zone.
func TestParsePktinfoKeepsLinkLocalInterface(t *testing.T) {
	for _, tc := range []struct{ sent, want string }{
		{"fe80::1%7", "fe80::1%7"},
		{"fd5e:b1b5::10", "fd5e:b1b5::10"},
	} {
		// An IPV6_PKTINFO control message as the kernel delivers it: the
		// reply's has the same layout.
		oob := (&ipv6.ControlMessage{Src: netip.MustParseAddr(tc.sent).WithZone("").AsSlice(), IfIndex: 7}).Marshal()
		if got := parsePktinfo(oob); got.String() != tc.want {
			t.Errorf("parsePktinfo(%s on interface 7) = %s; want %s", tc.sent, got, tc.want)
		}
	}
}

// TestClosingListenerServesQueuedConnections: connections the kernel
// queued on a listening socket that no loop got round to accepting are
// served when the socket closes (here, its Service goes), not reset: their
// clients' connects had succeeded. The loops are held up while the
// clients connect, and each is let go only once the close waits on it: a
// loop let go early would accept the queued connections itself.
func TestClosingListenerServesQueuedConnections(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("queued", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	addr := proxyAddr(t, p, name)

	releases := make([]chan struct{}, len(p.loops))
	for i, lp := range p.loops {
		releases[i] = make(chan struct{})
		stalled := make(chan struct{})
		go lp.do(func() {
			close(stalled)
			<-releases[i]
		})
		<-stalled
	}
	released := 0
	defer func() {
		for _, r := range releases[released:] {
			close(r)
		}
	}()
	const n = 5
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}

	applied := make(chan error, 1)
	go func() { applied <- p.Apply(state.NewSnapshot(nil)) }()
	for i, lp := range p.loops {
		settle(t, "the listener's close waits on the loop", func() error {
			lp.mu.Lock()
			defer lp.mu.Unlock()
			if len(lp.cmds) == 0 {
				return errorf("loop %d has no command queued", i)
			}
			return nil
		})
		close(releases[i])
		released++
	}
	if err := <-applied; err != nil {
		t.Fatalf("Apply: %v", err)
	}
	for i, c := range clients {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "a\n" {
			t.Errorf("client %d, queued when its Service went: %q, %v; want it served", i, got, err)
		}
	}
}
