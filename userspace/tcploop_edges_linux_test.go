//go:build linux && !goroutines

package userspace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// rawClient returns a non-blocking IPv4 TCP socket, closed when the test
// ends: made before descriptors run out, it can still connect.
func rawClient(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// connectRaw starts connecting fd to addr, an IPv4 address; on loopback
// the handshake is done by the time it returns.
func connectRaw(fd int, addr netip.AddrPort) error {
	err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()})
	if err == unix.EINPROGRESS {
		return nil
	}
	return err
}

// readRaw reads what non-blocking socket fd has, waiting up to d for it.
func readRaw(fd int, d time.Duration) ([]byte, error) {
	deadline := time.Now().Add(d)
	buf := make([]byte, 64)
	for {
		n, err := unix.Read(fd, buf)
		switch {
		case err == nil:
			return buf[:n], nil
		case err != unix.EAGAIN && err != unix.EINTR:
			return nil, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, os.ErrDeadlineExceeded
		}
		_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left/time.Millisecond)+1)
	}
}

// servedTCP returns a proxier serving one TCP service port, named after
// svc, in front of be, and its proxy port's address, once a first
// connection through it (which starts the loops and fills the pipe pool)
// has ended.
func servedTCP(t *testing.T, cfg Config, svc string, be *tcpBackend) (*Proxier, netip.AddrPort) {
	t.Helper()
	p := newTestProxier(t, cfg)
	name := spn(svc, "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	addr := netip.MustParseAddrPort(proxyAddr(t, p, name))
	if got := tcpWho(t, addr.String()); got != be.name {
		t.Fatalf("reached %q, want %s", got, be.name)
	}
	settleNoTCPActive(t, p, "the first connection ends")
	return p, addr
}

// TestLoopShedsAtTheDescriptorLimit: a client that connects while the
// process has no descriptor free is accepted on the spare's number and
// reset at once, counted as accepted and as shed, and the spare is taken
// back; a loop that then finds no other client waiting does not say that
// it lacks a spare. Once descriptors are free, clients are served again.
func TestLoopShedsAtTheDescriptorLimit(t *testing.T) {
	logs := captureLog(t, "0")
	be := startTCPBackend(t, "a")
	p, addr := servedTCP(t, Config{}, "emfile", be)
	accepted := p.stats.TCPAccepted.Load()
	fd := rawClient(t)
	var cerr error
	atDescriptorLimit(t, func() {
		if cerr = connectRaw(fd, addr); cerr != nil {
			return
		}
		// Counted once the client is reset. Nothing here may take a
		// descriptor, so no settle (its failure would).
		for deadline := time.Now().Add(10 * time.Second); p.stats.Shed.Load() == 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	})
	if cerr != nil {
		t.Fatalf("connect: %v", cerr)
	}
	if n := p.stats.Shed.Load(); n != 1 {
		t.Fatalf("Shed = %d, want 1", n)
	}
	if got, err := readRaw(fd, 5*time.Second); err != unix.ECONNRESET {
		t.Errorf("the client read %q, %v; want a reset", got, err)
	}
	if n := p.stats.TCPAccepted.Load() - accepted; n != 1 {
		t.Errorf("TCPAccepted up by %d, want 1: a shed connection was taken too", n)
	}
	if p.shed.missing.Load() {
		t.Error("the spare was not taken back")
	}
	klog.Flush()
	if logs.lineWith("Out of file descriptors or buffers; shedding new connections") == "" {
		t.Error("the shed is not logged")
	}
	if line := logs.lineWith("without a spare one"); line != "" {
		t.Errorf("with its spare in hand, the proxy logged %s", line)
	}
	if got := tcpWho(t, addr.String()); got != "a" {
		t.Fatalf("with descriptors free again: reached %q", got)
	}
}

// TestLoopBacksOffWithoutASpare: while the process has no descriptor free
// and no spare to shed a client with, a loop leaves the listening socket
// alone for acceptPause between attempts (it is level-triggered: a loop
// that came straight back would spin for as long as descriptors are
// short), and the client waits; once descriptors are free it is served.
func TestLoopBacksOffWithoutASpare(t *testing.T) {
	be := startTCPBackend(t, "a")
	p, addr := servedTCP(t, Config{}, "nospare", be)
	fd := rawClient(t)
	var opens atomic.Int64
	var full atomic.Bool
	full.Store(true)
	s := p.shed
	s.mu.Lock()
	s.dropSpareLocked()
	s.missing.Store(true)
	s.open = func() (*os.File, error) { // each attempt to shed tries to take the spare back
		opens.Add(1)
		if full.Load() {
			return nil, syscall.EMFILE
		}
		return os.Open(os.DevNull)
	}
	s.pause = func() {} // attempts as fast as they come, so that a spin shows
	s.mu.Unlock()

	const window = time.Second
	var cerr error
	var first, tries int64
	atDescriptorLimit(t, func() {
		if cerr = connectRaw(fd, addr); cerr != nil {
			return
		}
		for deadline := time.Now().Add(10 * time.Second); opens.Load() == 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		first = opens.Load()
		time.Sleep(window) // the time over which the attempts are counted
		tries = opens.Load() - first
	})
	full.Store(false)
	if cerr != nil {
		t.Fatalf("connect: %v", cerr)
	}
	if first == 0 {
		t.Fatal("no loop tried to take the client within 10s")
	}
	// spareTries attempts per acceptPause (100 ms) on each loop, some 30
	// a second; a loop that spins makes many thousands. The bound is four
	// times that, whatever acceptPause says: a pause much shorter would be
	// a spin too.
	if most := 4 * int64(len(p.loops)) * spareTries * int64(window/(100*time.Millisecond)); tries > most {
		t.Errorf("%d attempts to shed in %v with %d loops, want at most %d: the loops spin", tries, window, len(p.loops), most)
	}
	if got, err := readRaw(fd, 5*time.Second); err != nil || string(got) != "a\n" {
		t.Fatalf("once descriptors were free the waiting client read %q, %v; want it served", got, err)
	}
}

// TestNodePortOffLoopbackWithNoLocalhostNodePorts: a node port served on
// every address refuses, with a reset, a client that reached it on a
// loopback address when NoLocalhostNodePorts is set
// (--iptables-localhost-nodeports=false), and serves it otherwise.
func TestNodePortOffLoopbackWithNoLocalhostNodePorts(t *testing.T) {
	be := startTCPBackend(t, "a")
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprint("NoLocalhostNodePorts=", refuse), func(t *testing.T) {
			np := freePort(t, "0.0.0.0")
			p := newTestProxier(t, Config{ServeNodePorts: true, NoLocalhostNodePorts: refuse})
			name := spn("np", "", state.TCP)
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, NodePort: np, ClusterEndpoints: eps(be.addr())})
			addr := fmt.Sprintf("127.0.0.1:%d", np)
			if !refuse {
				if got := tcpWho(t, addr); got != "a" {
					t.Fatalf("node port on loopback reached %q, want a", got)
				}
				return
			}
			if err := connectAndRead(addr); !isReset(err) {
				t.Fatalf("node port on loopback: %v, want a reset", err)
			}
			if d, a := p.stats.TCPDialFailures.Load(), p.stats.TCPActive.Load(); d != 0 || a != 0 {
				t.Fatalf("the refused client was proxied: %d failed dials, %d connections", d, a)
			}
		})
	}
}

// endpointSocket returns the proxy's socket to endpoint, its only
// connection's.
func endpointSocket(t *testing.T, p *Proxier, endpoint netip.AddrPort) int {
	t.Helper()
	dialed := -1
	settle(t, "the connection is tracked", func() error {
		for _, fd := range p.connFDs() {
			sa, err := unix.Getpeername(fd)
			if err != nil {
				continue
			}
			if in4, ok := sa.(*unix.SockaddrInet4); ok && netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)) == endpoint {
				dialed = fd
				return nil
			}
		}
		return errors.New("no socket to the endpoint")
	})
	return dialed
}

// TestProxyHeaderIsTheFirstWrite: the PROXY protocol header is the
// endpoint's socket's first write, so the client's first bytes after it
// are its second, and go with TCP_NODELAY: Nagle's algorithm would hold
// them back until the header was acknowledged.
func TestProxyHeaderIsTheFirstWrite(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	endpoint := ln.Addr().(*net.TCPAddr).AddrPort()
	p := newTestProxier(t, Config{})
	name := spn("pp", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(endpoint), ProxyProtocol: state.ProxyProtocolV1})
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b net.Conn
	select {
	case b = <-accepted:
		defer b.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the endpoint got no connection")
	}
	r := bufio.NewReader(b)
	_ = b.SetReadDeadline(time.Now().Add(10 * time.Second))
	if header, err := r.ReadString('\n'); err != nil || len(header) < len("PROXY TCP4") {
		t.Fatalf("the endpoint read %q, %v; want the PROXY header", header, err)
	}
	dialed := endpointSocket(t, p, endpoint)
	if _, err := c.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	if got, err := r.ReadString('\n'); err != nil || got != "hi\n" {
		t.Fatalf("the endpoint read %q, %v; want the client's hi", got, err)
	}
	if got := tcpOptsOf(dialed); got.noDelay != 1 {
		t.Errorf("the endpoint's socket after the header and the client's first write: TCP_NODELAY=%d, want 1", got.noDelay)
	}
}

// TestFirstWriteOfOneSegmentLeavesNagleOn: a first write to the endpoint
// of oneSegment bytes goes out at once with or without Nagle's algorithm,
// so it costs no setsockopt (TestBigFirstWriteSetsNoDelay has the next
// byte up).
func TestFirstWriteOfOneSegmentLeavesNagleOn(t *testing.T) {
	c, b, _, dialed := proxiedSockets(t)
	send(t, c, b, bytes.Repeat([]byte("x"), oneSegment))
	if got := tcpOptsOf(dialed); got.noDelay != 0 {
		t.Errorf("dialed socket after a first write of %d bytes: TCP_NODELAY=%d, want 0 (set late)", oneSegment, got.noDelay)
	}
}

// TestTCPHalfCloseWaitsForQueuedRequest is TestTCPHalfCloseWaitsForQueuedAnswer
// the other way round: the endpoint answers and half-closes first, and
// the client's request, which the proxy has written whole into its socket
// to the endpoint, waits there unsent for the endpoint, which has paused
// reading (a 4 KiB receive buffer), past the half-close timeout. The
// connection is not silent; once the endpoint has read it all and the
// client stays silent, the timeout applies again.
func TestTCPHalfCloseWaitsForQueuedRequest(t *testing.T) {
	const timeout = 300 * time.Millisecond
	request := bytes.Repeat([]byte("0123456789abcdef"), 64<<10/16)
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *net.TCPConn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c.(*net.TCPConn)
		}
	}()
	p := newTestProxier(t, Config{TCPHalfCloseTimeout: timeout})
	name := spn("upload", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b *net.TCPConn
	select {
	case b = <-accepted:
		defer b.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the endpoint got no connection")
	}
	if _, err := b.Write([]byte("ready\n")); err != nil {
		t.Fatal(err)
	}
	if err := b.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := io.ReadAll(c); err != nil || string(got) != "ready\n" {
		t.Fatalf("the client read %q, %v; want the answer and EOF", got, err)
	}
	if _, err := c.Write(request); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * timeout) // an endpoint that has paused, past the timeout
	_ = b.SetReadDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, len(request))
	if n, err := io.ReadFull(b, got); err != nil {
		t.Fatalf("the endpoint read %d of %d bytes and then %v, want all of them (half-close timeouts: %d)", n, len(request), err, p.stats.HalfCloseTimeouts.Load())
	}
	if !bytes.Equal(got, request) {
		t.Fatal("the request arrived changed")
	}
	start := time.Now()
	if _, err := b.Read(make([]byte, 1)); !isReset(err) || time.Since(start) > 5*time.Second {
		t.Fatalf("after the request, with the client silent, the endpoint read %v after %v, want a reset within the timeout", err, time.Since(start))
	}
	if n := p.stats.HalfCloseTimeouts.Load(); n != 1 {
		t.Fatalf("half-close timeouts = %d, want 1", n)
	}
}

// loopBooks counts what the loops of p hold for TCP: the handlers of
// listening sockets, connections and dial attempts, and timers.
func loopBooks(p *Proxier) (handlers, timers int) {
	for _, lp := range p.loops {
		lp.do(func() {
			for _, h := range lp.handlers {
				switch h.(type) {
				case *tcpAccepter, *connSide, *racer:
					handlers++
				}
			}
			timers += len(lp.timers)
		})
	}
	return handlers, timers
}

// TestLoopsForgetEndedConnections: a connection open and idle, with
// keep-alive on, holds no timer in its loop; once it has ended, its loop
// holds neither a handler for its sockets nor its timer, whatever the
// timer was for (here the half-close timeout, five minutes away). Once
// the service port goes, no loop holds a handler for its listening
// socket.
func TestLoopsForgetEndedConnections(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("books", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	handlers, timers := loopBooks(p) // the listening socket's, and none
	c, r := greeted(t, p, name, "a")
	dialed := endpointSocket(t, p, be.addr())
	settleWithin(t, keepAliveAfter+5*time.Second, "keep-alive on the dialed socket", func() error {
		if got := tcpOptsOf(dialed); got.keepAlive != 1 {
			return fmt.Errorf("dialed socket: %+v, want keep-alive on", got)
		}
		return nil
	})
	settle(t, "the idle connection holds no timer", func() error {
		if h, n := loopBooks(p); h != handlers+2 || n != timers {
			return fmt.Errorf("%d handlers and %d timers, want %d and %d", h, n, handlers+2, timers)
		}
		return nil
	})
	// The client's FIN half-closes the connection (a timer), the backend
	// closes in turn, and the connection ends.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Fatalf("after the client's FIN it read %q, %v; want EOF", rest, err)
	}
	settle(t, "the loops forget the connection", func() error {
		if h, n := loopBooks(p); h != handlers || n != timers {
			return fmt.Errorf("%d handlers and %d timers, want %d and %d as before it", h, n, handlers, timers)
		}
		if a := p.stats.TCPActive.Load(); a != 0 {
			return fmt.Errorf("%d connections active", a)
		}
		return nil
	})
	mustApply(t, p)
	if h, n := loopBooks(p); h != 0 || n != 0 {
		t.Fatalf("with no service port the loops hold %d handlers and %d timers, want none", h, n)
	}
}

// drainPipePool closes the pipes the pool holds, and reports how many of
// them held data.
func drainPipePool() (dirty int) {
	for {
		select {
		case pp := <-idlePipes:
			// TIOCINQ is FIONREAD: the bytes waiting in the pipe.
			if n, err := unix.IoctlGetInt(pp.r, unix.TIOCINQ); err == nil && n > 0 {
				dirty++
			}
			pp.close()
		default:
			return dirty
		}
	}
}

// TestPipeWithDataIsNotReused: a connection that ends with data still in
// a splice pipe (a client that stopped reading a bulk answer, cut off by
// Close) closes that pipe rather than give it back to the pool, where
// the next connection to splice would send that data to its own peer.
func TestPipeWithDataIsNotReused(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	blocked := make(chan struct{})
	go func() { // an endpoint that sends until nothing more fits on the way
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		chunk := make([]byte, 64<<10)
		for sent := 0; sent < 256<<20; {
			_ = c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
			n, err := c.Write(chunk)
			sent += n
			if err != nil {
				break
			}
		}
		close(blocked)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		io.Copy(io.Discard, c)
	}()
	p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1")})
	defer p.Close()
	name := spn("bulk", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	drainPipePool()
	select {
	case <-blocked: // the client reads nothing: its socket, the proxy's pipe and the endpoint's socket are full
	case <-time.After(20 * time.Second):
		t.Fatal("the endpoint never blocked: the proxy reads without bound")
	}
	p.Close() // ends the connection with data in its pipe
	if n := drainPipePool(); n != 0 {
		t.Fatalf("%d pipes with data in them went back to the pool", n)
	}
}

// TestLoopsAtTheCeilingDoNotPark: a loop parks through a duplicate of its
// epoll descriptor, which it holds while parked; when that duplicate
// would be at or above the data plane's ceiling (fdreserve.go), the loop
// closes it and waits in epoll_wait instead, and leaks nothing. Once
// below the ceiling again, idle loops park.
func TestLoopsAtTheCeilingDoNotPark(t *testing.T) {
	be := startTCPBackend(t, "a")
	p, _ := servedTCP(t, Config{}, "ceiling", be)
	allParked := func() error {
		for i, lp := range p.loops {
			if !lp.parked.Load() {
				return fmt.Errorf("loop %d of %d is not parked", i, len(p.loops))
			}
		}
		return nil
	}
	wake := func() {
		for _, lp := range p.loops {
			lp.do(func() {})
		}
	}
	settle(t, "every idle loop parks", allParked)
	fds := openFDs(t)
	p.fds.conns.Store(0) // no descriptor is the data plane's to keep
	wake()
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		for i, lp := range p.loops {
			if lp.parked.Load() {
				t.Fatalf("loop %d of %d parked on a descriptor above the ceiling", i, len(p.loops))
			}
		}
		time.Sleep(2 * time.Millisecond) // sampling, over a second of idle loops
	}
	if n := openFDs(t); n > fds+2 {
		t.Errorf("%d descriptors open, %d before: the loops leak their duplicates", n, fds)
	}
	p.fds.set(0)
	wake()
	settle(t, "every idle loop parks again", allParked)
}

// TestLoopRefusesSourcesWithoutAKernelFilter: on a load-balancer IP whose
// listening socket has no socket filter (a kernel that refused it, see
// TestLoadBalancerSourceRanges), the loop itself refuses a client outside
// loadBalancerSourceRanges: it resets the connection before any dial and
// counts it (SourceRefused). A client inside the ranges is served. Where
// the kernel filters, the loop never sees such a client, so the filter is
// taken off the socket here.
func TestLoopRefusesSourcesWithoutAKernelFilter(t *testing.T) {
	const lbIP, allowed, other = "127.0.0.4", "127.0.0.10", "127.0.0.11"
	be := startTCPBackend(t, "a")
	port := freePort(t, lbIP)
	p := newTestProxier(t, Config{ServeFrontends: true, DisableProxyPorts: true,
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil }})
	name := spn("lb", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: port, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(lbIP)},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix(allowed + "/32")}, ClusterEndpoints: eps(be.addr())})
	p.mu.Lock()
	for k, s := range p.services[name].sockets {
		if l, ok := s.(*tcpListener); ok && k.role == roleExternalFrontend {
			if err := unix.SetsockoptInt(l.fd, unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0); err != nil {
				t.Errorf("detach the socket filter of %v: %v", k.addr, err)
			}
		}
	}
	p.mu.Unlock()
	dst := net.JoinHostPort(lbIP, strconv.Itoa(int(port)))
	from := func(src string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		return d.Dial("tcp4", dst)
	}
	if got, err := tcpWhoDial(func() (net.Conn, error) { return from(allowed) }, dst); err != nil || got != "a" {
		t.Fatalf("from %s, inside the ranges: %q, %v; want a", allowed, got, err)
	}
	settleNoTCPActive(t, p, "the client inside the ranges is done")
	before := p.Stats().Snapshot()
	c, err := from(other)
	if err == nil { // else the reset came before connect returned
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if !isReset(err) {
		t.Fatalf("from %s, outside the ranges: %v; want a reset", other, err)
	}
	after := p.Stats().Snapshot()
	if n := after.SourceRefused - before.SourceRefused; n != 1 {
		t.Errorf("SourceRefused up by %d, want 1", n)
	}
	if after.TCPDialFailures != before.TCPDialFailures || after.TCPActive != 0 {
		t.Errorf("the refused client was dialled for: %+v, then %+v", before, after)
	}
}

// TestFailedListenCountsNoListener: a listening socket that could not be
// bound (its port taken by another program) gives its place among the
// listeners back (fdreserve.go): the count stays where it was, and the
// port is served once it is free.
func TestFailedListenCountsNoListener(t *testing.T) {
	be := startTCPBackend(t, "a")
	port := freePort(t)
	held, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	p := newTestProxier(t, Config{PortRange: PortRange{Base: port, Size: 1}})
	svc := state.ServicePort{Name: spn("taken", "", state.TCP), Port: 80, ClusterEndpoints: eps(be.addr())}
	before := p.fds.listeners.Load()
	for i := range 3 {
		if err := p.Apply(state.NewSnapshot([]state.ServicePort{svc})); !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("Apply %d with the range's only port taken: %v, want EADDRINUSE", i, err)
		}
		if n := p.fds.listeners.Load(); n != before {
			t.Fatalf("after %d failed listens %d listeners are counted, %d before", i+1, n, before)
		}
	}
	held.Close()
	mustApply(t, p, svc)
	if got := tcpWho(t, proxyAddr(t, p, svc.Name)); got != "a" {
		t.Fatalf("reached %q", got)
	}
	mustApply(t, p)
	if n := p.fds.listeners.Load(); n != before {
		t.Fatalf("%d listeners counted with none open, %d before", n, before)
	}
}

// TestCloseDialsNoQueuedConnection: connections the kernel queued on a
// listening socket that Close closes are not taken and dialled, as they
// are when only their Service goes (TestClosingListenerServesQueuedConnections):
// Close ends every connection, so their endpoints would only get a
// connection and its reset. The loops are made to leave the listening
// socket alone while the clients connect, as loops busy elsewhere would.
func TestCloseDialsNoQueuedConnection(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1")})
	defer p.Close()
	name := spn("closing", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	addr := proxyAddr(t, p, name)
	p.mu.Lock()
	for _, s := range p.services[name].sockets {
		if l, ok := s.(*tcpListener); ok {
			for _, a := range l.accepters {
				a.lp.do(func() { a.lp.unregister(l.fd) })
			}
		}
	}
	p.mu.Unlock()
	for range 3 {
		c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(500 * time.Millisecond))
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Fatal("Close dialled the endpoint for a connection queued on a listening socket it closed")
	}
}

// TestTCPFINFirstDrainEndsOnceDelivered: a drain without a deadline (the
// side that failed had sent its FIN first) ends once the reader has
// acknowledged all of it and the FIN, though the reader keeps its socket
// open after the EOF: not after finDrainStall (five minutes). The other
// tests of such drains have their reader close, which ends it too.
func TestTCPFINFirstDrainEndsOnceDelivered(t *testing.T) {
	const size = 16 << 10
	payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	f := newFINFirstConn(t, "endpoint", payload)
	_ = f.reader.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(f.reader)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("the client read %d of %d bytes, then %v; want all of them and EOF", len(got), size, err)
	}
	// The reader stays open: only the proxy can end the connection.
	f.ended(t, 10*time.Second)
}

// TestCloseLeavesNoDescriptor: Close gives back every descriptor the
// proxier opened: listening sockets, connections, and each loop's epoll
// and eventfd descriptors. (The splice pipes' pool is the process's; and
// the endpoint here echoes through a buffer, as io.Copy between two
// sockets would keep a pipe of Go's own until a garbage collection.)
func TestCloseLeavesNoDescriptor(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte("a\n"))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil {
			c.Write([]byte(line))
		}
	}()
	drainPipePool()
	before := fdTargets()
	p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1")})
	defer p.Close()
	name := spn("fds", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	if got := tcpWho(t, proxyAddr(t, p, name)); got != "a" {
		t.Fatalf("reached %q", got)
	}
	<-served
	if len(p.loops) == 0 {
		t.Fatal("no event loop")
	}
	p.Close()
	drainPipePool()
	// Earlier tests' descriptors may still be closing: what counts is
	// that none opened since is left.
	settle(t, "every descriptor given back", func() error {
		var left []string
		for fd, what := range fdTargets() {
			if before[fd] != what {
				left = append(left, fd+" "+what)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("descriptors opened since New still open: %v", left)
		}
		return nil
	})
}

// fdTargets lists this process's open descriptors and what each is.
func fdTargets() map[string]string {
	ents, _ := os.ReadDir("/proc/self/fd")
	m := make(map[string]string, len(ents))
	for _, e := range ents {
		m[e.Name()], _ = os.Readlink("/proc/self/fd/" + e.Name())
	}
	return m
}

// holdingEndpoint is an endpoint that accepts connections and keeps them,
// silent, until the test ends.
func holdingEndpoint(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// TestLoopTimersFireInDeadlineOrder: one loop's timers fire by their own
// deadlines, whatever others it holds: a connection half-closed a minute
// from its timeout does not hold back a newer one's keep-alive, due a
// second after it connected. One loop serves both.
func TestLoopTimersFireInDeadlineOrder(t *testing.T) {
	n := runtime.GOMAXPROCS(1) // one event loop
	t.Cleanup(func() { runtime.GOMAXPROCS(n) })
	first, second := holdingEndpoint(t), holdingEndpoint(t)
	p := newTestProxier(t, Config{TCPHalfCloseTimeout: time.Minute})
	a, b := spn("first", "", state.TCP), spn("second", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: a, Port: 80, ClusterEndpoints: eps(first)},
		state.ServicePort{Name: b, Port: 80, ClusterEndpoints: eps(second)})
	if len(p.loops) != 1 {
		t.Fatalf("%d event loops, want 1", len(p.loops))
	}
	keepAliveOn := func(fd int) func() error {
		return func() error {
			if got := tcpOptsOf(fd); got.keepAlive != 1 {
				return fmt.Errorf("dialed socket: %+v, want keep-alive on", got)
			}
			return nil
		}
	}
	c1, err := net.Dial("tcp4", proxyAddr(t, p, a))
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	settleWithin(t, keepAliveAfter+5*time.Second, "keep-alive on the first connection", keepAliveOn(endpointSocket(t, p, first)))
	if err := c1.(*net.TCPConn).CloseWrite(); err != nil { // its timer: the half-close timeout, a minute away
		t.Fatal(err)
	}
	c2, err := net.Dial("tcp4", proxyAddr(t, p, b))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	settleWithin(t, keepAliveAfter+5*time.Second, "keep-alive on the second connection", keepAliveOn(endpointSocket(t, p, second)))
}
