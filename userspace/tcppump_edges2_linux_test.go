//go:build linux && !goroutines

package userspace

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// emptyPipePool closes the splice pipes the pool keeps, so that the next
// pipe put back is the first one taken.
func emptyPipePool() {
	for {
		select {
		case pp := <-idlePipes:
			pp.close()
		default:
			return
		}
	}
}

// pipeFDs returns this process's open pipe descriptors, each with its
// link in /proc/self/fd (pipe:[inode]).
func pipeFDs(t *testing.T) map[int]string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	fds := make(map[int]string)
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if l, lerr := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && lerr == nil && strings.HasPrefix(l, "pipe:") {
			fds[fd] = l
		}
	}
	return fds
}

// strayPipes returns the pipe descriptors open now that were not open at
// before (pipeFDs) and are not the pool's: pipes the data plane holds or
// leaked. Descriptors closed since before are not looked at: Go's runtime
// keeps splice pipes of its own (io.Copy between sockets, as tcpBackend
// does) in a pool that a garbage collection empties at any time.
func strayPipes(t *testing.T, before map[int]string) []int {
	t.Helper()
	pooled := make(map[int]bool)
	var taken []*pipe
drain:
	for {
		select {
		case pp := <-idlePipes:
			taken = append(taken, pp)
			pooled[pp.r], pooled[pp.w] = true, true
		default:
			break drain
		}
	}
	for _, pp := range taken {
		select {
		case idlePipes <- pp:
		default:
			pp.close() // the loops filled the pool meanwhile
		}
	}
	var stray []int
	for fd, link := range pipeFDs(t) {
		if before[fd] != link && !pooled[fd] {
			stray = append(stray, fd)
		}
	}
	return stray
}

// settleNoTCPActive waits, as settle does, until p has no TCP connection
// active.
func settleNoTCPActive(t *testing.T, p *Proxier, what string) {
	t.Helper()
	settle(t, what, func() error {
		if a := p.stats.TCPActive.Load(); a != 0 {
			return fmt.Errorf("%d connections active", a)
		}
		return nil
	})
}

// greeted connects to name's proxy port, closed when the test ends, and
// reads the greeting of the tcpBackend named be it reaches; it hands back
// the connection, its deadline 20 s away, and its reader.
func greeted(t *testing.T, p *Proxier, name state.ServicePortName, be string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	if g, err := r.ReadString('\n'); err != nil || g != be+"\n" {
		t.Fatalf("greeting %q, %v; want %s", g, err, be)
	}
	return c, r
}

// proxiedPair starts a connection through p to ln's endpoint and returns
// the client's end and the endpoint's.
func proxiedPair(t *testing.T, p *Proxier, name state.ServicePortName, ln net.Listener) (client, endpoint *net.TCPConn) {
	t.Helper()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	select {
	case e := <-accepted:
		t.Cleanup(func() { e.Close() })
		return c.(*net.TCPConn), e.(*net.TCPConn)
	case <-time.After(5 * time.Second):
		t.Fatal("the endpoint got no connection")
	}
	return nil, nil
}

// endpointOn starts a Service of one endpoint, a listener the test
// serves itself, on p.
func endpointOn(t *testing.T, p *Proxier, svc string) (state.ServicePortName, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	name := spn(svc, "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	return name, ln
}

// TestTCPPipeWithDataLeftIsNotReused: when the endpoint resets while
// part of the client's upload waits in a splice pipe for it, the pipe,
// which still holds that data, is closed, not put back in the pool: the
// next connection to take it would send the stale bytes to its own peer
// ahead of its own.
func TestTCPPipeWithDataLeftIsNotReused(t *testing.T) {
	p := newTestProxier(t, Config{})
	name, ln := endpointOn(t, p, "stalepipe")
	emptyPipePool()
	c, endpoint := proxiedPair(t, p, name, ln) // the endpoint reads nothing
	full := make(chan struct{})
	uploaded := make(chan error, 1)
	go func() { uploaded <- fillUntilBlocked(c, 300*time.Millisecond, full) }()
	select {
	case <-full:
	case <-time.After(20 * time.Second):
		t.Fatal("the upload never filled the way to the endpoint")
	}
	// The premise: part of the upload waits in a pipe.
	held := 0
	for _, lp := range p.loops {
		lp.do(func() {
			for _, h := range lp.handlers {
				if cs, ok := h.(*connSide); ok && !cs.backend && cs.c.dirs[0].p != nil {
					held = cs.c.dirs[0].pending
				}
			}
		})
	}
	if held == 0 {
		t.Fatal("no part of the upload waits in a splice pipe: the test proves nothing")
	}
	endpoint.SetLinger(0)
	endpoint.Close() // a reset, with the upload unread
	settleNoTCPActive(t, p, "the connection ends")
	c.Close()
	<-uploaded
	for {
		select {
		case pp := <-idlePipes:
			n, err := unix.IoctlGetInt(pp.r, unix.TIOCINQ)
			pp.close()
			if err != nil || n != 0 {
				t.Errorf("the pool holds a pipe with %d bytes in it (%v); %d were left in the connection's", n, err, held)
			}
		default:
			return
		}
	}
}

// TestTCPIdleConnectionHoldsNoPipe: once the bulk data of a connection
// has moved, both ways, the connection, open and idle, holds no splice
// pipe: every pipe open is in the pool (DESIGN.md: an idle connection
// costs its two sockets).
//
// The endpoint is the test's own, with plain reads and writes: an io.Copy
// between sockets (tcpBackend's echo) holds a splice pipe of Go's while
// it waits.
func TestTCPIdleConnectionHoldsNoPipe(t *testing.T) {
	p := newTestProxier(t, Config{})
	name, ln := endpointOn(t, p, "idlepipe")
	c, endpoint := proxiedPair(t, p, name, ln)
	emptyPipePool()
	before := pipeFDs(t)
	for round := range 3 {
		for _, dir := range []struct {
			from, to *net.TCPConn
			what     string
		}{{c, endpoint, "client to endpoint"}, {endpoint, c, "endpoint to client"}} {
			payload := make([]byte, 1<<20)
			rand.Read(payload)
			go dir.from.Write(payload)
			got := make([]byte, len(payload))
			_ = dir.to.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.ReadFull(dir.to, got); err != nil || !bytes.Equal(got, payload) {
				t.Fatalf("round %d, 1 MiB %s: %v, intact %v", round, dir.what, err, bytes.Equal(got, payload))
			}
		}
	}
	settle(t, "every pipe back in the pool", func() error {
		if stray := strayPipes(t, before); len(stray) != 0 {
			return fmt.Errorf("pipe descriptors %v open outside the pool", stray)
		}
		return nil
	})
}

// TestTCPHalfCloseTimeoutAfterKeepAlive: a connection half-closed after
// it has lived keepAliveAfter (its timer has done with keep-alive) is
// still bounded by TCPHalfCloseTimeout once silent: the half-close sets
// the timer.
func TestTCPHalfCloseTimeoutAfterKeepAlive(t *testing.T) {
	p := newTestProxier(t, Config{TCPHalfCloseTimeout: 300 * time.Millisecond})
	name, ln := endpointOn(t, p, "latehalfclose")
	c, endpoint := proxiedPair(t, p, name, ln)
	settleKeepAliveDone(t, p, ln)
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = endpoint.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := io.ReadAll(endpoint); err != nil || len(got) != 0 {
		t.Fatalf("the endpoint read %q, %v; want the client's FIN", got, err)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("the half-closed connection, silent, read %v after %v; want a reset after 300 ms", err, time.Since(start))
	}
	if n := p.Stats().HalfCloseTimeouts.Load(); n != 1 {
		t.Errorf("HalfCloseTimeouts = %d, want 1", n)
	}
}

// TestTCPReaderResetDuringFINDrainEndsIt: while what a side sent before
// its FIN and its reset is being delivered (a drain without a deadline,
// see fail), a reset of the reader ends the connection at once: nobody is
// left to deliver to. It is not held until finDrainStall.
func TestTCPReaderResetDuringFINDrainEndsIt(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 128<<10/16)
	f := newFINFirstConn(t, "endpoint", payload)
	settle(t, "the proxy found the endpoint's reset", func() error {
		found := false
		for _, lp := range f.p.loops {
			lp.do(func() {
				for _, h := range lp.handlers {
					if cs, ok := h.(*connSide); ok && cs.c.failing && cs.c.finFirst {
						found = true
					}
				}
			})
		}
		if !found {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	f.reader.SetLinger(0)
	f.reader.Close()
	f.ended(t, 10*time.Second)
	if n := f.p.Stats().HalfCloseTimeouts.Load(); n != 0 {
		t.Errorf("HalfCloseTimeouts = %d, want 0: the reader reset, it did not stall", n)
	}
	// The reason is the first failure's.
	klog.Flush()
	if line := f.logs.lineWith(`"Connection ended"`); !strings.Contains(line, `reset=true reason="the endpoint reset the connection"`) {
		t.Errorf("ended with %q, want a reset for the endpoint's reset, the first failure", line)
	}
	noLeaks(t, f.sockets, f.goroutines)
}

// TestTCPResetWithNothingLeftIsPassedOnAtOnce: an endpoint that resets
// once the client has taken and acknowledged all it sent has its reset
// passed on at once, as a direct connection would have it: there is
// nothing left to deliver, so nothing to wait resetDrain for.
func TestTCPResetWithNothingLeftIsPassedOnAtOnce(t *testing.T) {
	p := newTestProxier(t, Config{})
	name, ln := endpointOn(t, p, "byereset")
	for round := range 2 {
		c, endpoint := proxiedPair(t, p, name, ln)
		// Past keepAliveAfter: no timer of the connection's own comes
		// before the drain's deadline.
		settleKeepAliveDone(t, p, ln)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := endpoint.Write([]byte("bye\n")); err != nil {
			t.Fatal(err)
		}
		if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "bye\n" {
			t.Fatalf("round %d: the client read %q, %v", round, got, err)
		}
		if err := waitAcked(endpoint, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		// The client has acknowledged the bye to the proxy too: the
		// proxy's socket to it has nothing unacknowledged.
		settle(t, "the client acknowledged the bye", func() error {
			for _, fd := range p.connFDs() {
				if n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ); err != nil || n != 0 {
					return fmt.Errorf("%d bytes unacknowledged (%v)", n, err)
				}
			}
			return nil
		})
		endpoint.SetLinger(0)
		reset := time.Now()
		endpoint.Close()
		_, err := c.Read(make([]byte, 1))
		if d := time.Since(reset); !isReset(err) || d > resetDrain/2 {
			t.Fatalf("round %d: the client read %v %v after the endpoint's reset, want a reset at once (well before resetDrain, %v)", round, err, d, resetDrain)
		}
	}
	settleNoTCPActive(t, p, "no connection active")
}

// TestTCPLeftoverIsNotTheScratchBuffer: what a read through the loop's
// scratch buffer brought and the destination could not take yet is kept
// in a buffer of its own: the scratch buffer is the next read's, the
// other direction's or another connection's. Bulk data goes through the
// scratch buffer too while pipes are short (set here, as running out of
// descriptors sets it).
func TestTCPLeftoverIsNotTheScratchBuffer(t *testing.T) {
	p := newTestProxier(t, Config{})
	// The endpoint's small receive buffer, and a payload larger than the
	// proxy's send buffer can grow to, leave part of it in the proxy.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<10) })
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	name := spn("leftover", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, endpoint := proxiedPair(t, p, name, ln)
	for _, lp := range p.loops {
		lp.do(func() { lp.noPipesUntil = time.Now().Add(time.Hour) })
	}
	payload := make([]byte, 16<<20)
	for i := range payload {
		payload[i] = byte(i % 251)
	}
	go c.Write(payload) // the endpoint reads nothing yet
	settle(t, "the proxy holds a leftover for the endpoint", func() error {
		held := 0
		for _, lp := range p.loops {
			lp.do(func() {
				for _, h := range lp.handlers {
					if cs, ok := h.(*connSide); ok && !cs.backend {
						held += len(cs.c.dirs[0].buf)
					}
				}
			})
		}
		if held == 0 {
			return fmt.Errorf("no leftover")
		}
		return nil
	})
	// A read through the scratch buffer: the other direction's.
	other := bytes.Repeat([]byte{'Z'}, smallRead)
	if _, err := endpoint.Write(other); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, len(other))); err != nil {
		t.Fatal(err)
	}
	_ = endpoint.SetReadDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, len(payload))
	n, err := io.ReadFull(endpoint, got)
	if i := firstDifference(got[:n], payload); err != nil || i >= 0 {
		t.Fatalf("the endpoint read %d of %d bytes (%v), first wrong at %d", n, len(payload), err, i)
	}
}

// firstDifference returns the index of the first byte where got differs
// from want's start, or -1.
func firstDifference(got, want []byte) int {
	for i := range got {
		if got[i] != want[i] {
			return i
		}
	}
	return -1
}

// TestTCPFINFirstDrainReleasesReaderThatStopsPartWay: a reader that takes
// part of what a side sent before its FIN and its reset, and then stops,
// is reset once it has taken and acknowledged nothing for finDrainStall
// from then on: progress is measured against its last look, not against
// what it had left when the side failed (see stalled).
func TestTCPFINFirstDrainReleasesReaderThatStopsPartWay(t *testing.T) {
	const stall = time.Second
	shortenFINDrainStall(t, stall)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 16<<10/16)
	f := newFINFirstConn(t, "endpoint", payload)
	_ = f.reader.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 2<<10)
	if _, err := io.ReadFull(f.reader, got); err != nil || !bytes.Equal(got, payload[:len(got)]) {
		t.Fatalf("the client's first 2 KiB: %v, intact %v", err, bytes.Equal(got, payload[:len(got)]))
	}
	// Then it stops reading, with the rest unread.
	f.ended(t, stall+10*time.Second)
	if n := f.p.Stats().HalfCloseTimeouts.Load(); n != 1 {
		t.Errorf("HalfCloseTimeouts = %d, want 1", n)
	}
	f.reader.Close()
	noLeaks(t, f.sockets, f.goroutines)
}

// settleKeepAliveDone waits until the proxy's socket to ln's endpoint has
// keep-alive on: the connection has lived keepAliveAfter, and its timer
// has nothing left to do unless something sets it again.
func settleKeepAliveDone(t *testing.T, p *Proxier, ln net.Listener) {
	t.Helper()
	settle(t, "keep-alive on the endpoint's socket", func() error {
		for _, fd := range p.connFDs() {
			peer, err := unix.Getpeername(fd)
			if sa, ok := peer.(*unix.SockaddrInet4); err == nil && ok && sa.Port == ln.Addr().(*net.TCPAddr).Port {
				if tcpOptsOf(fd).keepAlive != 1 {
					return fmt.Errorf("not yet")
				}
				return nil
			}
		}
		return fmt.Errorf("no socket to the endpoint")
	})
}

// TestTCPClientResetReachesStalledEndpointLater: as
// TestTCPClientResetReachesStalledEndpoint, on a connection that has
// lived past keepAliveAfter, so that no earlier timer of its own comes
// to end the drain: the failure sets the drain's deadline itself, and
// the endpoint, which takes nothing, is reset resetDrain after the
// client's reset.
func TestTCPClientResetReachesStalledEndpointLater(t *testing.T) {
	p := newTestProxier(t, Config{})
	name, ln := endpointOn(t, p, "stalledlate")
	c, endpoint := proxiedPair(t, p, name, ln) // the endpoint reads nothing
	settleKeepAliveDone(t, p, ln)
	full := make(chan struct{})
	uploaded := make(chan error, 1)
	go func() { uploaded <- fillUntilBlocked(c, 300*time.Millisecond, full) }()
	select {
	case <-full:
	case <-time.After(20 * time.Second):
		t.Fatal("the upload never filled the way to the endpoint")
	}
	c.SetLinger(0)
	c.Close() // a reset
	<-uploaded
	settleWithin(t, resetDrain+10*time.Second, "the endpoint reset", func() error {
		if st := tcpState(t, endpoint); st != unix.BPF_TCP_CLOSE {
			return fmt.Errorf("the endpoint's connection is in TCP state %d", st)
		}
		return nil
	})
	settleNoTCPActive(t, p, "the connection no longer active")
}

// TestTCPResetPassedOnOnceAcknowledged: an endpoint that sends a last
// answer and resets has its reset passed on as soon as the client has
// acknowledged the answer, here with a delayed ACK (TCP_QUICKACK off): the
// drain looks again soon, rather than waiting for resetDrain.
func TestTCPResetPassedOnOnceAcknowledged(t *testing.T) {
	p := newTestProxier(t, Config{})
	name, ln := endpointOn(t, p, "delayedack")
	for round := range 2 {
		c, endpoint := proxiedPair(t, p, name, ln)
		// Connected through, and past keepAliveAfter: no timer of the
		// connection's own comes before the drain's deadline.
		if _, err := c.Write([]byte("hi\n")); err != nil {
			t.Fatal(err)
		}
		_ = endpoint.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(endpoint, make([]byte, 3)); err != nil {
			t.Fatal(err)
		}
		settleKeepAliveDone(t, p, ln)
		rc, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		if _, err := endpoint.Write([]byte("bye\n")); err != nil {
			t.Fatal(err)
		}
		endpoint.SetLinger(0)
		reset := time.Now()
		endpoint.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		if d := time.Since(reset); string(got) != "bye\n" || !isReset(err) || d > resetDrain/2 {
			t.Fatalf("round %d: the client read %q and %v %v after the endpoint's reset, want bye and a reset well before resetDrain (%v)", round, got, err, d, resetDrain)
		}
	}
}

// TestTCPResetAfterFINFoundByWriting: an endpoint that sent all it had
// and its FIN, and then reset, has all it sent delivered to a slow client
// and then its EOF, also when the proxy finds the reset by writing to it
// (EPIPE: the reset came after its FIN) before the reset's own event: the
// client talked on, and its bytes came first in the loop's round.
func TestTCPResetAfterFINFoundByWriting(t *testing.T) {
	const size = 48 << 10
	payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	p := newTestProxier(t, Config{})
	name, ln := endpointOn(t, p, "finwrite")
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		// A small receive buffer: most of the payload waits in the proxy.
		return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<10) })
	}}
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	nc, err := d.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	client := nc.(*net.TCPConn)
	defer client.Close()
	var endpoint *net.TCPConn
	select {
	case e := <-accepted:
		endpoint = e.(*net.TCPConn)
		defer endpoint.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the endpoint got no connection")
	}
	if _, err := endpoint.Write(payload); err != nil {
		t.Fatal(err)
	}
	if err := endpoint.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := waitAcked(endpoint, 10*time.Second); err != nil {
		t.Fatalf("the proxy did not take the endpoint's %d bytes and FIN: %v", size, err)
	}
	// With the loops held up, the client's bytes and then the endpoint's
	// reset arrive: the loop reads them in that order.
	release := make(chan struct{})
	for _, lp := range p.loops {
		stalled := make(chan struct{})
		go lp.do(func() {
			close(stalled)
			<-release
		})
		<-stalled
	}
	_, werr := client.Write([]byte("more"))
	endpoint.SetLinger(0)
	endpoint.Close()
	close(release)
	if werr != nil {
		t.Fatal(werr)
	}
	time.Sleep(resetDrain + time.Second) // the client's pause, not a wait for the proxy
	got, err := readUntilError(client)
	if len(got) != size || !bytes.Equal(got, payload) || err != nil {
		t.Fatalf("the client read %d of %d bytes (intact: %v), then %v; want all of them and EOF", len(got), size, bytes.Equal(got, payload[:min(len(got), size)]), err)
	}
}

// TestTCPBulkWithoutPipesGoesThroughMemory: bulk data of a connection
// already served, for which no pipe can be had (every new descriptor is
// above the data plane's ceiling, as when descriptors run out), goes
// through the loop's memory instead, whole, and the loop goes on serving.
func TestTCPBulkWithoutPipesGoesThroughMemory(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("nopipes", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	c, r := greeted(t, p, name, "a")
	emptyPipePool()
	ceiling := p.fds.conns.Load()
	p.fds.conns.Store(0)
	defer p.fds.conns.Store(ceiling)
	payload := make([]byte, 4<<20)
	rand.Read(payload)
	go c.Write(payload)
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("echo of 4 MiB without pipes: %v, intact %v", err, bytes.Equal(got, payload))
	}
	if n := len(idlePipes); n != 0 {
		t.Errorf("%d pipes in the pool, made over the ceiling", n)
	}
}

// TestTCPResetWhileSplicingLeavesNoPipe: a side that resets while its
// direction splices (a bulk transfer went before) leaves no pipe behind:
// the pipe the failed splice took goes back to the pool.
func TestTCPResetWhileSplicingLeavesNoPipe(t *testing.T) {
	p := newTestProxier(t, Config{})
	name, ln := endpointOn(t, p, "splicereset")
	c, endpoint := proxiedPair(t, p, name, ln)
	emptyPipePool()
	before := pipeFDs(t)
	payload := make([]byte, 1<<20)
	rand.Read(payload)
	go endpoint.Write(payload)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, len(payload))); err != nil {
		t.Fatal(err)
	}
	// The direction splices its next read, as after a full splice (the
	// last one of the transfer may have been short).
	for _, lp := range p.loops {
		lp.do(func() {
			for _, h := range lp.handlers {
				if cs, ok := h.(*connSide); ok && cs.backend {
					cs.c.dirs[1].bulk = true
				}
			}
		})
	}
	endpoint.SetLinger(0)
	endpoint.Close()
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("the client read %v, want a reset", err)
	}
	settle(t, "every pipe back in the pool", func() error {
		if a := p.Stats().TCPActive.Load(); a != 0 {
			return fmt.Errorf("%d connections active", a)
		}
		if stray := strayPipes(t, before); len(stray) != 0 {
			return fmt.Errorf("pipe descriptors %v open outside the pool", stray)
		}
		return nil
	})
}
