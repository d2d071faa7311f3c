//go:build !linux || goroutines

package userspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// tcpListener accepts connections for one socket of a service port and hands
// each to its own goroutine, so a slow or dead endpoint never delays the
// accept loop (the legacy proxier dialed inline: up to 3.75 s per client).
type tcpListener struct {
	sp   *servicePort
	role socketRole
	addr netip.Addr // the address listened on
	ln   *net.TCPListener
	done chan struct{} // closed when the accept loop has returned
	once sync.Once
}

func listenTCP(sp *servicePort, k sockKey) (socket, error) {
	network := "tcp4"
	if familyOf(k.addr.Addr()) == familyIPv6 {
		network = "tcp6"
	}
	lc := listenConfig()
	nl, err := lc.Listen(context.Background(), network, k.addr.String())
	if err != nil {
		return nil, err
	}
	ln := nl.(*net.TCPListener)
	if err := sp.p.keepListenerConn(ln, func() { ln.Close() }); err != nil {
		return nil, err
	}
	l := &tcpListener{sp: sp, role: k.role, addr: k.addr.Addr(), ln: ln, done: make(chan struct{})}
	sp.p.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func (l *tcpListener) port() uint16 {
	return uint16(l.ln.Addr().(*net.TCPAddr).Port)
}

// close stops accepting; connections already accepted keep running, and
// so do those still queued on the socket (drainQueued).
func (l *tcpListener) close() {
	l.once.Do(func() {
		drainQueued(l.sp, &l.sp.p.stats.TCPAccepted, queuedConns(l.ln), keepAccepted(l.sp, resetTCP), l.serveConn)
		l.ln.Close()
		l.sp.p.fds.listenerClosed()
	})
	<-l.done
}

func (l *tcpListener) acceptLoop() {
	defer l.sp.p.wg.Done()
	defer close(l.done)
	shed := func() shedResult { return shedNone }
	if rc, err := l.ln.SyscallConn(); err == nil {
		shed = func() shedResult { return l.sp.p.shed.shedFrom(rc) }
	}
	acceptLoop(l.sp, &l.sp.p.stats.TCPAccepted, l.ln.AcceptTCP, shed, keepAccepted(l.sp, resetTCP), l.serveConn)
}

// serveConn dials an endpoint for c, with failover, and proxies between the
// two until both sides are done.
func (l *tcpListener) serveConn(c *net.TCPConn) {
	p := l.sp.p
	defer p.wg.Done()
	client := addrPortOf(c.RemoteAddr())
	if !l.sp.admits(l.role, l.addr, client) || l.sp.nodePortRefuses(l.role, addrPortOf(c.LocalAddr()).Addr(), client) {
		p.fds.dialed() // see keepAccepted
		resetTCP(c)
		return
	}
	b := l.sp.balancer(l.role, client.Addr())
	var header []byte
	if v := state.ProxyProtocol(l.sp.proxyProtocol.Load()); v != state.ProxyProtocolNone {
		header = l.proxyHeader(v, c, client)
	}
	backend, ep, err := dialWithFailover(p, b, l.role, client, l.sp, p.stats.tcpDialCounters(), tcpClientWatch{c},
		func(ctx context.Context, ep netip.AddrPort, clock *dialClock) (*net.TCPConn, error) {
			d := net.Dialer{KeepAliveConfig: keepAlive,
				// Runs just before the connect: the attempt's time
				// starts there (see dialClock).
				ControlContext: func(_ context.Context, _, _ string, rc syscall.RawConn) error {
					clock.start(rc)
					return nil
				}}
			c, err := d.DialContext(ctx, "tcp", ep.String())
			if err != nil {
				return nil, err
			}
			tc := c.(*net.TCPConn)
			if err := p.keepConn(tc, func() { resetTCP(tc) }); err != nil {
				return nil, err
			}
			if header != nil {
				if err := sendHeader(ctx, tc, header); err != nil {
					resetTCP(tc)
					return nil, err
				}
			}
			return tc, nil
		})
	p.fds.dialed()
	if err != nil {
		resetTCP(c)
		return
	}
	t := &tcpConn{p: p, sp: l.sp, client: c, backend: backend, name: l.sp.name, clientAddr: client, endpoint: ep}
	if !p.conns.add(p.ctx, t) {
		resetTCP(c)
		resetTCP(backend)
		return
	}
	l.sp.connOpened(&p.stats.TCPActive)
	if klog.V(4).Enabled() {
		t.since = time.Now()
		klog.InfoS("Proxying connection", "service", l.sp.name, "client", client, "endpoint", ep)
	}
	// The copy loops run on fresh goroutines and this one ends: its stack
	// grew while dialing and would otherwise stay that size for the life of
	// an idle connection.
	t.pending.Store(2)
	p.wg.Add(2)
	go t.copyToBackend()
	go t.copyToClient()
}

// tcpClientWatch watches a client while its dial attempts race (see
// clientWatch): a reset is its socket's pending error (waitSocketError),
// and a read deadline in the past interrupts the wait.
type tcpClientWatch struct{ c *net.TCPConn }

func (w tcpClientWatch) wait() error { return waitSocketError(w.c) }
func (w tcpClientWatch) interrupt()  { _ = w.c.SetReadDeadline(time.Unix(1, 0)) }
func (w tcpClientWatch) resume()     { _ = w.c.SetReadDeadline(time.Time{}) }

// proxyHeader returns the PROXY protocol header of version v for
// connection c from client: to the frontend the client addressed, the
// original destination of a redirected connection, else the address it
// reached the socket at.
func (l *tcpListener) proxyHeader(v state.ProxyProtocol, c *net.TCPConn, client netip.AddrPort) []byte {
	var dst netip.AddrPort
	if l.role.redirected() {
		dst, _ = connOriginalDst(c, familyOf(client.Addr()) == familyIPv6)
	}
	if !dst.IsValid() {
		dst = addrPortOf(c.LocalAddr())
	}
	return appendProxyHeader(make([]byte, 0, maxProxyHeader), v, client, dst)
}

// sendHeader writes the PROXY protocol header to a new endpoint
// connection, before anything of the client's, within the dial's time: an
// endpoint that cannot take it counts as a failed dial, and the next
// endpoint gets it.
func sendHeader(ctx context.Context, backend *net.TCPConn, header []byte) error {
	if d, ok := ctx.Deadline(); ok {
		_ = backend.SetWriteDeadline(d)
	}
	if _, err := backend.Write(header); err != nil {
		return fmt.Errorf("send the PROXY protocol header: %w", err)
	}
	return backend.SetWriteDeadline(time.Time{})
}

func (s *Stats) tcpDialCounters() dialCounters {
	return dialCounters{&s.TCPNoEndpoints, &s.TCPDialFailures, &s.TCPDialGiveUps}
}

// tcpConn is one proxied connection: bytes flow both ways until each side
// has finished sending. A side that finishes (EOF) is passed on as a
// half-close (CloseWrite), so request-then-shutdown protocols keep their
// replies; the other direction then runs under TCPHalfCloseTimeout, so no
// socket is left in FIN_WAIT2 or CLOSE_WAIT for ever (the failure that made
// the legacy proxier drop half-close: kubernetes/kubernetes#18354). A side
// that fails (a reset, most often) has what it sent before delivered to
// the other side, which is reset then (see fail).
//
// Direction 0 copies from the client to the endpoint, direction 1 from
// the endpoint to the client; side i (0: the client, 1: the endpoint) is
// the source of direction i.
type tcpConn struct {
	p       *Proxier
	sp      *servicePort
	client  *net.TCPConn
	backend *net.TCPConn
	// halfClosed is set once either direction has ended with EOF.
	halfClosed atomic.Bool
	// pending counts the goroutines still at work on the connection: the
	// directions still copying, and drain; the last one to finish closes
	// both sockets.
	pending atomic.Int32
	// failed is 1 + the side that failed while the connection was
	// proxied, 0 while none has (see fail).
	failed atomic.Int32
	// passed[i] is set once direction i has passed on all its source sent:
	// its FIN, or what it sent before it failed.
	passed [2]atomic.Bool
	// finFirst is set when the side that failed had sent its FIN first
	// (see fail).
	finFirst atomic.Bool
	// finSent[i] is set before side i is sent a FIN (CloseWrite): an EOF
	// it says after that may be a normal close, not a reset.
	finSent [2]atomic.Bool
	// eofUnderReset[i] is set when direction i read an EOF from a
	// socket whose reset a write to it had taken: the write's fail
	// finishes the direction (see passOn).
	eofUnderReset [2]atomic.Bool

	aborted   atomic.Bool
	abortOnce sync.Once
	why       atomic.Pointer[string] // set once it is reset: why, for the -v=4 line

	// For the -v=4 log of how the connection ended.
	name                 state.ServicePortName
	clientAddr           netip.AddrPort
	endpoint             netip.AddrPort
	since                time.Time
	toEndpoint, toClient atomic.Uint64
}

// side returns the socket of side i.
func (t *tcpConn) side(i int) *net.TCPConn {
	if i == 0 {
		return t.client
	}
	return t.backend
}

// copyToBackend and copyToClient are named so goroutine dumps say which
// direction is blocked.
func (t *tcpConn) copyToBackend() {
	defer t.p.wg.Done()
	watch := t.pipe(0, &t.p.stats.BytesToBackend, &t.toEndpoint)
	t.directionDone()
	if watch {
		t.awaitReset(0)
	}
}

func (t *tcpConn) copyToClient() {
	defer t.p.wg.Done()
	watch := t.pipe(1, &t.p.stats.BytesToClient, &t.toClient)
	t.directionDone()
	if watch {
		t.awaitReset(1)
	}
}

// awaitReset passes on a reset from side i, whose socket nothing reads
// any more: side i has finished sending first, and its FIN has been
// passed on. Without it, a reset (or a keep-alive timeout) there would
// reach the other side only when that side next sent something, or at
// TCPHalfCloseTimeout, and until then the other side would go on serving
// a peer that is gone. It returns when the connection ends. The goroutine
// it runs on is the direction's own, which would otherwise end here: a
// half-closed connection holds two parked goroutines, as an open one
// does, and nothing more.
func (t *tcpConn) awaitReset(i int) {
	if err := awaitSocketError(t.side(i)); err != nil {
		t.fail(i, sideFailed(sideNames[i], true, err), true) // after its FIN
	}
}

// directionDone is called as each direction stops copying, and by drain;
// the last one closes both sockets, which also ends awaitReset.
func (t *tcpConn) directionDone() {
	if t.pending.Add(-1) == 0 {
		t.client.Close()
		t.backend.Close()
		t.p.shed.retake() // descriptors are free: the spare may have been missing
		t.p.conns.remove(t)
		t.sp.connClosed(&t.p.stats.TCPActive)
		if klog.V(4).Enabled() {
			var why string
			w := t.why.Load()
			if w != nil {
				why = *w
			}
			logConnEnded(t.name, t.clientAddr, t.endpoint, [2]uint64{t.toEndpoint.Load(), t.toClient.Load()}, t.since, w != nil, why)
		}
	}
}

// pipe runs direction i: it copies from side i to the other side until
// side i has finished sending, or a side fails. It reports whether side
// i finished first, so that its socket must now be watched for a reset
// (awaitReset).
func (t *tcpConn) pipe(i int, counter, moved *atomic.Uint64) (watch bool) {
	src, dst := t.side(i), t.side(1-i)
	from, to := sideNames[i], sideNames[1-i]
	progress := func(n int) {
		counter.Add(uint64(n))
		moved.Add(uint64(n))
		if t.halfClosed.Load() {
			_ = src.SetReadDeadline(time.Now().Add(t.p.cfg.TCPHalfCloseTimeout))
		}
	}
	// A failure of src found while a write to dst waits (progressWriter):
	// EPIPE is a reset that came after src's FIN (tcp_reset leaves EPIPE
	// in CLOSE_WAIT), so all src sent is in the proxy's hands (see fail).
	srcFailed := func(err error) { t.fail(i, sideFailed(from, true, err), errors.Is(err, syscall.EPIPE)) }
	// A deadline that passed is the half-close bound's. net.Error's
	// Timeout would also take a side whose connection timed out
	// (ETIMEDOUT: its peer vanished, found by the keep-alive or by data
	// it never acknowledged) for it: that is the side's failure, said as
	// such, as the event loops say it.
	err := copyStream(dst, src, progress, srcFailed)
	for errors.Is(err, os.ErrDeadlineExceeded) && t.failed.Load() == 0 && (unsent(src) || unsent(dst)) {
		// Not silent: what was handed on waits in a send queue for a
		// reader that has paused, as it waits in a write when the
		// queue is full. The timeout counts again from now.
		_ = src.SetReadDeadline(time.Now().Add(t.p.cfg.TCPHalfCloseTimeout))
		err = copyStream(dst, src, progress, srcFailed)
	}
	var oe *net.OpError
	switch {
	case errors.Is(err, net.ErrClosed):
		return false // the other direction or Close ended the connection
	case err != nil && errors.As(err, &oe) && oe.Op == "write":
		// EPIPE: dst's kernel reset it after dst's FIN (tcp_reset leaves
		// EPIPE in CLOSE_WAIT); a reset before it says ECONNRESET.
		if testHookWriteFailed != nil {
			testHookWriteFailed(t, 1-i)
		}
		t.fail(1-i, sideFailed(to, false, err), errors.Is(err, syscall.EPIPE))
		return false
	case t.failed.Load() == int32(2-i):
		// dst failed: what was on its way to it is dropped; a failure of
		// src, which this direction found reading it, ends the connection
		// at once (fail), since nobody is left to deliver to.
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.fail(i, sideFailed(from, true, err), false)
		}
		return false
	case t.failed.Load() == int32(1+i):
		// src had failed: all it sent before has been read, and written.
		if err == nil && t.finFirst.Load() {
			// Its FIN came before the failure: pass it on (see fail).
			t.finSent[1-i].Store(true)
			if cerr := dst.CloseWrite(); cerr != nil {
				t.fail(1-i, sideFailed(to, false, cerr), false)
			}
		}
		t.passed[i].Store(true)
		return false
	case err == nil && !t.halfClosed.Load() && !t.finSent[i].Load() && closedUnder(src):
		if serr := socketError(src); serr != nil {
			// Its error is still there to take, so the read said EOF
			// for src's FIN, which Linux's tcp_recvmsg reports before
			// an error: src failed after its FIN (a reset from its
			// expired orphan, most often). Pass the FIN on, then the
			// failure (see fail). Asked only of a socket already found
			// closed, so an ordinary EOF costs nothing more.
			t.finSent[1-i].Store(true)
			if cerr := dst.CloseWrite(); cerr != nil {
				t.fail(1-i, sideFailed(to, false, cerr), false)
				return false
			}
			t.passed[i].Store(true)
			t.fail(i, sideFailed(from, true, serr), true)
			return false
		}
		// An EOF from a socket that was reset, whose error a write to it
		// took first: the other direction's, the only one that writes
		// to src, which reports the failure next (fail) and knows
		// whether it came after src's FIN (EPIPE), so whether the EOF
		// was that FIN. Whichever of the two comes second finishes this
		// direction (passOn): the atomics are sequentially consistent,
		// so at least one sees the other's mark.
		t.eofUnderReset[i].Store(true)
		switch f := t.failed.Load(); {
		case f == int32(1+i):
			t.passOn(i)
		case f != 0:
			t.fail(i, sideFailed(from, true, syscall.ECONNRESET), false) // both failed
		}
		return false
	case err == nil:
		if t.halfClosed.Load() {
			// Both sides have finished sending: directionDone closes both
			// sockets, which sends dst its FIN without a separate shutdown.
			t.passed[i].Store(true)
			return false
		}
		// src sent FIN: pass it on and bound the other direction.
		t.finSent[1-i].Store(true)
		if cerr := dst.CloseWrite(); cerr != nil {
			t.fail(1-i, sideFailed(to, false, cerr), false)
			return false
		}
		t.passed[i].Store(true)
		if t.halfClosed.Swap(true) {
			return false // the other direction finished meanwhile
		}
		_ = dst.SetReadDeadline(time.Now().Add(t.p.cfg.TCPHalfCloseTimeout))
		return true
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.p.stats.HalfCloseTimeouts.Add(1)
		t.abortBecause(whyHalfCloseSilent)
	default:
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = nil
		}
		t.fail(i, sideFailed(from, true, err), false) // e.g. a reset: pass it on as a reset, after what src sent
		t.passed[i].Store(true)
	}
	return false
}

// fail handles the failure of side x (0: the client, 1: the endpoint),
// most often a reset, found by reading from it, writing to it, or
// watching it. A direct connection or kernel NAT would still deliver what
// x sent before it failed (Linux keeps data that arrived before a reset
// readable, and a write that finds the reset does not read it, e.g. an
// HTTP server's "413" sent before it closed with an upload unread), so
// direction x goes on until it reads x's EOF or error, as far as the
// other side takes it, and passes no FIN on; what was on its way to x is
// dropped. The other side is reset only when it has acknowledged all it
// was sent, since closing with SO_LINGER 0 discards the socket's send
// queue, or after resetDrain (see drain). A failure of the other side
// meanwhile aborts at once.
//
// finFirst says x had sent its FIN before it failed: a reset from its
// kernel once its closed socket was gone (a keep-alive probe, or more
// data, reaching an orphan that tcp_fin_timeout expired), or a keep-alive
// timeout. All x sent is then in this proxy's hands, as it would be in
// the other side's kernel on a direct connection, so x's FIN is passed on
// after it and the drain has no deadline: the other side reads all of it
// and its EOF, and is reset once it has acknowledged both. A slow reader
// keeps the connection as long as it takes or acknowledges data; one
// that takes nothing for finDrainStall is reset (see drain), as the
// failed side's kernel would have given up on its orphaned socket.
func (t *tcpConn) fail(x int, why string, finFirst bool) {
	if finFirst && t.failed.Load() == 0 {
		t.finFirst.Store(true) // before failed: pipe reads it after
	}
	if !t.failed.CompareAndSwap(0, int32(1+x)) {
		if t.failed.Load() != int32(1+x) {
			t.abortBecause(why) // both have failed: nobody is left to deliver to
		}
		return
	}
	if !t.hold() {
		return // the connection has ended
	}
	t.why.CompareAndSwap(nil, &why)
	if t.eofUnderReset[x].Load() {
		t.passOn(x) // direction x said EOF first, and left its end to this
	}
	t.p.wg.Add(1) // the caller's own keeps the count above zero
	go t.drain(x, finFirst)
}

// passOn finishes direction i, whose source said EOF and was found
// reset: it passes the source's FIN on if the failure came after it
// (finFirst), and then lets drain count the direction done. Both
// direction i and the fail that reports the failure may call it; the
// FIN goes once.
func (t *tcpConn) passOn(i int) {
	if t.finFirst.Load() {
		if !t.finSent[1-i].CompareAndSwap(false, true) {
			return // the other caller passes it on
		}
		if err := t.side(1 - i).CloseWrite(); err != nil {
			t.fail(1-i, sideFailed(sideNames[1-i], false, err), false)
			return
		}
	}
	t.passed[i].Store(true)
}

// testHookWriteFailed, if set, is called when a direction's write to
// side found it failed, before that failure is reported (fail).
var testHookWriteFailed func(t *tcpConn, side int)

// hold counts one more goroutine at work on the connection, unless the
// last one has finished.
func (t *tcpConn) hold() bool {
	for {
		n := t.pending.Load()
		if n == 0 {
			return false
		}
		if t.pending.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// drain waits, for at most resetDrain, until what failed side x sent has
// been passed on and acknowledged by the other side, then resets the
// connection. Where the acknowledgement cannot be seen (unacked), it
// resets once all has been written. With finFirst it has no deadline,
// but resets the other side once that has taken and acknowledged
// nothing for finDrainStall.
func (t *tcpConn) drain(x int, finFirst bool) {
	defer t.p.wg.Done()
	defer t.directionDone()
	other := t.side(1 - x)
	moved := &t.toClient // what direction x has written to the other side
	if x == 0 {
		moved = &t.toEndpoint
	}
	now := time.Now()
	deadline := now.Add(resetDrain)
	lastProgress, lastMoved := now, moved.Load()
	lastUnacked, _ := unacked(other)
	for n := 0; finFirst || n < int(resetDrain/drainPoll)+1 && time.Now().Before(deadline); n++ {
		if t.aborted.Load() {
			break
		}
		q, ok := unacked(other)
		if t.passed[x].Load() && (!ok || q == 0) {
			break
		}
		if err := socketError(other); err != nil {
			t.abortBecause(sideFailed(sideNames[1-x], true, err)) // it failed too
			return
		}
		if !finFirst {
			time.Sleep(drainPoll)
			continue
		}
		// Progress: more written to the other side, or some of it
		// acknowledged (its send queue shrank).
		now = time.Now()
		if m := moved.Load(); m != lastMoved || ok && q < lastUnacked {
			lastProgress, lastMoved = now, m
		}
		lastUnacked = q
		if now.Sub(lastProgress) >= finDrainStall {
			t.p.stats.HalfCloseTimeouts.Add(1)
			if w := t.why.Load(); w != nil {
				why := drainStalled(*w, sideNames[1-x])
				t.why.Store(&why)
			}
			break
		}
		if now.Before(deadline) {
			time.Sleep(drainPoll)
		} else {
			time.Sleep(slowDrainPoll) // a slow reader may take minutes
		}
	}
	t.abortBecause(whyProxyStopped) // the reason fail recorded stays
}

// abort ends both sides at once with a reset, so an error on one side
// reaches the other and nothing lingers.
func (t *tcpConn) abort() { t.abortBecause(whyProxyStopped) }

// abortBecause aborts, saying why in the -v=4 line, unless a reason was
// given before (fail's).
func (t *tcpConn) abortBecause(why string) {
	t.abortOnce.Do(func() {
		t.why.CompareAndSwap(nil, &why)
		t.aborted.Store(true)
		resetTCP(t.client)
		resetTCP(t.backend)
	})
}

func addrPortOf(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// resetTCP closes c with SO_LINGER 0, so the peer gets a RST instead of a
// FIN and no socket lingers in the kernel.
func resetTCP(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// abortConnsTo resets the connections that reached one of addrs, which
// are about to leave the host: a reset from them could not be sent later.
func (p *Proxier) abortConnsTo(addrs map[netip.Addr]bool) {
	p.conns.each(func(t *tcpConn) {
		if a, ok := t.client.LocalAddr().(*net.TCPAddr); ok && addrs[a.AddrPort().Addr().Unmap()] {
			t.abortBecause(whyAddressGone)
		}
	})
}

// each calls f with every live connection, under the set's lock: f must
// not wait for a connection to end.
func (s *liveSet[C]) each(f func(C)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.m {
		f(c)
	}
}

// connTracker holds the live connections, for Close.
type connTracker = liveSet[*tcpConn]
