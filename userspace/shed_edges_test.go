package userspace

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestResourceExhaustedErrors: the four errors that mean the process or
// host ran out of descriptors or buffers are told apart from an
// endpoint's failures, however deeply wrapped; ENOBUFS and ENOMEM come
// from a host short of socket buffers, where a shed, not a dial to the
// next endpoint, is the answer.
func TestResourceExhaustedErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{syscall.EMFILE, true},
		{syscall.ENFILE, true},
		{syscall.ENOBUFS, true},
		{syscall.ENOMEM, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.ENOBUFS)}, true},
		{fmt.Errorf("accept: %w", os.NewSyscallError("accept4", syscall.ENOMEM)), true},
		{&reserveError{fdReserveMax}, true},
		{nil, false},
		{syscall.ECONNREFUSED, false},
		{syscall.EACCES, false},
		{syscall.ENOENT, false},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}, false},
	} {
		if got := isResourceExhausted(tc.err); got != tc.want {
			t.Errorf("isResourceExhausted(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestShedderClosesItsSpareFile: the spare is really closed while a
// connection is shed, so that its number is the one accept can take, and
// closing the shedder closes it too; a spare only forgotten would stay
// open until the garbage collector found it.
func TestShedderClosesItsSpareFile(t *testing.T) {
	s := newShedder()
	defer s.close()
	given := s.spare
	if given == nil {
		t.Fatal("no spare at start")
	}
	r := s.withSpare(func() shedResult {
		if err := given.Close(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("the spare given up is still open while a connection is shed (closing it: %v)", err)
		}
		return shedOne
	})
	if r != shedOne {
		t.Fatalf("withSpare = %v, want shedOne", r)
	}
	back := s.spare
	if back == nil || back == given {
		t.Fatalf("spare after the shed: %v, want a new one in place of %v", back, given)
	}
	s.close()
	if err := back.Close(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("close left the spare open (closing it: %v)", err)
	}
}

// TestShedderRetakeKeepsTheSpareInHand: two sockets checked at once may
// both find the spare missing; the first takes it back, and the second,
// which then finds it in hand though it read it missing, must not open
// another: the one it replaced would stay open, unreferenced, until the
// garbage collector closed it.
func TestShedderRetakeKeepsTheSpareInHand(t *testing.T) {
	s := newShedder()
	defer s.close()
	held := s.spare
	s.missing.Store(true) // as the second check read it
	if !s.retake() {
		t.Fatal("retake asked for a shed with the spare in hand")
	}
	if s.spare != held {
		t.Errorf("retake opened spare %v in place of %v, still open", s.spare, held)
	}
}

// TestShedderTriesThreeTimes: a shed whose freed descriptor is taken twice
// running is tried a third time, with a pause before each try after the
// first; a try that finds no connection waiting ends it at once, with no
// pause and no second try.
func TestShedderTriesThreeTimes(t *testing.T) {
	s := newShedder()
	defer s.close()
	pauses := 0
	s.pause = func() { pauses++ }
	tries := 0
	r := s.withSpare(func() shedResult {
		if tries++; tries < 3 {
			return shedFailed
		}
		return shedOne
	})
	if r != shedOne || tries != 3 || pauses != 2 {
		t.Fatalf("withSpare = %v after %d tries and %d pauses; want shedOne on the third try, after two pauses", r, tries, pauses)
	}

	pauses, tries = 0, 0
	r = s.withSpare(func() shedResult { tries++; return shedNone })
	if r != shedNone || tries != 1 || pauses != 0 {
		t.Fatalf("nothing waiting: withSpare = %v after %d tries and %d pauses; want shedNone after one try", r, tries, pauses)
	}
}

func TestFDCeilingsEdges(t *testing.T) {
	t.Run("a limit as large as any descriptor number is none", func(t *testing.T) {
		var c fdCeilings
		c.set(math.MaxInt32)
		if got := c.conns.Load(); got != math.MaxInt {
			t.Errorf("limit MaxInt32: conns ceiling %d, want none", got)
		}
		c.set(math.MaxInt32 - 1)
		if got := c.conns.Load(); got != math.MaxInt32-1-fdReserveMax {
			t.Errorf("limit MaxInt32-1: conns ceiling %d, want %d", got, math.MaxInt32-1-fdReserveMax)
		}
	})
	t.Run("the ceiling itself is in the reserve", func(t *testing.T) {
		var c fdCeilings
		c.set(100) // a reserve of 25: the ceiling is 75
		if !c.connFD(74) || c.connFD(75) {
			t.Errorf("ceiling 75: connFD(74) = %v, connFD(75) = %v; want true, false", c.connFD(74), c.connFD(75))
		}
	})
	t.Run("a listener in the reserve is refused uncounted", func(t *testing.T) {
		var c fdCeilings
		c.set(100)
		err := c.listenerFD(75)
		if !errors.Is(err, syscall.EMFILE) || errors.Is(err, errListenerRoom) {
			t.Fatalf("listener on descriptor 75 under a ceiling of 75: %v, want the reserve's error", err)
		}
		if n := c.listeners.Load(); n != 0 || c.measured.Load() {
			t.Errorf("a refused listener counted %d, measured %v; want neither", n, c.measured.Load())
		}
	})
	t.Run("listeners up to the bound are kept", func(t *testing.T) {
		var c fdCeilings
		c.set(1024)
		c.measured.Store(true)
		c.maxListeners.Store(2)
		for fd := range 2 {
			if err := c.listenerFD(10 + fd); err != nil {
				t.Fatalf("listener %d of a bound of 2: %v", fd+1, err)
			}
		}
		if err := c.listenerFD(12); !errors.Is(err, errListenerRoom) {
			t.Fatalf("a third listener with a bound of 2: %v, want %v", err, errListenerRoom)
		}
		if n := c.listeners.Load(); n != 2 {
			t.Errorf("%d listeners counted, want 2", n)
		}
	})
}

// fdConn is a syscall.Conn whose descriptor is fd, for the checks that
// only read the number.
type fdConn int

func (c fdConn) SyscallConn() (syscall.RawConn, error) { return fdRawConn(c), nil }

type fdRawConn int

func (c fdRawConn) Control(f func(uintptr)) error { f(uintptr(c)); return nil }
func (fdRawConn) Read(func(uintptr) bool) error   { return errors.ErrUnsupported }
func (fdRawConn) Write(func(uintptr) bool) error  { return errors.ErrUnsupported }

// TestAcceptedLeavesADescriptorPerDial: a connection a goroutine accept
// loop accepted is kept only if, below the ceiling, a descriptor is left
// for its own dial and for those of the connections still dialing; one
// refused is not counted as dialing, and dialed gives a place back.
func TestAcceptedLeavesADescriptorPerDial(t *testing.T) {
	var c fdCeilings
	c.set(0)
	c.conns.Store(100)
	if c.accepted(fdConn(99)) {
		t.Error("a connection on descriptor 99 kept under a ceiling of 100: its dial would need 100")
	}
	if n := c.dialing.Load(); n != 0 {
		t.Fatalf("a refused connection left %d dialing, want 0", n)
	}
	if !c.accepted(fdConn(98)) {
		t.Fatal("a connection on descriptor 98 refused under a ceiling of 100")
	}
	if c.accepted(fdConn(98)) {
		t.Error("a second connection on 98 kept while the first still dials: two dials need 99 and 100")
	}
	if n := c.dialing.Load(); n != 1 {
		t.Fatalf("%d dialing, want 1", n)
	}
	c.dialed()
	if !c.accepted(fdConn(98)) {
		t.Error("a connection on 98 refused once the one before it dialed")
	}
	c.dialed()
	if !c.accepted(fdConn(-1)) {
		t.Error("a connection whose descriptor cannot be read refused")
	}
	c.dialed()
	if n := c.dialing.Load(); n != 0 {
		t.Errorf("%d dialing after every dial ended, want 0", n)
	}
}

// TestKeepFDEndsWhatItRefuses: a socket refused for the reserve, or as a
// listener past the listeners' bound, is ended there and then, and the
// error says why; one kept is left alone.
func TestKeepFDEndsWhatItRefuses(t *testing.T) {
	p := newTestProxier(t, Config{})
	p.fds.set(100) // ceiling 75
	p.fds.measured.Store(true)
	p.fds.maxListeners.Store(p.fds.listeners.Load())
	for _, tc := range []struct {
		name  string
		check func(end func()) error
		want  error
	}{
		{"connection in the reserve", func(end func()) error { return p.keepFD(75, end) }, syscall.EMFILE},
		{"connection below the ceiling", func(end func()) error { return p.keepFD(74, end) }, nil},
		{"listener in the reserve", func(end func()) error { return p.keepListener(80, end) }, syscall.EMFILE},
		{"listener past the bound", func(end func()) error { return p.keepListener(40, end) }, errListenerRoom},
	} {
		ended := false
		err := tc.check(func() { ended = true })
		if tc.want == nil {
			if err != nil || ended {
				t.Errorf("%s: %v, ended %v; want it kept", tc.name, err, ended)
			}
			continue
		}
		if !errors.Is(err, tc.want) || !ended {
			t.Errorf("%s: %v, ended %v; want %v, and the socket ended", tc.name, err, ended, tc.want)
		}
	}
}

// TestCountListenerPassesAnUnreadableListener: a listener whose
// descriptor cannot be read is returned as it is, uncounted.
func TestCountListenerPassesAnUnreadableListener(t *testing.T) {
	p := newTestProxier(t, Config{})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	ln := struct{ net.Listener }{inner} // hides SyscallConn
	before := p.fds.listeners.Load()
	got, err := p.CountListener(ln)
	if err != nil || got != ln {
		t.Fatalf("CountListener of an unreadable listener: %v, %v; want it back as it is", got, err)
	}
	if n := p.fds.listeners.Load(); n != before {
		t.Errorf("%d listeners counted, want %d", n, before)
	}
}

// TestMovedSessionsEdges: what the moved sessions' memory answers, at its
// edges: not on the port the session moved from, not for another
// protocol, until exactly its expiry; an expired entry is forgotten when
// looked up; and when full, expired entries make room and a client
// already remembered is updated.
func TestMovedSessionsEdges(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	udp := spn("dns", "dns", state.UDP)
	renamed := spn("dns", "domain", state.UDP)
	client := netip.MustParseAddrPort("10.0.0.1:5353")
	ep := netip.MustParseAddrPort("10.1.0.1:53")
	left := 10 * time.Second
	until := now.Add(left + movedGrace)

	var m movedSessions
	if n := m.remember(udp, []liveSession{{client: client, endpoint: ep, left: left}}, 1, now); n != 0 {
		t.Fatalf("remember dropped %d", n)
	}
	if got, ok := m.endpoint(renamed, client, 1, now); ok {
		t.Errorf("on the port it moved from: %s, want balanced afresh", got)
	}
	if got, ok := m.endpoint(renamed, client, 2, until.Add(-time.Nanosecond)); !ok || got != ep {
		t.Errorf("on another port just before expiry: %s, %v; want %s", got, ok, ep)
	}
	tcp := udp
	tcp.Protocol = state.TCP
	if got, ok := m.endpoint(tcp, client, 2, now); ok {
		t.Errorf("the same Service's TCP: %s, want nothing", got)
	}
	if got, ok := m.endpoint(renamed, client, 2, until); ok {
		t.Errorf("at expiry: %s, want forgotten", got)
	}
	if n := m.len(); n != 0 {
		t.Errorf("%d remembered after an expired one was looked up, want 0", n)
	}

	// Full of sessions that expire at until.
	full := make([]liveSession, maxMoved)
	for i := range full {
		full[i] = liveSession{client: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), 1000), endpoint: ep, left: left}
	}
	if n := m.remember(udp, full, 1, now); n != 0 {
		t.Fatalf("remember dropped %d of %d", n, maxMoved)
	}
	other := netip.MustParseAddrPort("10.1.0.2:53")
	if n := m.remember(udp, []liveSession{{client: full[0].client, endpoint: other, left: left}}, 3, now); n != 0 {
		t.Errorf("a client already remembered, moved again while full: %d dropped, want 0", n)
	}
	if got, ok := m.endpoint(renamed, full[0].client, 1, now); !ok || got != other {
		t.Errorf("a client moved again while full: %s, %v; want its new endpoint %s", got, ok, other)
	}
	if n := m.remember(udp, []liveSession{{client: client, endpoint: ep, left: left}}, 1, now); n != 1 {
		t.Errorf("a new client while full of live sessions: %d dropped, want 1", n)
	}
	if n := m.remember(udp, []liveSession{{client: client, endpoint: ep, left: left}}, 1, until); n != 0 {
		t.Errorf("a new client once the others expired: %d dropped, want 0", n)
	}
	if got, ok := m.endpoint(renamed, client, 2, until); !ok || got != ep {
		t.Errorf("a client remembered once the others expired: %s, %v; want %s", got, ok, ep)
	}
}

// TestHostAddrsKeptWhileNeeded: this host's addresses are kept, unmapped
// and without zones, while a Service needs them; a failed read keeps the
// list before it; once no Service needs them, none are kept.
func TestHostAddrsKeptWhileNeeded(t *testing.T) {
	fail := false
	p := newTestProxier(t, Config{LocalAddrs: func() ([]netip.Addr, error) {
		if fail {
			return nil, errors.New("netlink: no answer")
		}
		return []netip.Addr{netip.MustParseAddr("::ffff:192.0.2.7"), netip.MustParseAddr("fe80::1%eth0")}, nil
	}})
	want := []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("fe80::1")}
	p.readHostAddrs(true, nil)
	if got := p.HostAddrs(); !slices.Equal(got, want) {
		t.Fatalf("HostAddrs = %v, want %v", got, want)
	}
	if !p.isHostAddr(netip.MustParseAddr("192.0.2.7")) || !p.isHostAddr(netip.MustParseAddr("::ffff:192.0.2.7")) {
		t.Error("192.0.2.7, plain or IPv4-mapped, is not taken for this host's")
	}
	fail = true
	p.readHostAddrs(true, nil)
	if got := p.HostAddrs(); !slices.Equal(got, want) {
		t.Errorf("after a failed read, HostAddrs = %v, want the list before it, %v", got, want)
	}
	p.readHostAddrs(false, nil)
	if got := p.HostAddrs(); got != nil || p.isHostAddr(want[0]) {
		t.Errorf("with no Service needing them, HostAddrs = %v, want none", got)
	}
}

// TestAddressesUnmapped: a Service address or a pod's given or met as an
// IPv4-mapped IPv6 address (a dual-stack socket's view of IPv4) counts as
// the IPv4 address it maps; node ports refused on loopback or on a
// service address are refused there too, and only node-port sockets
// refuse them.
func TestAddressesUnmapped(t *testing.T) {
	p := newTestProxier(t, Config{NoLocalhostNodePorts: true, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
	front := state.ServicePort{Name: spn("web", "", state.TCP), Port: 80, ClusterIPs: []netip.Addr{netip.MustParseAddr("::ffff:198.18.0.10")}}
	fronts := frontendsOf(state.NewSnapshot([]state.ServicePort{front}))
	if !fronts[netip.MustParseAddr("198.18.0.10")] {
		t.Fatalf("frontends %v, want 198.18.0.10", fronts)
	}
	p.frontendAddrs.Store(&fronts)
	if !p.isPod(netip.MustParseAddr("::ffff:10.244.1.2")) {
		t.Error("a pod's IPv4-mapped address is not taken for a pod's")
	}
	sp := &servicePort{p: p, name: front.Name}
	client := netip.MustParseAddrPort("192.0.2.1:4000")
	for _, tc := range []struct {
		dst     string
		refused bool
	}{
		{"::ffff:127.0.0.1", true},
		{"127.0.0.1", true},
		{"::ffff:198.18.0.10", true},
		{"198.18.0.10", true},
		{"192.0.2.9", false},
	} {
		dst := netip.MustParseAddr(tc.dst)
		if got := p.NodePortAddrRefused(dst); got != tc.refused {
			t.Errorf("node port at %s refused %v, want %v", dst, got, tc.refused)
		}
		if got := sp.nodePortRefuses(roleNodePort, dst, client); got != tc.refused {
			t.Errorf("node-port socket at %s refuses %v, want %v", dst, got, tc.refused)
		}
		if sp.nodePortRefuses(roleFrontend, dst, client) {
			t.Errorf("a frontend socket at %s refuses as a node port", dst)
		}
	}
}

// TestHostAddrsListsUnmapped: the host's interface addresses are listed
// as netip addresses of their own family: IPv4 ones unmapped (the net
// package hands them over in 16 bytes).
func TestHostAddrsListsUnmapped(t *testing.T) {
	addrs, err := HostAddrs()
	if err != nil {
		skipOrFail(t, "no interface addresses: %v", err)
	}
	loop := false
	for _, a := range addrs {
		if a.Is4In6() {
			t.Errorf("%s listed IPv4-mapped", a)
		}
		loop = loop || a == netip.MustParseAddr("127.0.0.1")
	}
	if !loop {
		skipOrFail(t, "127.0.0.1 not among %v", addrs)
	}
}
