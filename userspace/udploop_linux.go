//go:build linux && !goroutines

package userspace

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// On Linux UDP sockets are served by the event loops (eventloop_linux.go):
// the loop reads a listener's datagrams in batches, forwards each on its
// client's session, and sends the endpoint's replies back itself.

// udpListener is one listening UDP socket of a service port, read by one
// loop.
type udpListener struct {
	lp       *eventLoop
	sp       *servicePort
	role     socketRole
	addr     netip.Addr // the address listened on
	port     uint16     // and the port
	fam      family
	fd       int
	sessions map[sessionKey]*udpSession // owned by the loop
}

// udpGroup serves one UDP service address: one socket per event loop, all
// bound to the address with SO_REUSEPORT. The kernel hands each datagram
// to one of them by a hash of its source and destination, so a client's
// datagrams, and so its session, stay on one socket and one loop, while
// different clients are read by all the loops at once. (One socket read
// by one loop put all of a service's datagrams through that loop, and the
// other CPUs sat idle.) With a single loop the group is one plain socket.
type udpGroup struct {
	members []*udpListener
	port_   uint16
	sources []netip.Prefix // the sources its sockets' filter admits; nil: no filter (see filterSources)
}

func listenUDP(sp *servicePort, k sockKey) (socket, error) {
	loops, err := sp.p.eventLoops()
	if err != nil {
		return nil, err
	}
	fam := familyOf(k.addr.Addr())
	addr := k.addr
	shared := len(loops) > 1
	if shared {
		// A socket with SO_REUSEPORT binds to a port that another
		// SO_REUSEPORT socket of the same user holds, and shares its
		// traffic; a kernel-chosen port can even be such a port. A plain
		// socket first checks (or, for port 0, chooses) the port: it fails
		// with EADDRINUSE on a port in any use. Only a socket bound to the
		// port between its close and the group's binds could still join.
		fd, port, err := bindUDP(fam, addr, false)
		if err != nil {
			return nil, err
		}
		unix.Close(fd)
		addr = netip.AddrPortFrom(addr.Addr(), port)
	}
	g := &udpGroup{}
	for _, lp := range loops {
		l := &udpListener{lp: lp, sp: sp, role: k.role, addr: k.addr.Addr(), fam: fam,
			sessions: make(map[sessionKey]*udpSession)}
		if err := g.add(l, addr, shared); err != nil {
			g.close()
			return nil, err
		}
	}
	return g, nil
}

// add binds l's socket to addr and registers it with l's loop.
func (g *udpGroup) add(l *udpListener, addr netip.AddrPort, shared bool) error {
	fd, port, err := bindUDP(l.fam, addr, shared)
	if err != nil {
		return err
	}
	if err := l.sp.p.keepListener(fd, func() { unix.Close(fd) }); err != nil {
		return err
	}
	l.fd, l.port = fd, port // before the loop can see an event for it
	l.lp.do(func() { err = l.lp.register(fd, unix.EPOLLIN, l) })
	if err != nil {
		unix.Close(fd)
		l.sp.p.fds.listenerClosed()
		return err
	}
	g.members = append(g.members, l)
	g.port_ = port
	return nil
}

// bindUDP returns a non-blocking UDP socket bound to addr, with SO_REUSEPORT
// when shared, and the port it is bound to.
func bindUDP(fam family, addr netip.AddrPort, shared bool) (int, uint16, error) {
	fd, err := udpSocket(fam)
	if err != nil {
		return -1, 0, err
	}
	if shared {
		err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}
	if err == nil && fam == familyIPv6 {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
	}
	// A socket bound to the wildcard address asks for each datagram's
	// destination, so replies can leave from it: after a REDIRECT of
	// locally generated traffic that is 127.0.0.1, and conntrack can only
	// undo the NAT for a reply from there. A socket bound to one address
	// receives only what was sent to it, and replies leave from it anyway;
	// the control messages would cost a little on every datagram.
	if err == nil && addr.Addr().IsUnspecified() {
		if fam == familyIPv6 {
			err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
		} else {
			err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		}
	}
	if err == nil {
		growRcvBuf(fd)
		err = unix.Bind(fd, sockaddr(fam, addr))
	}
	var port uint16
	if err == nil {
		port, err = localPort(fd)
	}
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, port, nil
}

func udpSocket(f family) (int, error) {
	domain := unix.AF_INET
	if f == familyIPv6 {
		domain = unix.AF_INET6
	}
	fd, err := unix.Socket(domain, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	return fd, nil
}

func localPort(fd int) (uint16, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, fmt.Errorf("getsockname: %w", err)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return uint16(sa.Port), nil
	case *unix.SockaddrInet6:
		return uint16(sa.Port), nil
	}
	return 0, errors.New("getsockname: unexpected address family")
}

func (g *udpGroup) port() uint16 { return g.port_ }

// close stops the sockets and ends their sessions.
func (g *udpGroup) close() {
	for _, l := range g.members {
		l.lp.do(l.shut)
	}
}

// dropStale ends the sessions whose endpoint is not serving.
func (g *udpGroup) dropStale(serving func(netip.AddrPort) bool) int {
	n := 0
	for _, l := range g.members {
		n += l.dropStale(serving)
	}
	return n
}

// liveSessions lists the sessions of the group's sockets.
func (g *udpGroup) liveSessions() []liveSession {
	var out []liveSession
	for _, l := range g.members {
		l.lp.do(func() {
			now := time.Now()
			for _, s := range l.sessions {
				if left := s.expiry().Sub(now); left > 0 {
					out = append(out, liveSession{s.client, s.endpoint, left})
				}
			}
		})
	}
	return out
}

// shut runs on the loop goroutine.
func (l *udpListener) shut() {
	if l.fd < 0 {
		return
	}
	for _, s := range l.sessions {
		s.tally.endBecause(&endedShutDown)
		s.close()
	}
	l.lp.closeFD(l.fd)
	l.fd = -1
	l.sp.p.fds.listenerClosed()
}

func (l *udpListener) event(uint32) { l.readable() }

// dropStale ends the sessions whose endpoint is not serving.
func (l *udpListener) dropStale(serving func(netip.AddrPort) bool) int {
	n := 0
	l.lp.do(func() {
		for _, s := range l.sessions {
			if !serving(s.endpoint) {
				s.tally.endBecause(&endedStale)
				s.close()
				n++
			}
		}
	})
	return n
}

// readable forwards the queued datagrams, at most one batch per wake-up so
// that one busy socket cannot starve the others (epoll is level-triggered:
// the rest is read next time round).
func (l *udpListener) readable() {
	b := l.lp.batch
	n, err := recvmmsg(l.fd, b, true)
	if err != nil {
		if err != unix.EAGAIN {
			klog.V(2).InfoS("UDP read failed", "service", l.sp.name, "err", err)
		}
		return
	}
	for i := range b.dgrams[:n] {
		d := &b.dgrams[i]
		if s := l.session(d.from, d.to); s != nil {
			s.send(d.buf[:d.n])
		}
	}
}

// session returns client's session, creating it if needed; nil means the
// datagram is dropped.
func (l *udpListener) session(client netip.AddrPort, dst netip.Addr) *udpSession {
	if s := l.sessions[sessionKey{client, dst}]; s != nil {
		return s
	}
	p := l.sp.p
	if l.sp.nodePortRefuses(l.role, dst, client) {
		return nil
	}
	b, ep, ok := l.sp.admitUDP(l.role, l.addr, l.port, client)
	if !ok {
		return nil
	}
	fd, err := dialEndpointUDP(ep, p)
	if err != nil {
		l.sp.udpDialFailed(ep, err)
		return nil
	}
	s := &udpSession{l: l, b: b, client: client, endpoint: ep, fd: fd,
		clientSA: makeRawSockaddr(l.fam, client), dst: dst, oob: pktinfoOOB(l.fam, dst), lastActive: time.Now()}
	s.timer = timerEntry{index: -1, owner: s}
	s.tally.start()
	if err := l.lp.register(fd, unix.EPOLLIN, s); err != nil {
		unix.Close(fd)
		l.sp.releaseUDP()
		return nil
	}
	l.sessions[sessionKey{client, dst}] = s
	l.lp.schedule(&s.timer, s.expiry())
	p.stats.UDPSessionsOpened.Add(1)
	l.sp.udpOpened.Add(1)
	p.stats.UDPSessionsActive.Add(1)
	if klog.V(4).Enabled() {
		klog.InfoS("New UDP session", "service", l.sp.name, "client", client, "endpoint", ep)
	}
	return s
}

// dialEndpointUDP returns a non-blocking UDP socket connected to ep, under
// p's descriptor ceiling and not on the spare's number (tookSpare).
func dialEndpointUDP(ep netip.AddrPort, p *Proxier) (int, error) {
	f := familyOf(ep.Addr())
	fd, err := udpSocket(f)
	if err != nil {
		return -1, err
	}
	if err := p.keepFD(fd, func() { rawClose(fd) }); err != nil {
		return -1, err
	}
	growRcvBuf(fd) // see frontendRcvBuf
	if err := rawConnect(fd, f, ep); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect: %w", err)
	}
	return fd, nil
}

// udpSession is one client's flow to one endpoint. It is owned by the loop.
type udpSession struct {
	l        *udpListener
	b        *balancer
	client   netip.AddrPort
	clientSA rawSockaddr // the client, in the listener's family
	endpoint netip.AddrPort
	fd       int // connected to endpoint

	dst        netip.Addr // where the client's datagrams arrive (part of its key)
	oob        []byte     // control message that sends replies from dst
	lastActive time.Time  // the last datagram either way
	unanswered int        // client datagrams without a reply yet (each reply answers one)
	timer      timerEntry // its expiry, in the loop's heap
	tally      udpTally
	pending    udpPending // what a refusal before the first reply sends elsewhere
}

func (s *udpSession) event(uint32) { s.readable() }

// expired ends the session unless traffic has moved its expiry.
func (s *udpSession) expired(now time.Time) time.Time {
	if e := s.expiry(); e.After(now) {
		return e
	}
	s.close()
	return time.Time{}
}

// expiry is when the session ends if nothing more happens: the idle timeout
// after the last datagram, or the longer reply timeout while client
// datagrams are unanswered.
func (s *udpSession) expiry() time.Time {
	cfg := &s.l.sp.p.cfg
	timeout := cfg.UDPIdleTimeout
	if s.unanswered > 0 && cfg.UDPReplyTimeout > timeout {
		timeout = cfg.UDPReplyTimeout
	}
	return s.lastActive.Add(timeout)
}

// send forwards one client datagram to the endpoint without blocking: a
// full socket buffer drops it, as the network would.
func (s *udpSession) send(b []byte) {
	p := s.l.sp.p
	s.lastActive = time.Now()
	s.unanswered = min(s.unanswered+1, maxUnanswered)
	i := s.pending.keep(b)
	_, err := rawWrite(s.fd, b)
	switch err {
	case nil:
		p.stats.UDPDatagramsIn.Add(1)
		p.stats.UDPBytesIn.Add(uint64(len(b)))
		if s.pending.forward(i) {
			s.tally.add(toEndpoint, len(b))
		}
	case unix.ECONNREFUSED:
		s.refuse() // an earlier datagram's refusal: this one goes along if the session moves
	default:
		p.stats.UDPDropped.Add(1)
	}
}

// readable sends the endpoint's queued replies to the client, from the
// address the client sent to. They are read in batches (recvmmsg): a short
// batch means the socket is drained, so the usual single reply costs one
// read, not a read and another that says EAGAIN.
func (s *udpSession) readable() {
	p := s.l.sp.p
	batch := s.l.lp.batch
	for range 2 { // then let other sockets have a turn
		n, err := recvmmsg(s.fd, batch, false)
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			if err == unix.ECONNREFUSED {
				s.refuse()
			} else {
				s.tally.endBecause(&endedReadErr)
				s.close()
			}
			return
		}
		s.lastActive = time.Now()
		s.pending.settle()
		if s.unanswered > 0 {
			// Count a reply per datagram: a client with several questions
			// out (a resolver's A and AAAA) keeps the reply timeout until
			// each has had one.
			s.unanswered = max(0, s.unanswered-n)
			if s.unanswered == 0 {
				// The expiry moved earlier (idle instead of reply
				// timeout): keep the heap honest so the session does not
				// outstay.
				s.l.lp.schedule(&s.timer, s.expiry())
			}
		}
		for _, d := range batch.dgrams[:n] {
			if err := rawSendmsg(s.l.fd, d.buf[:d.n], s.oob, &s.clientSA); err != nil {
				p.stats.UDPDropped.Add(1)
			} else {
				p.stats.UDPDatagramsOut.Add(1)
				p.stats.UDPBytesOut.Add(uint64(d.n))
				s.tally.add(toClient, d.n)
			}
		}
		if n < udpBatch {
			return
		}
	}
}

// refuse moves a session whose endpoint answered with ICMP port
// unreachable to another endpoint, before any reply (see udpFailover), or
// else ends it.
func (s *udpSession) refuse() {
	for {
		ep, ok := s.l.sp.udpFailover(s.b, s.l.role, s.client, s.endpoint, &s.pending)
		if !ok || rawConnect(s.fd, familyOf(ep.Addr()), ep) != nil {
			break
		}
		clearSocketError(s.fd)
		s.endpoint = ep
		if s.resend() {
			return
		}
		// The new endpoint's refusal of the first came back on a write of
		// the next: move again.
	}
	s.tally.endBecause(&endedRefused)
	s.close()
}

// resend sends the datagrams the session holds to its new endpoint, and
// reports false when a write says the endpoint refused one already. A
// later refusal comes back as an error on a later read or write, which
// moves the session again.
func (s *udpSession) resend() bool {
	p := s.l.sp.p
	for i, b := range s.pending.bufs {
		switch _, err := rawWrite(s.fd, b); err {
		case nil:
			// Counted again here (see udpPending.forward), but not in
			// the session's tally if it was sent before.
			p.stats.UDPDatagramsIn.Add(1)
			p.stats.UDPBytesIn.Add(uint64(len(b)))
			if s.pending.forward(i) {
				s.tally.add(toEndpoint, len(b))
			}
		case unix.ECONNREFUSED:
			return false
		default:
			p.stats.UDPDropped.Add(1)
		}
	}
	return true
}

func (s *udpSession) close() {
	if s.fd < 0 {
		return
	}
	l := s.l
	l.lp.closeFD(s.fd)
	s.fd = -1
	l.lp.unschedule(&s.timer)
	if k := (sessionKey{s.client, s.dst}); l.sessions[k] == s {
		delete(l.sessions, k)
	}
	l.sp.releaseUDP()
	l.sp.p.stats.UDPSessionsActive.Add(-1)
	s.tally.logEnd(l.sp.name, s.client, s.endpoint)
}
