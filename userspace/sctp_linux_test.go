package userspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp/sctptest"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// The SCTP tests need a kernel with SCTP: `make test-sctp` runs them in a
// VM; elsewhere they skip (sctptest.Require).

func sctpBackends(t *testing.T, names ...string) ([]*sctptest.Backend, []state.Endpoint) {
	t.Helper()
	var bs []*sctptest.Backend
	var addrs []netip.AddrPort
	for _, n := range names {
		b := sctptest.StartBackend(t, n, netip.MustParseAddrPort("127.0.0.1:0"))
		bs = append(bs, b)
		addrs = append(addrs, b.Addr)
	}
	return bs, eps(addrs...)
}

func sctpProxyAddr(t *testing.T, p *Proxier, name state.ServicePortName) netip.AddrPort {
	t.Helper()
	return netip.MustParseAddrPort(proxyAddr(t, p, name))
}

// TestSCTPEcho: an SCTP service port on IPv4 and IPv6 proxy ports, with
// the association counted while open and gone after both sides closed.
func TestSCTPEcho(t *testing.T) {
	sctptest.Require(t)
	_, ep4 := sctpBackends(t, "a")
	b6 := sctptest.StartBackend(t, "six", netip.MustParseAddrPort("[::1]:0"))
	p := newTestProxier(t, Config{BindAddress: netip.IPv4Unspecified()})
	n4, n6 := spn("sig", "", state.SCTP), spn("sig6", "", state.SCTP)
	mustApply(t, p,
		state.ServicePort{Name: n4, Port: 3868, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.10")}, ClusterEndpoints: ep4},
		state.ServicePort{Name: n6, Port: 3868, ClusterIPs: []netip.Addr{netip.MustParseAddr("fd5e:b1b5::10")}, ClusterEndpoints: eps(b6.Addr)})
	if got := sctptest.WhoAt(t, sctpProxyAddr(t, p, n4)); got != "a" {
		t.Fatalf("IPv4 reached %q", got)
	}
	if got := sctptest.WhoAt(t, netip.AddrPortFrom(netip.IPv6Loopback(), p.ProxyPort(n6))); got != "six" {
		t.Fatalf("IPv6 reached %q", got)
	}
	c := sctptest.Dial(t, sctpProxyAddr(t, p, n4), sctp.Options{})
	if got, _, err := sctptest.Ask(c, []byte("ping"), sctp.Info{}); err != nil || string(got) != "ping" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	if n := p.Stats().SCTPActive.Load(); n != 1 {
		t.Errorf("%d active associations, want 1", n)
	}
	c.Close()
	settle(t, "associations after close", func() error {
		if n := p.Stats().SCTPActive.Load(); n != 0 {
			return fmt.Errorf("%d active", n)
		}
		return nil
	})
	var listeners []string
	for _, l := range p.Listeners() {
		listeners = append(listeners, l.Addr.String())
	}
	if len(listeners) != 2 {
		t.Errorf("listeners %v, want one per service port", listeners)
	}
}

// TestSCTPRoundRobin: associations go to three backends in turn.
func TestSCTPRoundRobin(t *testing.T) {
	sctptest.Require(t)
	_, endpoints := sctpBackends(t, "a", "b", "c")
	p := newTestProxier(t, Config{})
	name := spn("rr", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: endpoints})
	addr := sctpProxyAddr(t, p, name)
	var got []string
	for range 6 {
		got = append(got, sctptest.WhoAt(t, addr))
	}
	for i := range 3 {
		if got[i] != got[i+3] || got[i] == got[(i+1)%3] {
			t.Fatalf("not round robin: %v", got)
		}
	}
}

// TestSCTPAffinity: ClientIP affinity keeps a client on one backend; with
// it off the same client is spread again.
func TestSCTPAffinity(t *testing.T) {
	sctptest.Require(t)
	_, endpoints := sctpBackends(t, "a", "b", "c")
	p := newTestProxier(t, Config{})
	name := spn("sticky", "", state.SCTP)
	spec := state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: endpoints,
		Affinity: state.Affinity{Type: state.AffinityClientIP, Timeout: time.Hour}}
	mustApply(t, p, spec)
	addr := sctpProxyAddr(t, p, name)
	first := sctptest.WhoAt(t, addr)
	for range 5 {
		if got := sctptest.WhoAt(t, addr); got != first {
			t.Fatalf("affinity broken: %q then %q", first, got)
		}
	}
	spec.Affinity = state.Affinity{}
	mustApply(t, p, spec)
	seen := map[string]bool{}
	for range 3 {
		seen[sctptest.WhoAt(t, addr)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("affinity off: reached %v", seen)
	}
}

// TestSCTPTransferVerified: 1 MiB each way in 64 KiB messages, and one
// 300 KB message that the proxy reassembles, arrive intact.
func TestSCTPTransferVerified(t *testing.T) {
	sctptest.Require(t)
	_, endpoints := sctpBackends(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("bulk", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: endpoints})
	c := sctptest.Dial(t, sctpProxyAddr(t, p, name), sctp.Options{SendBuffer: 1 << 20})
	c.SetDeadline(time.Now().Add(60 * time.Second))

	payload := make([]byte, 1<<20)
	for i := range payload {
		payload[i] = byte(i*7 + i>>11)
	}
	want := sha256.Sum256(payload)
	errc := make(chan error, 1)
	go func() {
		for off := 0; off < len(payload); off += 64 << 10 {
			if _, err := c.WriteMsg(payload[off:off+64<<10], sctp.Info{Stream: 1}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	h := sha256.New()
	buf := make([]byte, 128<<10)
	for got := 0; got < len(payload); {
		n, info, err := c.ReadMsg(buf)
		if err != nil {
			t.Fatalf("after %d bytes: %v", got, err)
		}
		if n != 64<<10 || info.Stream != 1 {
			t.Fatalf("message of %d bytes on stream %d, want 65536 on 1", n, info.Stream)
		}
		h.Write(buf[:n])
		got += n
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("1 MiB came back changed")
	}

	big := bytes.Repeat([]byte("0123456789"), 30_000)
	got, _, err := sctptest.Ask(c, big, sctp.Info{PPID: 9})
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("300 KB message: %d bytes back, %v", len(got), err)
	}
}

// TestSCTPMessagesStreamsAndPPID: messages keep their boundaries, stream
// ids, PPIDs and ordering flag through the proxy, both ways, on every
// stream the client opened.
func TestSCTPMessagesStreamsAndPPID(t *testing.T) {
	sctptest.Require(t)
	_, endpoints := sctpBackends(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("msgs", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: endpoints})
	c := sctptest.Dial(t, sctpProxyAddr(t, p, name), sctp.Options{OutStreams: 20})
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if in, _, err := c.Streams(); err != nil || in < 20 {
		t.Fatalf("the proxy granted %d streams to the client (%v), want at least 20", in, err)
	}
	// Send them all before reading any, so they travel together and a
	// relay that merged or split them would show it.
	sent := []struct {
		data string
		info sctp.Info
	}{
		{"a", sctp.Info{Stream: 0, PPID: 46}},
		{"bb", sctp.Info{Stream: 19, PPID: 0x3c000000}},
		{"ccc", sctp.Info{Stream: 7, PPID: 60, Unordered: true}},
		{string(bytes.Repeat([]byte("d"), 5000)), sctp.Info{Stream: 12, PPID: 1}},
		{"e", sctp.Info{Stream: 19, PPID: 2}},
	}
	for _, m := range sent {
		if _, err := c.WriteMsg([]byte(m.data), m.info); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]sctp.Info{}
	buf := make([]byte, 8192)
	for range sent {
		n, info, err := c.ReadMsg(buf)
		if err != nil {
			t.Fatal(err)
		}
		got[string(buf[:n])] = info
	}
	for _, m := range sent {
		info, ok := got[m.data]
		if !ok {
			t.Fatalf("message of %d bytes did not come back whole; got %d messages", len(m.data), len(got))
		}
		if info != m.info {
			t.Errorf("message %.8q came back with %+v, want %+v", m.data, info, m.info)
		}
	}
}

// TestSCTPFailover: a dead endpoint is passed over at connect time.
func TestSCTPFailover(t *testing.T) {
	sctptest.Require(t)
	// The live one first: a port freed by the dead one's close could be
	// given to it, and both endpoints would then be live (one CI run).
	_, live := sctpBackends(t, "live")
	dead := sctptest.StartBackend(t, "dead", netip.MustParseAddrPort("127.0.0.1:0"))
	dead.Close()
	p := newTestProxier(t, Config{})
	name := spn("failover", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: append(eps(dead.Addr), live...)})
	addr := sctpProxyAddr(t, p, name)
	for range 4 {
		if got := sctptest.WhoAt(t, addr); got != "live" {
			t.Fatalf("reached %q", got)
		}
	}
	if n := p.Stats().SCTPDialFailures.Load(); n == 0 {
		t.Fatal("no failed dial counted; the dead endpoint was never tried")
	}
}

// TestSCTPNoEndpointsAborts: with no endpoints a client's association is
// aborted at once: the client sees the abort while its connect completes,
// or on its first read.
func TestSCTPNoEndpointsAborts(t *testing.T) {
	sctptest.Require(t)
	p := newTestProxier(t, Config{})
	name := spn("empty", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := sctp.Dial(ctx, sctpProxyAddr(t, p, name), sctp.Options{})
	if err == nil {
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _, err = c.ReadMsg(make([]byte, 16))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("association to a port without endpoints: %v, want an abort (ECONNRESET)", err)
	}
	if n := p.Stats().SCTPNoEndpoints.Load(); n != 1 {
		t.Errorf("%d counted without endpoints, want 1", n)
	}
}

// TestSCTPShutdownEndsBothSides: SCTP has no half-close, so when either
// side shuts its association down, the proxy ends both; what was sent
// before arrives. Goroutines return to their baseline.
func TestSCTPShutdownEndsBothSides(t *testing.T) {
	sctptest.Require(t)
	ln, err := sctp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), sctp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := newTestProxier(t, Config{})
	name := spn("shut", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: eps(ln.Addr())})
	addr := sctpProxyAddr(t, p, name)
	base := runtime.NumGoroutine()

	// The client sends and shuts down: the backend reads the message, then
	// EOF.
	c := sctptest.Dial(t, addr, sctp.Options{})
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	s.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.WriteMsg([]byte("last words"), sctp.Info{}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	buf := make([]byte, 64)
	if n, _, err := s.ReadMsg(buf); err != nil || string(buf[:n]) != "last words" {
		t.Fatalf("backend read %q, %v", buf[:n], err)
	}
	if _, _, err := s.ReadMsg(buf); err != io.EOF {
		t.Fatalf("backend after the client's shutdown: %v, want EOF", err)
	}
	s.Close()

	// The backend answers and shuts down: the client reads the answer,
	// then EOF.
	c = sctptest.Dial(t, addr, sctp.Options{})
	c.SetDeadline(time.Now().Add(10 * time.Second))
	s, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteMsg([]byte("bye"), sctp.Info{Stream: 2}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if n, info, err := c.ReadMsg(buf); err != nil || string(buf[:n]) != "bye" || info.Stream != 2 {
		t.Fatalf("client read %q on stream %d, %v", buf[:n], info.Stream, err)
	}
	if _, _, err := c.ReadMsg(buf); err != io.EOF {
		t.Fatalf("client after the backend's shutdown: %v, want EOF", err)
	}
	c.Close()
	settle(t, "associations and goroutines", func() error {
		if n := p.Stats().SCTPActive.Load(); n != 0 {
			return fmt.Errorf("%d active associations", n)
		}
		if g := runtime.NumGoroutine(); g > base {
			return fmt.Errorf("%d goroutines, %d before", g, base)
		}
		return nil
	})
}

// TestSCTPCloseEndsAssociations: closing the proxier aborts live
// associations and stops its SCTP goroutines.
func TestSCTPCloseEndsAssociations(t *testing.T) {
	sctptest.Require(t)
	_, endpoints := sctpBackends(t, "a")
	base := runtime.NumGoroutine()
	p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1")})
	name := spn("closing", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: endpoints})
	c := sctptest.Dial(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), p.ProxyPort(name)), sctp.Options{})
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if got, _, err := sctptest.Ask(c, []byte("x"), sctp.Info{}); err != nil || string(got) != "x" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	p.Close()
	if _, _, err := c.ReadMsg(make([]byte, 8)); err == nil || isDeadline(err) {
		t.Fatalf("association survived Close: %v", err)
	}
	settle(t, "goroutines after Close", func() error {
		if g := runtime.NumGoroutine(); g > base {
			return fmt.Errorf("%d goroutines, %d before", g, base)
		}
		return nil
	})
}

func isDeadline(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// TestSCTPAssociationsKeepTheReserve: associations keep no descriptor at
// or above the data plane's ceiling (fdreserve.go), as TCP connections
// keep none: a client that would need one is aborted and counted as shed,
// the clients already served go on, and once descriptors are below the
// ceiling again clients are served. Before, associations were kept
// whatever their descriptors' numbers, and could take the reserve.
func TestSCTPAssociationsKeepTheReserve(t *testing.T) {
	sctptest.Require(t)
	_, ep := sctpBackends(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("sig", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: ep})
	addr := sctpProxyAddr(t, p, name)
	if got := sctptest.WhoAt(t, addr); got != "a" {
		t.Fatalf("reached %q", got)
	}

	// Room for a few associations: each takes four descriptors in this
	// process (client, accepted, dialed, the backend's).
	p.fds.conns.Store(ceilingLeaving(16))
	var held []*sctp.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	served, shed := 0, false
	for i := 0; i < 20 && !shed; i++ {
		c, got, err := dialAndAsk(addr, "ping")
		if c != nil {
			held = append(held, c)
		}
		if err == nil && string(got) != "ping" {
			t.Fatalf("client %d: echo %q", i, got)
		}
		switch {
		case err == nil:
			served++
		case errors.Is(err, syscall.ECONNRESET):
			shed = true
		default:
			t.Fatalf("client %d: %v (neither served nor aborted)", i, err)
		}
	}
	if !shed {
		t.Fatal("20 clients served with room for about four")
	}
	if served == 0 {
		t.Fatal("the first client was aborted, with room for about four")
	}
	// The count may come just after the abort the client saw.
	settle(t, "the aborted client counted as shed", func() error {
		if p.stats.Shed.Load() == 0 {
			return errors.New("not counted")
		}
		return nil
	})
	// The first client is still served.
	if got, _, err := sctptest.Ask(held[0], []byte("pong"), sctp.Info{}); err != nil || string(got) != "pong" {
		t.Fatalf("a client served before the ceiling was reached: %q, %v", got, err)
	}

	for _, c := range held {
		c.Close()
	}
	held = nil
	p.fds.set(0)
	settle(t, "served again", func() error {
		c, _, err := dialAndAsk(addr, "again")
		if c != nil {
			c.Close()
		}
		return err
	})
}

// dialAndAsk opens an association to addr and sends msg on it. It
// returns the association (nil if none was made), for the caller to
// close, and the reply.
func dialAndAsk(addr netip.AddrPort, msg string) (*sctp.Conn, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := sctp.Dial(ctx, addr, sctp.Options{})
	if err != nil {
		return nil, nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	got, _, err := sctptest.Ask(c, []byte(msg), sctp.Info{})
	return c, got, err
}

// TestSCTPClosingListenerServesQueuedAssociations: associations the kernel
// queued on a listening socket that its accept loop did not get round to
// are served when the socket closes, not aborted, as TCP connections are
// (TestClosingListenerServesQueuedConnections). The socket is one of the
// service port's whose accept loop never ran, so every association is
// still queued at the close.
func TestSCTPClosingListenerServesQueuedAssociations(t *testing.T) {
	sctptest.Require(t)
	_, ep := sctpBackends(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("queued", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: ep})
	ln, err := sctp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), sctp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sp, noLoop := withoutAcceptLoop(t, p, name, ln)
	l := &sctpListener{sp: sp, role: roleProxyPort, addr: netip.MustParseAddr("127.0.0.1"), ln: ln, done: noLoop}

	const n = 3
	var clients []*sctp.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range n {
		clients = append(clients, sctptest.Dial(t, ln.Addr(), sctp.Options{}))
	}
	l.close()
	for i, c := range clients {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if got, _, err := sctptest.Ask(c, []byte("ping"), sctp.Info{}); err != nil || string(got) != "ping" {
			t.Errorf("client %d, queued at the close: %q, %v; want it served", i, got, err)
		}
	}
	if a := p.stats.SCTPAccepted.Load(); a != n {
		t.Errorf("%d associations counted as accepted, want %d", a, n)
	}
}

// TestSCTPListenerOnTheSparesNumberIsRefused: TestListenerOnTheSparesNumberIsRefused
// for an SCTP listening socket: one that took the spare descriptor's
// number is closed, the spare takes the number back and the sync fails
// with EMFILE; the next Apply serves the port.
func TestSCTPListenerOnTheSparesNumberIsRefused(t *testing.T) {
	sctptest.Require(t)
	_, ep := sctpBackends(t, "a")
	p := newTestProxier(t, Config{})
	sp := state.ServicePort{Name: spn("sig", "", state.SCTP), Port: 3868, ClusterEndpoints: ep}
	refusedOnTheSparesNumber(t, p, sp)
	if got := sctptest.WhoAt(t, sctpProxyAddr(t, p, sp.Name)); got != "a" {
		t.Fatalf("with the spare back, reached %q", got)
	}
}
