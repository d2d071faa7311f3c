//go:build linux && !goroutines

package userspace

import (
	"fmt"
	"maps"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// On Linux TCP is served by the event loops (eventloop_linux.go): the loop
// that owns a listening socket accepts, dials the endpoint without
// blocking, and splices both directions through pooled pipes, with
// edge-triggered epoll. A proxied connection is a small struct and two
// file descriptors; nothing else is held while it is idle. This file has
// the listener and the connection; tcpdial_linux.go dials its endpoint and
// tcppump_linux.go moves its bytes.

// tcpListener is one listening TCP socket of a service port.
type tcpListener struct {
	accepters []*tcpAccepter // one per loop
	sp        *servicePort
	role      socketRole
	addr      netip.Addr // the address listened on
	fd        int
	port_     uint16
	sources   []netip.Prefix // the sources its socket filter admits; nil: no filter (see filterSources)
}

func listenTCP(sp *servicePort, k sockKey) (socket, error) {
	loops, err := sp.p.eventLoops()
	if err != nil {
		return nil, err
	}
	fam := familyOf(k.addr.Addr())
	fd, err := unix.Socket(domainOf(fam), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := sp.p.keepListener(fd, func() { unix.Close(fd) }); err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	fail := func(op string, err error) (socket, error) {
		unix.Close(fd)
		sp.p.fds.listenerClosed()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fail("setsockopt SO_REUSEADDR", err)
	}
	if fam == familyIPv6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			return fail("setsockopt IPV6_V6ONLY", err)
		}
	}
	// Accepted sockets inherit these from the listener (the kernel clones
	// the listener's socket), which saves three setsockopt calls per
	// connection.
	if err := setTCPOptions(fd); err != nil {
		return fail("setsockopt", err)
	}
	if err := unix.Bind(fd, sockaddr(fam, k.addr)); err != nil {
		return fail("bind", err)
	}
	if err := unix.Listen(fd, 4096); err != nil {
		return fail("listen", err)
	}
	port, err := localPort(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	l := &tcpListener{sp: sp, role: k.role, addr: k.addr.Addr(), fd: fd, port_: port}
	for _, lp := range loops {
		a := &tcpAccepter{l: l, lp: lp}
		a.timer = timerEntry{index: -1, owner: a}
		lp.do(func() { err = a.arm() })
		if err != nil {
			l.close()
			return nil, err
		}
		l.accepters = append(l.accepters, a)
	}
	return l, nil
}

func domainOf(f family) int {
	if f == familyIPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// setTCPOptions turns on TCP_NODELAY (we forward what arrives at once) and
// keep-alive (a peer that vanished is noticed and its fds freed).
func setTCPOptions(fd int) error {
	if err := setNoDelay(fd); err != nil {
		return err
	}
	return setKeepAlive(fd)
}

func setNoDelay(fd int) error {
	return rawSetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
}

func setKeepAlive(fd int) error {
	if err := rawSetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1); err != nil {
		return err
	}
	return rawSetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(keepAlive.Idle.Seconds()))
}

// The endpoint's socket gets the same options as the client's, but only
// once they can matter, which saves its three setsockopt calls on a short
// connection, a sixth of the system calls it costs (bench/README.md):
//
//   - TCP_NODELAY before its second write, or a first one too big for one
//     segment. Nagle's algorithm holds back only a small segment sent while
//     data is unacknowledged, so a first write of one segment goes out at
//     once either way.
//   - Keep-alive once the connection has lived keepAliveAfter, from its
//     timer (see setTimer). The first probe is due keepAlive.Idle after
//     the socket last heard from its peer, so it comes at most
//     keepAliveAfter later than it would have.
const (
	keepAliveAfter = time.Second
	// oneSegment is a write that fits one segment on the paths one meets:
	// below 536, the MSS IPv4 assumes when the peer announces none (RFC
	// 9293, 3.7.1). A peer that announces less may wait one round trip for
	// the tail of a first write.
	oneSegment = 512
)

// Bits of tcpConn.endpointOpts.
const (
	endpointWritten   = 1 << iota // something was written to the endpoint
	endpointNoDelay               // TCP_NODELAY is on
	endpointKeepAlive             // keep-alive is on
)

// beforeWrite is called before n bytes of direction i are written: to
// the endpoint (i is 0), it sets TCP_NODELAY on its socket when needed.
func (c *tcpConn) beforeWrite(i, n int) {
	if i != 0 || c.endpointOpts&endpointNoDelay != 0 {
		return
	}
	if c.endpointOpts&endpointWritten != 0 || n > oneSegment {
		_ = setNoDelay(c.bfd)
		c.endpointOpts |= endpointNoDelay
	}
	c.endpointOpts |= endpointWritten
}

func (l *tcpListener) port() uint16 { return l.port_ }

// close stops accepting; connections already accepted keep running. Each
// loop lets go of the socket between two batches of events, so none holds
// an event for it when it is closed and its number is reused. The last
// one first takes the connections the kernel has queued, which closing
// the socket would reset: their clients' connects had succeeded, as
// connections a loop had got round to accepting (unless the proxier is
// closing, which ends every connection).
func (l *tcpListener) close() {
	if l.fd < 0 {
		return
	}
	drain := l.sp.p.ctx.Err() == nil
	for i, a := range l.accepters {
		last := i == len(l.accepters)-1
		a.lp.do(func() {
			a.closed = true
			a.lp.unschedule(&a.timer)
			a.lp.unregister(l.fd)
			if last && drain {
				for range maxDrained {
					if !l.accept(a) {
						break
					}
				}
			}
		})
	}
	unix.Close(l.fd)
	l.fd = -1
	l.sp.p.fds.listenerClosed()
}

// tcpAccepter is a listening socket's registration with one loop: every
// loop waits on every TCP listening socket, with EPOLLEXCLUSIVE, so the
// kernel wakes one loop that is waiting (an idle one) for a new
// connection, rather than all of them. A loop that is busy sees the socket
// readable in its next wait and may take the connection too; the loser of
// that race gets EAGAIN. A connection stays on the loop that accepted it:
// handing it to another loop cost more than it spread.
type tcpAccepter struct {
	l  *tcpListener
	lp *eventLoop
	// Owned by the loop.
	timer  timerEntry // ends a pause (see pause)
	closed bool       // the listener is closing: never arm again
}

func (a *tcpAccepter) event(uint32) { a.l.accept(a) }

// arm registers the listening socket with the loop.
func (a *tcpAccepter) arm() error {
	return a.lp.register(a.l.fd, unix.EPOLLIN|unix.EPOLLEXCLUSIVE, a)
}

// acceptPause is how long a loop leaves a listening socket alone when it
// could neither accept nor shed a connection for want of descriptors.
const acceptPause = 100 * time.Millisecond

// pause takes the listening socket out of the loop for acceptPause: it is
// level-triggered, and the connections that wait on it cannot be taken
// until a descriptor is free, so the loop would spin on it.
func (a *tcpAccepter) pause() {
	a.lp.unregister(a.l.fd)
	a.lp.schedule(&a.timer, time.Now().Add(acceptPause))
}

// expired ends a pause.
func (a *tcpAccepter) expired(time.Time) time.Time {
	if !a.closed {
		if err := a.arm(); err != nil {
			klog.ErrorS(err, "Cannot watch a listening socket again; retrying", "service", a.l.sp.name)
			return time.Now().Add(acceptPause)
		}
	}
	return time.Time{}
}

// accept takes one pending connection for loop lp. One per wake-up, as
// nginx does: the socket is level-triggered, so the rest wake a loop that
// is waiting, or come back in lp's next wait; a burst of connections is
// spread over the loops instead of landing on whichever woke first.
// Errors that leave the next connection acceptable (an aborted one, a shed
// one) are skipped, a bounded number of times. It reports whether more
// may wait: false when none did, or none could be taken.
func (l *tcpListener) accept(a *tcpAccepter) bool {
	lp := a.lp
	p := l.sp.p
	for range 64 {
		nfd, client, err := rawAccept4(l.fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		switch {
		case err == nil:
		case err == unix.EAGAIN:
			return false
		case err == unix.EINTR || err == unix.ECONNABORTED:
			continue
		case isResourceExhausted(err):
			r := p.shed.withSpare(func() shedResult {
				fd, _, err := rawAccept4(l.fd, unix.SOCK_CLOEXEC)
				switch {
				case err == unix.EAGAIN:
					return shedNone
				case err != nil:
					return shedFailed
				}
				resetFD(fd)
				return shedOne
			})
			if r == shedNone {
				return false // another loop took the connection: none waits
			}
			shed := r == shedOne
			if shed {
				p.stats.TCPAccepted.Add(1) // taken, and shed (see Stats.TCPAccepted)
			}
			p.shed.report(&p.stats, err, l.sp.name.String(), shed)
			if !shed {
				a.pause()
				return false
			}
			continue
		default:
			p.stats.AcceptErrors.Add(1)
			klog.V(2).InfoS("Accept failed", "service", l.sp.name, "err", err)
			return false
		}
		p.stats.TCPAccepted.Add(1)
		if err := p.keepFD(nfd, func() { resetFD(nfd) }); err != nil {
			// Down to the reserve (fdreserve.go), or on the spare's
			// number: shed it, as at EMFILE.
			p.shed.report(&p.stats, err, l.sp.name.String(), true)
			continue
		}
		if !l.sp.admits(l.role, l.addr, client) || l.role == roleNodePort && l.servesServiceAddrs(nfd, client) {
			resetFD(nfd)
			continue
		}
		startConn(lp, l, nfd, client)
		return true
	}
	return true
}

// servesServiceAddrs reports whether connection cfd, accepted on a node
// port listening on every address, reached it at a service address the
// portal put on this host, or at a loopback address with
// NoLocalhostNodePorts, where node ports are not served (see
// Proxier.frontendAddrs). It costs a getsockname only with such addresses
// or that option.
func (l *tcpListener) servesServiceAddrs(cfd int, client netip.AddrPort) bool {
	if !l.addr.IsUnspecified() || l.sp.p.frontendAddrs.Load() == nil && !l.sp.p.cfg.NoLocalhostNodePorts {
		return false
	}
	local, err := rawGetsockname(cfd)
	return err == nil && l.sp.nodePortRefuses(l.role, local.Addr(), client)
}

// resetFD closes fd with SO_LINGER 0, so the peer gets a RST and nothing
// lingers in the kernel.
func resetFD(fd int) {
	rawLinger0(fd)
	rawClose(fd)
}

// tcpConn is one proxied connection: a state machine driven by epoll
// events and its timer. Bytes flow both ways until each side has finished
// sending. A side that finishes (EOF) is passed on as a half-close
// (shutdown SHUT_WR), so request-then-shutdown protocols keep their
// replies; the other direction then runs under TCPHalfCloseTimeout, so no
// socket is left in FIN_WAIT2 or CLOSE_WAIT for ever (the failure that made
// the legacy proxier drop half-close: kubernetes/kubernetes#18354).
type tcpConn struct {
	lp     *eventLoop // the loop that owns the connection
	l      *tcpListener
	b      *balancer
	client netip.AddrPort
	cfd    int
	bfd    int

	endpoint netip.AddrPort // the current dial attempt's, then the connection's
	// race holds the earlier dial attempts that timed out and still
	// connect, racing the current one (bfd); nil until an attempt failed
	// or timed out.
	race    *dialRace
	attempt int
	dialing bool
	active  bool // counted in TCPActive
	closed  bool
	// endpointOpts says which of the options set late on the endpoint's
	// socket it has (see beforeWrite): in the padding, as
	// drainUnacked below.
	endpointOpts uint8
	// drainUnacked is what the other side had not acknowledged when a
	// drain without a deadline last looked (see stalled); here, in the
	// padding after the flags, so connections keep their size.
	drainUnacked int32

	dirs  [2]spliceDir // 0: client to endpoint; 1: endpoint to client
	moved [2]uint64    // bytes each way, for the -v=4 log
	since time.Time    // when proxying began
	why   string       // why it was reset, for the -v=4 line
	// readable[i] says the source of direction i may have data: set by
	// an EPOLLIN event, cleared by a short read. With edge-triggered epoll
	// a short read means the socket is drained, and data that arrives later
	// brings a new event, so the read that would only say EAGAIN is saved
	// (nginx does the same). hup[i] says the source has shut down: then
	// reading goes on until it returns the EOF. Both sockets are
	// registered before the endpoint is connected, and registering a
	// socket that already has data reports it, so the flags also tell
	// whether data came while dialing: the first pump reads only a side
	// that has something to read.
	readable, hup [2]bool
	halfClosed    bool
	// failing says a side failed (a reset, most often) while proxying:
	// failedSide, 0 for the client, 1 for the endpoint (the index of the
	// direction it is the source of). What it sent before is still
	// passed on; then the other side is reset (see fail).
	failing    bool
	finFirst   bool // the failed side had sent its FIN: no drain deadline (beside failing: no bigger struct)
	failedSide int
	// header is the PROXY protocol header, which goes to the endpoint
	// before any byte of the client's; nil without one, or once sent. A
	// pointer, so connections without one stay as small as they were.
	header *pendingHeader
	// lastProgress is when data last moved while half-closed, or while
	// draining without a deadline (finFirst), when the other side last
	// took or acknowledged data.
	lastProgress time.Time
	deadline     time.Time // while dialing, the attempt's; once a side failed, the drain's
	timer        timerEntry

	clientSide, backendSide connSide
}

// connSide is the epoll handler of one of a connection's two sockets.
type connSide struct {
	c       *tcpConn
	backend bool
}

func (s *connSide) event(ev uint32) {
	c := s.c
	if c.closed {
		return
	}
	i := 0 // the direction this socket is the source of
	if s.backend {
		i = 1
	}
	finFirst := c.hup[i] // its FIN came in an earlier event
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.readable[i] = true
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.hup[i] = true
	}
	if c.dialing {
		switch {
		case s.backend:
			c.dialProgress(ev)
		case ev&(unix.EPOLLERR|unix.EPOLLHUP) != 0:
			// The client reset (a FIN alone is only RDHUP, and is passed
			// on once connected): nobody is left to dial for.
			c.abort()
		}
		return // client data waits until the endpoint is connected
	}
	c.pump()
	if ev&unix.EPOLLERR != 0 && !c.closed && !(c.failing && c.failedSide == i) {
		// The socket failed (a reset, a keep-alive timeout) while what it
		// had sent waited for the other side to take it, so the pump did
		// not read it to find out: pass the failure on now, or the other
		// side, stalled, would keep the connection for ever.
		soErr, err := rawGetsockoptInt(c.socket(i), unix.SOL_SOCKET, unix.SO_ERROR)
		if err == nil && soErr != 0 {
			err = unix.Errno(soErr)
		}
		from := "client"
		if s.backend {
			from = "endpoint"
		}
		// A socket whose peer had sent its FIN is left EPIPE by a reset,
		// ECONNRESET otherwise (tcp_reset); a FIN reported in an earlier
		// event came first whatever the error (a keep-alive timeout, or a
		// reset once this side had sent its FIN too). Either way all the
		// side sent is here: its failure must not cut that short (fail).
		c.fail(i, sideFailed(from, true, err), finFirst || err == unix.EPIPE)
		c.pump()
	}
}

// socket returns the socket that is the source of direction i.
func (c *tcpConn) socket(i int) int {
	if i == 1 {
		return c.bfd
	}
	return c.cfd
}

func (s *connSide) shut() { s.c.abort() }

const connEvents = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET

// startConn takes over an accepted socket on loop lp and dials an endpoint
// for it.
func startConn(lp *eventLoop, l *tcpListener, cfd int, client netip.AddrPort) {
	p := l.sp.p
	c := &tcpConn{lp: lp, l: l, b: l.sp.balancer(l.role, client.Addr()), client: client, cfd: cfd, bfd: -1}
	c.timer = timerEntry{index: -1, owner: c}
	c.clientSide = connSide{c: c}
	c.backendSide = connSide{c: c, backend: true}
	ep, why, err := c.b.choose(client.Addr(), nil)
	if err != nil {
		p.stats.TCPNoEndpoints.Add(1)
		if klog.V(4).Enabled() {
			klog.InfoS("No endpoints; resetting connection", "service", l.sp.name, "client", client)
		}
		resetFD(cfd)
		return
	}
	if v := state.ProxyProtocol(l.sp.proxyProtocol.Load()); v != state.ProxyProtocolNone {
		c.header = l.proxyHeader(v, cfd, client)
	}
	if err := lp.register(cfd, connEvents, &c.clientSide); err != nil {
		resetFD(cfd)
		return
	}
	if klog.V(4).Enabled() {
		l.sp.explainPick(c.b, l.role, client, ep, why, 1)
	}
	c.dial(ep)
}

// pendingHeader is a connection's PROXY protocol header and how much of
// it the endpoint has taken.
type pendingHeader struct {
	buf     [maxProxyHeader]byte
	n, sent int
}

// proxyHeader returns the PROXY protocol header of version v for the
// connection cfd from client: to the frontend the client addressed, the
// original destination of a redirected connection, else the address it
// reached the socket at.
func (l *tcpListener) proxyHeader(v state.ProxyProtocol, cfd int, client netip.AddrPort) *pendingHeader {
	var dst netip.AddrPort
	if l.role.redirected() {
		dst, _ = originalDst(cfd, familyOf(client.Addr()) == familyIPv6)
	}
	if !dst.IsValid() {
		dst, _ = rawGetsockname(cfd)
	}
	h := &pendingHeader{}
	h.n = len(appendProxyHeader(h.buf[:0], v, client, dst))
	return h
}

// sendHeader writes what remains of the PROXY protocol header to the
// endpoint. It reports false when the endpoint cannot take more now
// (EPOLLOUT brings us back) or it failed (c.failing, or c.closed).
func (c *tcpConn) sendHeader() bool {
	h := c.header
	for h.sent < h.n {
		c.beforeWrite(0, h.n-h.sent)
		n, err := rawWrite(c.bfd, h.buf[h.sent:h.n])
		switch err {
		case nil:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			c.failWriting(1, "endpoint", err)
			return false
		}
		h.sent += n
	}
	c.header = nil
	return true
}

// expired handles the connection's timer: a dial that took too long, a
// connection one side of which failed that has delivered what that side
// sent or may wait no longer, a half-closed connection that stayed
// silent too long (nothing moved and nothing waited to be sent), and,
// whatever else it waits for, keep-alive on the endpoint's socket once
// the connection has lived keepAliveAfter.
func (c *tcpConn) expired(now time.Time) time.Time {
	switch {
	case c.closed:
		return time.Time{}
	case c.dialing:
		if now.Before(c.deadline) {
			return c.deadline
		}
		c.dialTimedOut()
		if c.dialing && !c.closed {
			return c.deadline
		}
		return time.Time{}
	}
	if due := c.keepAliveDue(); !due.IsZero() && !due.After(now) {
		_ = setKeepAlive(c.bfd)
		c.endpointOpts |= endpointKeepAlive
	}
	next := c.connectedExpired(now)
	if c.closed {
		return next
	}
	return c.soonerForKeepAlive(next)
}

// keepAliveDue is when keep-alive goes on the endpoint's socket, or zero
// once it is on (or before the endpoint is connected).
func (c *tcpConn) keepAliveDue() time.Time {
	if c.endpointOpts&endpointKeepAlive != 0 || c.since.IsZero() {
		return time.Time{}
	}
	return c.since.Add(keepAliveAfter)
}

// setTimer schedules the connected connection's timer at d (see
// soonerForKeepAlive).
func (c *tcpConn) setTimer(d time.Time) {
	c.lp.schedule(&c.timer, c.soonerForKeepAlive(d))
}

// soonerForKeepAlive returns d (zero: no deadline), or when keep-alive is
// due on the endpoint's socket if that is sooner: a connection
// half-closed or draining by then needs it as much as an open one (a
// side that vanished while the other still sends is found by it).
func (c *tcpConn) soonerForKeepAlive(d time.Time) time.Time {
	if due := c.keepAliveDue(); !due.IsZero() && (d.IsZero() || due.Before(d)) {
		return due
	}
	return d
}

// connectedExpired is expired for a connected connection: the drain of
// one that failed, or the silence of one half-closed. It returns the
// next deadline, or zero when there is none.
func (c *tcpConn) connectedExpired(now time.Time) time.Time {
	p := c.l.sp.p
	switch {
	case c.failing:
		if !c.finFirst && !now.Before(c.deadline) || c.delivered() {
			c.abort()
			return time.Time{}
		}
		if c.finFirst {
			if c.stalled(now) {
				p.stats.HalfCloseTimeouts.Add(1)
				c.why = drainStalled(c.why, sideNames[1-c.failedSide])
				c.abort()
				return time.Time{}
			}
			if c.dirs[c.failedSide].shut {
				return c.nextDrainPoll(now) // waiting for the acknowledgement
			}
			// Waiting for the other side to take more (EPOLLOUT), and
			// looking whether it acknowledges anything meanwhile.
			return now.Add(slowDrainPoll)
		}
		if next := c.nextDrainPoll(now); c.dirs[c.failedSide].shut && !next.IsZero() {
			return next // waiting for the acknowledgement
		}
		return c.deadline // waiting for the other side to take more (EPOLLOUT)
	case c.halfClosed:
		if d := c.lastProgress.Add(p.cfg.TCPHalfCloseTimeout); d.After(now) {
			return d
		}
		if c.holdsData() || c.queued() {
			// Not silent: data waits for a reader that has paused, in
			// the proxy or in a socket's send queue, as the goroutine
			// build waits in its write. Once it moves again, the
			// timeout counts from then.
			return now.Add(p.cfg.TCPHalfCloseTimeout)
		}
		p.stats.HalfCloseTimeouts.Add(1)
		c.abortBecause(whyHalfCloseSilent)
	}
	return time.Time{}
}

// holdsData reports whether the proxy holds data that one side has sent
// and the other has not taken yet.
func (c *tcpConn) holdsData() bool {
	for i := range c.dirs {
		if d := &c.dirs[i]; len(d.buf) > 0 || d.pending > 0 {
			return true
		}
	}
	return false
}

// queued reports whether either socket has data in its send queue that
// its peer's window has not let the kernel send yet (SIOCOUTQNSD): data
// the proxy has handed on, waiting for a reader that has paused. What is
// sent and not yet acknowledged does not count, so a peer that vanished
// does not hold the connection.
func (c *tcpConn) queued() bool {
	for _, fd := range [2]int{c.cfd, c.bfd} {
		if n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQNSD); err == nil && n > 0 {
			return true
		}
	}
	return false
}

// finish closes a connection both sides have finished with.
func (c *tcpConn) finish() { c.release(false) }

// abort ends both sides at once with a reset, so an error on one side
// reaches the other and nothing lingers.
func (c *tcpConn) abort() { c.release(true) }

// abortBecause aborts, saying why in the -v=4 line.
func (c *tcpConn) abortBecause(why string) {
	if c.why == "" {
		c.why = why
	}
	c.abort()
}

func (c *tcpConn) release(reset bool) {
	if c.closed {
		return
	}
	c.closed = true
	lp := c.lp
	lp.unschedule(&c.timer)
	for _, fd := range []int{c.cfd, c.bfd} {
		if fd < 0 {
			continue
		}
		if reset {
			rawLinger0(fd)
		}
		lp.closeFD(fd)
	}
	c.cfd, c.bfd = -1, -1
	if c.race != nil {
		for i := range c.race.racers {
			if r := &c.race.racers[i]; r.fd >= 0 {
				lp.closeFD(r.fd) // never carried data: a plain close
				r.fd = -1
			}
		}
	}
	for i := range c.dirs {
		if d := &c.dirs[i]; d.p != nil {
			if d.pending > 0 {
				d.p.close() // data left in it; never reuse
			} else {
				putPipe(d.p)
			}
			d.p = nil
		}
	}
	if c.active {
		c.active = false
		c.l.sp.connClosed(&c.l.sp.p.stats.TCPActive)
		if klog.V(4).Enabled() {
			logConnEnded(c.l.sp.name, c.client, c.endpoint, c.moved, c.since, reset, c.why)
		}
	}
}

// connFDs lists the sockets of the proxied connections (for tests).
func (p *Proxier) connFDs() []int {
	var fds []int
	for _, lp := range p.loops {
		lp.do(func() {
			for fd, h := range lp.handlers {
				if _, ok := h.(*connSide); ok {
					fds = append(fds, int(fd))
				}
			}
		})
	}
	return fds
}

// abortConnsTo resets the connections that reached one of addrs, which
// are about to leave the host: a reset from them could not be sent later.
func (p *Proxier) abortConnsTo(addrs map[netip.Addr]bool) {
	for _, lp := range p.loops {
		lp.do(func() {
			for _, h := range maps.Clone(lp.handlers) {
				if cs, ok := h.(*connSide); ok && !cs.backend && addrs[cs.c.l.addr] {
					cs.c.abortBecause(whyAddressGone)
				}
			}
			lp.flushCloses()
		})
	}
}

// connTracker is what the goroutine data plane uses to find live
// connections; the event loops own theirs.
type connTracker struct{}

func (connTracker) abortAll() {}
