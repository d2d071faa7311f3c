//go:build !linux || goroutines

package userspace

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// tcpListener accepts connections for one socket of a service port and hands
// each to its own goroutine, so a slow or dead endpoint never delays the
// accept loop (the legacy proxier dialed inline: up to 3.75 s per client).
type tcpListener struct {
	sp   *servicePort
	role socketRole
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
	l := &tcpListener{sp: sp, role: k.role, ln: ln, done: make(chan struct{})}
	sp.p.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func (l *tcpListener) port() uint16 {
	return uint16(l.ln.Addr().(*net.TCPAddr).Port)
}

func (l *tcpListener) close() {
	l.once.Do(func() { l.ln.Close() })
	<-l.done
}

func (l *tcpListener) acceptLoop() {
	p := l.sp.p
	defer p.wg.Done()
	defer close(l.done)
	var backoff time.Duration
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if isResourceExhausted(err) {
				p.stats.Shed.Add(1)
				p.shed.log(err, l.sp.name.String())
				p.shed.shedTCP(l.ln)
				continue
			}
			// Other accept errors are rare and usually transient (e.g.
			// ECONNABORTED is retried by the runtime already); back off so a
			// persistent one cannot spin.
			p.stats.AcceptErrors.Add(1)
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			klog.V(2).InfoS("Accept failed; retrying", "service", l.sp.name, "err", err, "backoff", backoff)
			select {
			case <-time.After(backoff):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		p.stats.TCPAccepted.Add(1)
		p.wg.Add(1)
		go l.serveConn(c)
	}
}

// serveConn dials an endpoint for c, with failover, and proxies between the
// two until both sides are done.
func (l *tcpListener) serveConn(c *net.TCPConn) {
	p := l.sp.p
	defer p.wg.Done()
	client := addrPortOf(c.RemoteAddr())
	b := l.sp.balancer(l.role)
	backend, ep, err := p.dialTCP(b, client.Addr(), l.sp)
	if err != nil {
		resetTCP(c)
		return
	}
	t := &tcpConn{p: p, client: c, backend: backend}
	if !p.track(t) {
		resetTCP(c)
		resetTCP(backend)
		return
	}
	p.stats.TCPActive.Add(1)
	if klog.V(4).Enabled() {
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

// dialTCP connects to an endpoint chosen by b. A failed attempt moves on to
// another endpoint with the next, longer timeout and replaces the client's
// affinity; at most len(DialTimeouts) attempts are made.
func (p *Proxier) dialTCP(b *balancer, client netip.Addr, sp *servicePort) (*net.TCPConn, netip.AddrPort, error) {
	var tried []netip.AddrPort
	var lastErr error
	for _, timeout := range p.cfg.DialTimeouts {
		ep, err := b.pick(client, tried)
		if err != nil {
			p.stats.TCPNoEndpoints.Add(1)
			if klog.V(4).Enabled() {
				klog.InfoS("No endpoints; resetting connection", "service", sp.name, "client", client)
			}
			return nil, ep, err
		}
		d := net.Dialer{Timeout: timeout, KeepAliveConfig: keepAlive}
		conn, err := d.DialContext(p.ctx, "tcp", ep.String())
		if err == nil {
			return conn.(*net.TCPConn), ep, nil
		}
		if isResourceExhausted(err) {
			p.stats.Shed.Add(1)
			p.shed.log(err, sp.name.String())
			return nil, ep, err
		}
		if p.ctx.Err() != nil {
			return nil, ep, p.ctx.Err()
		}
		p.stats.TCPDialFailures.Add(1)
		b.penalize(ep, p.cfg.EndpointPenalty)
		klog.V(3).InfoS("Dial to endpoint failed; trying another", "service", sp.name, "endpoint", ep, "client", client, "err", err)
		tried = append(tried, ep)
		lastErr = err
	}
	p.stats.TCPDialGiveUps.Add(1)
	klog.V(2).InfoS("Every dial attempt failed; resetting connection", "service", sp.name, "client", client, "tried", len(tried), "err", lastErr)
	return nil, netip.AddrPort{}, lastErr
}

// tcpConn is one proxied connection: bytes flow both ways until each side
// has finished sending. A side that finishes (EOF) is passed on as a
// half-close (CloseWrite), so request-then-shutdown protocols keep their
// replies; the other direction then runs under TCPHalfCloseTimeout, so no
// socket is left in FIN_WAIT2 or CLOSE_WAIT for ever (the failure that made
// the legacy proxier drop half-close: kubernetes/kubernetes#18354).
type tcpConn struct {
	p       *Proxier
	client  *net.TCPConn
	backend *net.TCPConn
	// halfClosed is set once either direction has ended with EOF.
	halfClosed atomic.Bool
	// pending counts the directions still copying; the last one to finish
	// closes both sockets.
	pending   atomic.Int32
	abortOnce sync.Once
}

// copyToBackend and copyToClient are named so goroutine dumps say which
// direction is blocked.
func (t *tcpConn) copyToBackend() {
	defer t.directionDone()
	t.pipe(t.backend, t.client, &t.p.stats.BytesToBackend)
}

func (t *tcpConn) copyToClient() {
	defer t.directionDone()
	t.pipe(t.client, t.backend, &t.p.stats.BytesToClient)
}

func (t *tcpConn) directionDone() {
	if t.pending.Add(-1) == 0 {
		t.client.Close()
		t.backend.Close()
		t.p.untrack(t)
		t.p.stats.TCPActive.Add(-1)
	}
	t.p.wg.Done()
}

func (t *tcpConn) pipe(dst, src *net.TCPConn, counter *atomic.Uint64) {
	progress := func(n int) {
		counter.Add(uint64(n))
		if t.halfClosed.Load() {
			_ = src.SetReadDeadline(time.Now().Add(t.p.cfg.TCPHalfCloseTimeout))
		}
	}
	err := copyStream(dst, src, progress)
	if err == nil {
		if t.halfClosed.Load() {
			// Both sides have finished sending: directionDone closes both sockets,
			// which sends dst its FIN without a separate shutdown.
			return
		}
		// src sent FIN: pass it on and bound the other direction.
		if cerr := dst.CloseWrite(); cerr != nil {
			t.abort()
			return
		}
		if !t.halfClosed.Swap(true) {
			_ = dst.SetReadDeadline(time.Now().Add(t.p.cfg.TCPHalfCloseTimeout))
		}
		return
	}
	if errors.Is(err, net.ErrClosed) {
		return // the other direction or Close ended the connection
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.p.stats.HalfCloseTimeouts.Add(1)
	}
	t.abort()
}

// abort ends both sides at once with a reset, so an error on one side
// reaches the other and nothing lingers.
func (t *tcpConn) abort() {
	t.abortOnce.Do(func() {
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

// shedTCP accepts and resets one pending connection from ln, using the
// shedder's spare descriptor.
func (s *shedder) shedTCP(ln *net.TCPListener) {
	s.withSpare(func() {
		if c, err := ln.AcceptTCP(); err == nil {
			resetTCP(c)
		}
	})
}

// resetTCP closes c with SO_LINGER 0, so the peer gets a RST instead of a
// FIN and no socket lingers in the kernel.
func resetTCP(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// connTracker lets Close find and end live connections.
type connTracker struct {
	connMu sync.Mutex // guards conns
	conns  map[*tcpConn]struct{}
}

func (p *Proxier) track(c *tcpConn) bool {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.ctx.Err() != nil {
		return false
	}
	if p.conns == nil {
		p.conns = make(map[*tcpConn]struct{})
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxier) untrack(c *tcpConn) {
	p.connMu.Lock()
	delete(p.conns, c)
	p.connMu.Unlock()
}

func (t *connTracker) abortAll() {
	t.connMu.Lock()
	defer t.connMu.Unlock()
	for c := range t.conns {
		c.abort()
	}
}
