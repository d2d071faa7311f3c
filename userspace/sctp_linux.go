package userspace

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp"
)

// SCTP service ports are served by goroutines on Go's poller, on every
// Linux build: SCTP is rare enough that the event loops' economy does not
// matter, and one-to-one SCTP sockets poll like TCP ones.
//
// The relay keeps messages: each message is read whole (up to
// maxSCTPMessage) and sent on as one message with the same stream id, PPID
// and ordering, as a user of SCTP expects of a proxy. SCTP has no
// half-close (shutdown(SHUT_WR) loses the peer's reply; see
// reference/sctp-testing.md), so when either side shuts its association
// down the proxy shuts down both, after what was read has been sent on.

const (
	// sctpClientOutStreams is the number of streams the proxy offers each
	// client for replies. Toward an endpoint it asks for as many streams as
	// the client opened toward it, so requests keep their stream ids.
	sctpClientOutStreams = 64
	// maxSCTPMessage bounds one message; a longer one aborts both
	// associations. The proxy's send buffers are asked to be as large, as a
	// message must fit the sender's buffer whole; without CAP_NET_ADMIN the
	// kernel caps them at net.core.wmem_max (twice it, in fact), which is
	// also the most a client with default settings can send.
	maxSCTPMessage = 4 << 20
	// sctpReadBuffer is the buffer a message is read into first; it grows
	// up to maxSCTPMessage for longer ones.
	sctpReadBuffer = 64 << 10
)

var sctpBuffers = sync.Pool{New: func() any { b := make([]byte, sctpReadBuffer); return &b }}

func sctpAvailable() error { return sctp.Available() }

// sctpListener accepts associations for one socket of a service port and
// serves each on its own goroutines.
type sctpListener struct {
	sp   *servicePort
	role socketRole
	addr netip.Addr // the address listened on
	ln   *sctp.Listener
	done chan struct{} // closed when the accept loop has returned
	once sync.Once
}

func listenSCTP(sp *servicePort, k sockKey) (socket, error) {
	ln, err := sctp.Listen(k.addr, sctp.Options{OutStreams: sctpClientOutStreams, SendBuffer: maxSCTPMessage / 2})
	if err != nil {
		return nil, err
	}
	if err := sp.p.keepListenerConn(ln, func() { ln.Close() }); err != nil {
		return nil, err
	}
	l := &sctpListener{sp: sp, role: k.role, addr: k.addr.Addr(), ln: ln, done: make(chan struct{})}
	sp.p.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func (l *sctpListener) port() uint16 { return l.ln.Addr().Port() }

// close stops accepting; associations already accepted keep running, and
// so do those still queued on the socket (drainQueued).
func (l *sctpListener) close() {
	l.once.Do(func() {
		next := queuedConns(l.ln)
		queued := func() (*sctp.Conn, bool) {
			tc, ok := next()
			if !ok {
				return nil, false
			}
			c, err := sctp.Accepted(tc)
			return c, err == nil
		}
		drainQueued(l.sp, &l.sp.p.stats.SCTPAccepted, queued, keepAccepted(l.sp, abortSCTP), l.serve)
		l.ln.Close()
		l.sp.p.fds.listenerClosed()
	})
	<-l.done
}

func (l *sctpListener) acceptLoop() {
	defer l.sp.p.wg.Done()
	defer close(l.done)
	shed := func() shedResult { return shedNone }
	if rc, err := l.ln.SyscallConn(); err == nil {
		// A reset (SO_LINGER 0) aborts an SCTP association too.
		shed = func() shedResult { return l.sp.p.shed.shedFrom(rc) }
	}
	acceptLoop(l.sp, &l.sp.p.stats.SCTPAccepted, l.ln.Accept, shed, keepAccepted(l.sp, abortSCTP), l.serve)
}

// serve dials an endpoint for client, with failover, and relays messages
// both ways until either side ends its association.
func (l *sctpListener) serve(client *sctp.Conn) {
	p := l.sp.p
	defer p.wg.Done()
	if !l.sp.admits(l.role, l.addr, client.RemoteAddr()) {
		p.fds.dialed() // see keepAccepted
		client.Abort()
		return
	}
	// Ask the endpoint for as many streams as the client opened to us.
	in, _, err := client.Streams()
	if err != nil {
		klog.V(2).InfoS("Reading the client's stream count failed", "service", l.sp.name, "client", client.RemoteAddr(), "err", err)
		in = 0
	}
	b := l.sp.balancer(l.role, client.RemoteAddr().Addr())
	backend, ep, err := dialWithFailover(p, b, l.role, client.RemoteAddr(), l.sp, p.stats.sctpDialCounters(), nil,
		func(ctx context.Context, ep netip.AddrPort, clock *dialClock) (*sctp.Conn, error) {
			// sctp.Dial offers no socket before its connect: the time
			// counts from here, and is up at the deadline whatever.
			clock.start(nil)
			c, err := sctp.Dial(ctx, ep, sctp.Options{OutStreams: in, SendBuffer: maxSCTPMessage / 2})
			if err != nil {
				return nil, err
			}
			if err := p.keepConn(c, func() { c.Abort() }); err != nil {
				return nil, err
			}
			return c, nil
		})
	p.fds.dialed()
	if err != nil {
		client.Abort()
		return
	}
	c := &sctpConn{p: p, sp: l.sp, client: client, backend: backend}
	if !p.assocs.add(p.ctx, c) {
		client.Abort()
		backend.Abort()
		return
	}
	l.sp.connOpened(&p.stats.SCTPActive)
	if klog.V(4).Enabled() {
		klog.InfoS("Proxying association", "service", l.sp.name, "client", client.RemoteAddr(), "endpoint", ep)
	}
	c.pending.Store(2)
	p.wg.Add(2)
	go c.relayToBackend()
	go c.relayToClient()
}

// abortSCTP ends c with an ABORT, the SCTP counterpart of a reset.
func abortSCTP(c *sctp.Conn) { c.Abort() }

func (s *Stats) sctpDialCounters() dialCounters {
	return dialCounters{&s.SCTPNoEndpoints, &s.SCTPDialFailures, &s.SCTPDialGiveUps}
}

// sctpConn is one proxied association pair.
type sctpConn struct {
	p       *Proxier
	sp      *servicePort
	client  *sctp.Conn
	backend *sctp.Conn
	// pending counts the directions still relaying; the last one to end
	// untracks the pair.
	pending   atomic.Int32
	closeOnce sync.Once
}

// relayToBackend and relayToClient are named so goroutine dumps say which
// direction is blocked.
func (c *sctpConn) relayToBackend() {
	defer c.directionDone()
	c.end(c.relay(c.backend, c.client, &c.p.stats.SCTPBytesIn))
}

func (c *sctpConn) relayToClient() {
	defer c.directionDone()
	c.end(c.relay(c.client, c.backend, &c.p.stats.SCTPBytesOut))
}

func (c *sctpConn) directionDone() {
	if c.pending.Add(-1) == 0 {
		c.p.shed.retake() // descriptors are free: the spare may have been missing
		c.p.assocs.remove(c)
		c.sp.connClosed(&c.p.stats.SCTPActive)
	}
	c.p.wg.Done()
}

// end closes both associations once: gracefully when a side shut down
// (err nil), else with an ABORT to both.
func (c *sctpConn) end(err error) {
	c.closeOnce.Do(func() {
		if err == nil {
			c.client.Close()
			c.backend.Close()
			return
		}
		if !errors.Is(err, net.ErrClosed) {
			klog.V(4).InfoS("Association ended", "client", c.client.RemoteAddr(), "endpoint", c.backend.RemoteAddr(), "err", err)
		}
		c.client.Abort()
		c.backend.Abort()
	})
}

// abort ends both associations with an ABORT, for Proxier.Close.
func (c *sctpConn) abort() { c.end(net.ErrClosed) }

// relay moves messages from src to dst until src shuts down (nil) or
// either fails. A read buffer is taken from the pool only once a message
// is there, so an idle association holds none.
func (c *sctpConn) relay(dst, src *sctp.Conn, counter *atomic.Uint64) error {
	// Without the count (the association may already be shutting down),
	// stream ids go on unmapped.
	_, outStreams, _ := dst.Streams()
	var (
		oob  [64]byte
		bufp *[]byte // the pooled buffer, while a message is in it
		msg  []byte  // the message so far: len is what was read
	)
	release := func() {
		if bufp != nil {
			sctpBuffers.Put(bufp) // still the pooled slice, even if msg outgrew it
		}
		bufp, msg = nil, nil
	}
	defer release()
	for {
		var (
			n    int
			info sctp.Info
			eor  bool
			rerr error
		)
		err := src.RawRead(func(fd int) bool {
			if bufp == nil {
				bufp = sctpBuffers.Get().(*[]byte)
				msg = (*bufp)[:0]
			}
			if len(msg) == cap(msg) {
				grown := make([]byte, len(msg), min(2*cap(msg), maxSCTPMessage))
				copy(grown, msg)
				msg = grown
			}
			n, info, eor, rerr = sctp.Recv(fd, msg[len(msg):cap(msg)], oob[:])
			if rerr == unix.EAGAIN {
				if len(msg) == 0 {
					release()
				}
				return false
			}
			return true
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
		if n == 0 && !eor {
			if len(msg) > 0 {
				return io.ErrUnexpectedEOF // shut down inside a message
			}
			return nil
		}
		msg = msg[:len(msg)+n]
		if !eor {
			if len(msg) == maxSCTPMessage {
				return errSCTPMessageTooLong
			}
			continue
		}
		// A stream the client did not open toward us (or the endpoint did
		// not grant) cannot be used; keep the message's order within its
		// stream by mapping it onto one that exists.
		if outStreams > 0 && info.Stream >= outStreams {
			info.Stream %= outStreams
		}
		if _, err := dst.WriteMsg(msg, info); err != nil {
			return err
		}
		counter.Add(uint64(len(msg)))
		release()
	}
}

var errSCTPMessageTooLong = errors.New("SCTP message longer than 4 MiB")

// sctpTracker holds the live associations, for Close.
type sctpTracker = liveSet[*sctpConn]
