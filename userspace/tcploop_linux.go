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
// file descriptors; nothing else is held while it is idle.

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
	if err := sp.p.fds.listenerFD(fd); err != nil {
		unix.Close(fd)
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
	if err := rawSetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return err
	}
	if err := rawSetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1); err != nil {
		return err
	}
	return rawSetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(keepAlive.Idle.Seconds()))
}

func (l *tcpListener) port() uint16 { return l.port_ }

// close stops accepting; connections already accepted keep running. Each
// loop lets go of the socket between two batches of events, so none holds
// an event for it when it is closed and its number is reused.
func (l *tcpListener) close() {
	if l.fd < 0 {
		return
	}
	for _, a := range l.accepters {
		a.lp.do(func() {
			a.closed = true
			a.lp.unschedule(&a.timer)
			a.lp.unregister(l.fd)
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
// one) are skipped, a bounded number of times.
func (l *tcpListener) accept(a *tcpAccepter) {
	lp := a.lp
	p := l.sp.p
	for range 64 {
		nfd, client, err := rawAccept4(l.fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		switch {
		case err == nil:
		case err == unix.EAGAIN:
			return
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
				return // another loop took the connection: none waits
			}
			shed := r == shedOne
			if shed {
				p.stats.TCPAccepted.Add(1) // taken, and shed (see Stats.TCPAccepted)
			}
			p.shed.report(&p.stats, err, l.sp.name.String(), shed)
			if !shed {
				a.pause()
				return
			}
			continue
		default:
			p.stats.AcceptErrors.Add(1)
			klog.V(2).InfoS("Accept failed", "service", l.sp.name, "err", err)
			return
		}
		p.stats.TCPAccepted.Add(1)
		if !p.fds.connFD(nfd) {
			// Down to the reserve (fdreserve.go): shed it, as at EMFILE.
			resetFD(nfd)
			p.shed.report(&p.stats, p.fds.errFDReserve(), l.sp.name.String(), true)
			continue
		}
		p.shed.retake()
		if !l.sp.admits(l.role, l.addr, client) || l.role == roleNodePort && l.servesServiceAddrs(nfd, client) {
			resetFD(nfd)
			continue
		}
		startConn(lp, l, nfd, client)
		return
	}
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

// spliceDir is one direction of a proxied connection.
//
// Small reads go through the loop's scratch buffer (read, then write), which
// costs less than two splices for a request or a reply; once a read fills
// the buffer the direction switches to splice, which moves bulk data
// without copying it, and back when reads get small again.
type spliceDir struct {
	p       *pipe  // holds spliced data in flight; nil when empty
	pending int    // bytes in p
	buf     []byte // read data the destination could not take yet
	bulk    bool   // splice rather than read
	eof     bool   // the source has sent FIN
	shut    bool   // the FIN has been passed on (or the connection is done)
}

// smallRead is the scratch buffer size: reads that fill it switch the
// direction to splice.
const smallRead = 16 << 10

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

	dirs  [2]spliceDir // 0: client to endpoint; 1: endpoint to client
	moved [2]uint64    // bytes each way, for the -v=4 log
	since time.Time    // when proxying began, at -v=4
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
	failedSide int
	// header is the PROXY protocol header, which goes to the endpoint
	// before any byte of the client's; nil without one, or once sent. A
	// pointer, so connections without one stay as small as they were.
	header       *pendingHeader
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
		c.fail(i, sideFailed(from, true, err))
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
		n, err := rawWrite(c.bfd, h.buf[h.sent:h.n])
		switch err {
		case nil:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			c.fail(1, sideFailed("endpoint", false, err))
			return false
		}
		h.sent += n
	}
	c.header = nil
	return true
}

// dial starts a non-blocking connect to ep with the timeout of this
// attempt.
func (c *tcpConn) dial(ep netip.AddrPort) {
	p := c.l.sp.p
	c.endpoint = ep
	c.deadline = time.Now().Add(p.cfg.DialTimeouts[c.attempt])
	fam := familyOf(ep.Addr())
	fd, err := rawSocket(domainOf(fam), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err == nil && !p.fds.connFD(fd) {
		rawClose(fd) // down to the reserve (fdreserve.go)
		err = p.fds.errFDReserve()
	}
	if err != nil {
		if isResourceExhausted(err) {
			p.stats.Shed.Add(1)
			p.shed.log(err, c.l.sp.name.String())
		}
		c.abort()
		return
	}
	_ = setTCPOptions(fd)
	c.bfd = fd
	err = rawConnect(fd, fam, ep)
	if err != nil && err != unix.EINPROGRESS {
		c.dialFailed(err)
		return
	}
	if err := c.lp.register(fd, connEvents, &c.backendSide); err != nil {
		c.dialFailed(err)
		return
	}
	if err == nil {
		c.connected()
		return
	}
	c.dialing = true
	c.lp.schedule(&c.timer, c.deadline)
}

// dialProgress looks at the endpoint socket while connecting.
func (c *tcpConn) dialProgress(ev uint32) {
	if ev&(unix.EPOLLERR|unix.EPOLLHUP) == 0 {
		if ev&unix.EPOLLOUT != 0 {
			c.connected() // writable without an error: the handshake is done
		}
		return
	}
	soErr, err := rawGetsockoptInt(c.bfd, unix.SOL_SOCKET, unix.SO_ERROR)
	switch {
	case err != nil:
		c.dialFailed(err)
	case soErr != 0:
		c.dialFailed(unix.Errno(soErr))
	case ev&unix.EPOLLOUT != 0:
		c.connected()
	}
}

// dialFailed handles the failure of the current dial attempt (refused,
// unreachable): it moves on at once to another endpoint with the next,
// longer timeout (the failed one is passed over for a while and the
// client's affinity replaced). With no attempt left worth making, or no
// endpoint left at all, the earlier attempts that still connect (see
// dialTimedOut) keep the time the attempts not made would have had (see
// keepRacing). With none still connecting, the client is reset.
func (c *tcpConn) dialFailed(err error) {
	p := c.l.sp.p
	c.closeBackend()
	if isResourceExhausted(err) {
		p.stats.Shed.Add(1)
		p.shed.log(err, c.l.sp.name.String())
		c.abort()
		return
	}
	c.attemptFailed(c.endpoint, err)
	r := c.racing()
	r.tried = append(r.tried, c.endpoint)
	c.attempt++
	if c.attempt < len(p.cfg.DialTimeouts) {
		ep, why, perr := c.b.choose(c.client.Addr(), r.tried)
		if perr != nil {
			if r.pending() {
				c.keepRacing(err)
				return
			}
			p.stats.TCPNoEndpoints.Add(1)
			c.abort()
			return
		}
		if worthDialing(ep, r.tried, err) {
			if klog.V(4).Enabled() {
				c.l.sp.explainPick(c.b, c.l.role, c.client, ep, why, c.attempt+1)
			}
			c.dial(ep)
			return
		}
	}
	if r.pending() {
		c.keepRacing(err)
		return
	}
	c.giveUp(err)
}

// keepRacing is what is left when no further attempt is made (none is
// worth making, or no endpoint is left: they went, or the Service did)
// while earlier ones still connect: they keep the time the attempts not
// made would have had, from the deadline of the current one, the bound a
// connection whose attempts all time out has. (Under kube-proxy's kernel
// modes, a SYN that was sent goes on being retransmitted to its endpoint
// after the Service changed.) Then the timer gives up (see
// dialTimedOut); err is why the last attempt failed.
func (c *tcpConn) keepRacing(err error) {
	c.race.lastErr = err
	c.deadline = c.deadline.Add(sumDurations(c.l.sp.p.cfg.DialTimeouts[c.attempt:]))
	c.lp.schedule(&c.timer, c.deadline)
}

// attemptFailed counts and logs a failed dial attempt to ep, and passes
// over ep for a while.
func (c *tcpConn) attemptFailed(ep netip.AddrPort, err error) {
	p := c.l.sp.p
	p.stats.TCPDialFailures.Add(1)
	c.b.penalize(ep, p.cfg.EndpointPenalty)
	klog.V(3).InfoS("Dial to endpoint failed", "service", c.l.sp.name, "endpoint", ep, "client", c.client, "err", err)
}

// giveUp resets the client once every dial attempt has failed.
func (c *tcpConn) giveUp(err error) {
	p := c.l.sp.p
	p.stats.TCPDialGiveUps.Add(1)
	c.l.sp.dialGaveUp(err)
	klog.V(2).InfoS("Every dial attempt failed; resetting connection", "service", c.l.sp.name, "client", c.client, "tried", len(c.race.tried), "err", err)
	c.abort()
}

// dialTimedOut handles the end of the current attempt's time. While
// attempts remain, the next one starts, to the next endpoint in turn
// past those tried, and the current one goes on connecting meanwhile
// ("happy eyeballs" across endpoints, RFC 8305): an endpoint more than
// the first timeout away, or whose first SYN was lost (the kernel sends
// it again after 1 s), is still reached by its first attempt, where a
// new socket would start over. The first attempt to connect wins (see
// raceWon). After the last attempt's time, the connection is given up.
func (c *tcpConn) dialTimedOut() {
	p := c.l.sp.p
	r := c.racing()
	if c.bfd >= 0 && c.attempt+1 < len(p.cfg.DialTimeouts) {
		klog.V(3).InfoS("Dial to endpoint timed out; it goes on connecting while the next attempt starts", "service", c.l.sp.name, "endpoint", c.endpoint, "client", c.client)
		r.add(c, c.bfd, c.endpoint)
		c.bfd = -1
		c.readable[1], c.hup[1] = false, false
		r.tried = append(r.tried, c.endpoint)
		c.attempt++
		ep, why, err := c.b.choose(c.client.Addr(), r.tried)
		if err != nil {
			c.keepRacing(unix.ETIMEDOUT)
			return
		}
		// A timeout leaves every endpoint worth dialing (worthDialing).
		if klog.V(4).Enabled() {
			c.l.sp.explainPick(c.b, c.l.role, c.client, ep, why, c.attempt+1)
		}
		c.dial(ep)
		return
	}
	err := r.lastErr
	if c.bfd >= 0 {
		c.closeBackend()
		c.attemptFailed(c.endpoint, unix.ETIMEDOUT)
		r.tried = append(r.tried, c.endpoint)
		err = unix.ETIMEDOUT
	}
	for i := range r.racers {
		if a := &r.racers[i]; a.fd >= 0 {
			c.attemptFailed(a.endpoint, unix.ETIMEDOUT)
			c.lp.closeFD(a.fd)
			a.fd = -1
		}
	}
	c.giveUp(err)
}

// racing returns the connection's dialRace, made on the first attempt
// that fails or times out: the one allocation failover adds.
func (c *tcpConn) racing() *dialRace {
	if c.race == nil {
		c.race = &dialRace{}
		c.race.tried = c.race.triedBuf[:0]
		for i := range c.race.racers {
			c.race.racers[i] = racer{c: c, fd: -1}
		}
	}
	return c.race
}

// dialRace is what a connection's dial needs once an attempt failed or
// timed out: the endpoints tried, and the attempts that timed out and go
// on connecting. One allocation, for the default four attempts.
type dialRace struct {
	tried    []netip.AddrPort // the endpoints of the attempts before the current one
	triedBuf [maxRacers + 1]netip.AddrPort
	racers   [maxRacers]racer // fd -1: a free slot
	lastErr  error            // why the last attempt failed, while the earlier ones go on
}

// maxRacers is how many attempts that timed out go on connecting at once:
// all of them with DefaultDialTimeouts. With more attempts configured,
// the oldest gives way to the next (see add).
const maxRacers = 3

// racer is an attempt that timed out and goes on connecting: the epoll
// handler of its socket.
type racer struct {
	c        *tcpConn
	fd       int
	attempt  int
	endpoint netip.AddrPort
}

// add takes over the socket of c's current attempt, which timed out.
func (r *dialRace) add(c *tcpConn, fd int, ep netip.AddrPort) {
	slot := &r.racers[0]
	for i := range r.racers {
		if a := &r.racers[i]; a.fd < 0 {
			slot = a
			break
		} else if a.attempt < slot.attempt {
			slot = a
		}
	}
	if slot.fd >= 0 {
		c.attemptFailed(slot.endpoint, unix.ETIMEDOUT)
		c.lp.closeFD(slot.fd)
	}
	slot.fd, slot.attempt, slot.endpoint = fd, c.attempt, ep
	c.lp.handlers[int32(fd)] = slot // epoll knows the socket already
}

// pending reports whether an attempt that timed out still connects.
func (r *dialRace) pending() bool {
	for i := range r.racers {
		if r.racers[i].fd >= 0 {
			return true
		}
	}
	return false
}

func (a *racer) event(ev uint32) {
	c := a.c
	if c.closed || a.fd < 0 {
		return
	}
	if ev&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
		soErr, err := rawGetsockoptInt(a.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err == nil && soErr != 0 {
			err = unix.Errno(soErr)
		}
		if err != nil {
			c.racerFailed(a, err)
			return
		}
	}
	if ev&unix.EPOLLOUT != 0 {
		c.raceWon(a, ev) // writable without an error: the handshake is done
	}
}

func (a *racer) shut() { a.c.abort() }

// racerFailed drops an attempt that timed out and then failed outright
// (refused, unreachable). The current attempt goes on; with none (no
// attempt was left to make), and no other that timed out, the connection
// is given up.
func (c *tcpConn) racerFailed(a *racer, err error) {
	c.lp.closeFD(a.fd)
	a.fd = -1
	c.attemptFailed(a.endpoint, err)
	if c.bfd < 0 && !c.race.pending() {
		c.giveUp(err)
	}
}

// raceWon makes attempt a, which timed out and then connected, the
// connection's: the current attempt's socket is closed (it never carried
// data), and so are the other racers' (see endRace). A client with
// ClientIP affinity, which the later attempts moved, goes to a's
// endpoint from now on.
func (c *tcpConn) raceWon(a *racer, ev uint32) {
	chosen := c.endpoint
	c.closeBackend()
	c.bfd, c.endpoint = a.fd, a.endpoint
	a.fd = -1
	c.lp.handlers[int32(c.bfd)] = &c.backendSide
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP) != 0 {
		c.readable[1] = true
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP) != 0 {
		c.hup[1] = true
	}
	if c.endpoint != chosen {
		c.b.remember(c.client.Addr(), c.endpoint)
	}
	c.connected()
}

// endRace closes the attempts still racing the one that connected. Those
// to other endpoints timed out: they count as failed, and their endpoints
// are passed over for a while. One to the endpoint that connected only
// lost the race.
func (c *tcpConn) endRace() {
	for i := range c.race.racers {
		if a := &c.race.racers[i]; a.fd >= 0 {
			c.lp.closeFD(a.fd)
			a.fd = -1
			if a.endpoint != c.endpoint {
				c.attemptFailed(a.endpoint, unix.ETIMEDOUT)
			}
		}
	}
	c.race = nil
}

// closeBackend drops a failed attempt's socket, and what its events said,
// so the next attempt's socket starts with nothing read from it.
func (c *tcpConn) closeBackend() {
	if c.bfd >= 0 {
		c.lp.closeFD(c.bfd)
		c.bfd = -1
	}
	c.readable[1], c.hup[1] = false, false
}

func (c *tcpConn) connected() {
	c.dialing = false
	c.lp.unschedule(&c.timer)
	if c.race != nil {
		c.endRace()
	}
	c.active = true
	c.l.sp.connOpened(&c.l.sp.p.stats.TCPActive)
	if klog.V(4).Enabled() {
		c.since = time.Now()
		klog.InfoS("Proxying connection", "service", c.l.sp.name, "client", c.client, "endpoint", c.endpoint)
	}
	c.pump()
}

// pump moves whatever can move in both directions without blocking.
func (c *tcpConn) pump() {
	if !c.failing {
		for i := range c.dirs {
			if !c.pumpDir(i) {
				break // aborted, or a side failed
			}
		}
	}
	switch {
	case c.closed:
	case c.failing:
		c.drain()
	case c.dirs[0].shut && c.dirs[1].shut:
		c.finish()
	}
}

// fail handles the failure of side x (0: the client, 1: the endpoint),
// most often a reset, found by reading from it or writing to it. A
// direct connection or kernel NAT would still deliver what x sent before
// it failed (Linux keeps data that arrived before a reset readable, and
// a write that finds the reset does not read it, e.g. an HTTP server's
// "413" sent before it closed with an upload unread), so direction x goes
// on until it reads x's EOF or error, as far as the other side takes it;
// what was on its way to x is dropped. The other side is reset only when
// it has acknowledged all it was sent, since closing with SO_LINGER 0
// discards the socket's send queue, or after resetDrain (see drain).
// A failure of the other side meanwhile aborts at once.
func (c *tcpConn) fail(x int, why string) {
	if c.why == "" {
		c.why = why
	}
	if c.closed {
		return
	}
	if c.failing {
		c.abort() // both have failed: nobody is left to deliver to
		return
	}
	c.failing, c.failedSide = true, x
	c.halfClosed = false
	d := &c.dirs[1-x] // what was on its way to x
	if d.p != nil {
		if d.pending > 0 {
			d.p.close() // data left in it; never reuse
		} else {
			putPipe(d.p)
		}
		d.p, d.pending = nil, 0
	}
	d.buf, d.eof, d.shut = nil, true, true
	// Read x until it says EOF or fails again, whatever events came.
	c.readable[x], c.hup[x] = true, true
	c.deadline = time.Now().Add(resetDrain)
	c.lp.schedule(&c.timer, c.deadline)
}

// drain moves what the failed side sent to the other side, and resets
// the connection once the other side has acknowledged all of it.
func (c *tcpConn) drain() {
	c.pumpDir(c.failedSide)
	switch {
	case c.closed:
	case c.delivered():
		c.abort()
	case c.dirs[c.failedSide].shut:
		// All written, not all acknowledged: look again soon.
		if next := time.Now().Add(drainPoll); next.Before(c.deadline) {
			c.lp.schedule(&c.timer, next)
		}
	}
}

// delivered reports whether the failed side's EOF has been reached and
// everything before it written to the other side and acknowledged by it.
func (c *tcpConn) delivered() bool {
	if !c.dirs[c.failedSide].shut {
		return false
	}
	unacked, err := unix.IoctlGetInt(c.socket(1-c.failedSide), unix.SIOCOUTQ)
	return err != nil || unacked == 0
}

// pumpDir moves data from one socket to the other until either would
// block. It reports false if it aborted the connection or found a side
// failed (c.failing). With the source failed, it reads on to its EOF,
// taking an error or EAGAIN for the EOF, and passes no FIN on.
func (c *tcpConn) pumpDir(i int) bool {
	p := c.l.sp.p
	src, dst := c.cfd, c.bfd
	from, to := "client", "endpoint"
	counter := &p.stats.BytesToBackend
	if i == 1 {
		src, dst = c.bfd, c.cfd
		from, to = to, from
		counter = &p.stats.BytesToClient
	}
	if i == 0 && c.header != nil && !c.sendHeader() {
		return !c.closed && !c.failing // the client's bytes wait for the header
	}
	failed := c.failing // and the source is the side that failed
	d := &c.dirs[i]
	progress := func(n int) {
		counter.Add(uint64(n))
		c.moved[i] += uint64(n)
		if c.halfClosed {
			c.lastProgress = time.Now()
		}
	}
	for {
		if len(d.buf) > 0 {
			n, err := rawWrite(dst, d.buf)
			switch err {
			case nil:
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return true // dst is full: EPOLLOUT will bring us back
			default:
				c.fail(1-i, sideFailed(to, false, err))
				return false
			}
			d.buf = d.buf[n:]
			progress(n)
			continue
		}
		d.buf = nil
		if d.pending > 0 {
			n, err := rawSplice(d.p.r, dst, d.pending, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch err {
			case nil:
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return true // dst is full: EPOLLOUT will bring us back
			default:
				c.fail(1-i, sideFailed(to, false, err))
				return false
			}
			d.pending -= int(n)
			progress(int(n))
			continue
		}
		if d.p != nil {
			putPipe(d.p)
			d.p = nil
		}
		if d.eof {
			if !d.shut {
				d.shut = true
				if !c.dirs[1-i].shut {
					// Pass the FIN on and bound the other direction. When
					// both sides are done, finish closes both sockets
					// instead, which sends the FIN without a shutdown.
					if err := rawShutdown(dst, unix.SHUT_WR); err != nil {
						c.fail(1-i, sideFailed(to, false, err))
						return false
					}
					c.halfClosed = true
					c.lastProgress = time.Now()
					c.lp.schedule(&c.timer, c.lastProgress.Add(p.cfg.TCPHalfCloseTimeout))
				}
			}
			return true
		}
		if !c.readable[i] {
			return true // drained: the next EPOLLIN brings us back
		}
		if !d.bulk {
			scratch := c.lp.tcpBuf
			n, err := rawRead(src, scratch)
			switch {
			case err == unix.EINTR:
				continue
			case failed && err != nil:
				d.eof = true // all it sent has been read
				continue
			case err == unix.EAGAIN:
				c.readable[i] = false
				return true
			case err != nil:
				d.eof = true
				c.fail(i, sideFailed(from, true, err)) // e.g. a reset: pass it on as a reset, after what it sent
				return false
			case n == 0:
				d.eof = true
				continue
			}
			d.bulk = n == len(scratch) && !c.lp.pipesShort()
			if n < len(scratch) && !c.hup[i] {
				c.readable[i] = false
			}
			m, err := rawWrite(dst, scratch[:n])
			switch err {
			case nil:
			case unix.EAGAIN, unix.EINTR:
				m = 0
			default:
				c.fail(1-i, sideFailed(to, false, err))
				return false
			}
			progress(m)
			if m < n {
				d.buf = append([]byte(nil), scratch[m:n]...)
			}
			continue
		}
		var err error
		if d.p, err = getPipe(&p.fds); err != nil {
			// Out of descriptors for a pipe: copy through the scratch
			// buffer instead, as for small reads. A connection already
			// being served must not be cut for want of a pipe; pipes are
			// tried again after a pause.
			c.lp.noPipesUntil = time.Now().Add(pipeRetry)
			logPipes(err, c.l.sp.name.String())
			d.bulk = false
			continue
		}
		n, err := rawSplice(src, d.p.w, spliceChunk, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		switch {
		case err == unix.EINTR:
			continue
		case failed && err != nil:
			putPipe(d.p)
			d.p = nil
			d.eof = true // all it sent has been read
		case err == unix.EAGAIN:
			putPipe(d.p) // nothing to read: hold no pipe while idle
			d.p = nil
			c.readable[i] = false
			return true
		case err != nil:
			putPipe(d.p)
			d.p = nil
			d.eof = true
			c.fail(i, sideFailed(from, true, err)) // e.g. a reset: pass it on as a reset, after what it sent
			return false
		case n == 0:
			d.eof = true
		default:
			d.pending = int(n)
			// A short splice may only mean the pipe is full, so it says
			// nothing about the socket: read on until EAGAIN.
			d.bulk = n >= smallRead // small again: back to read and write
		}
	}
}

// expired handles the connection's timer: a dial that took too long, a
// connection one side of which failed that has delivered what that side
// sent or may wait no longer, or a half-closed connection that stayed
// silent too long: nothing moved and nothing waited to be sent.
func (c *tcpConn) expired(now time.Time) time.Time {
	p := c.l.sp.p
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
	case c.failing:
		if !now.Before(c.deadline) || c.delivered() {
			c.abort()
			return time.Time{}
		}
		if next := now.Add(drainPoll); c.dirs[c.failedSide].shut && next.Before(c.deadline) {
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
