//go:build unix && (!linux || goroutines)

package userspace

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

var datagramPool = sync.Pool{New: func() any { b := make([]byte, maxDatagram); return &b }}

// udpListener serves one UDP socket of a service port. One goroutine reads
// the socket in batches and forwards each datagram on its client's session;
// each session has a connected socket to its endpoint and a goroutine that
// sends the endpoint's replies back from the address the client sent to.
type udpListener struct {
	sp   *servicePort
	role socketRole
	addr netip.Addr // the address listened on
	fam  family
	conn *net.UDPConn
	rc   syscall.RawConn
	done chan struct{} // closed when the reader has returned
	once sync.Once

	sessWG sync.WaitGroup // session goroutines

	mu       sync.Mutex // guards the fields below
	sessions map[sessionKey]*udpSession
	closing  bool
}

func listenUDP(sp *servicePort, k sockKey) (socket, error) {
	fam := familyOf(k.addr.Addr())
	network := "udp4"
	if fam == familyIPv6 {
		network = "udp6"
	}
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(k.addr))
	if err != nil {
		return nil, err
	}
	l := &udpListener{sp: sp, role: k.role, addr: k.addr.Addr(), fam: fam, conn: conn, done: make(chan struct{}),
		sessions: make(map[sessionKey]*udpSession)}
	if l.rc, err = conn.SyscallConn(); err != nil {
		conn.Close()
		return nil, err
	}
	if err := sp.p.keepListenerConn(conn, func() { conn.Close() }); err != nil {
		return nil, err
	}
	_ = l.rc.Control(func(fd uintptr) { growRcvBuf(int(fd)) })
	// On the wildcard address, ask for each datagram's destination, so
	// replies can leave from it: after a REDIRECT of locally generated
	// traffic that is 127.0.0.1, and conntrack can only undo the NAT for a
	// reply from there. A socket bound to one address replies from it.
	if k.addr.Addr().IsUnspecified() {
		if fam == familyIPv6 {
			err = ipv6.NewPacketConn(conn).SetControlMessage(ipv6.FlagDst, true)
		} else {
			err = ipv4.NewPacketConn(conn).SetControlMessage(ipv4.FlagDst, true)
		}
	}
	if err != nil {
		conn.Close()
		sp.p.fds.listenerClosed()
		return nil, err
	}
	sp.p.wg.Add(1)
	go l.readLoop()
	return l, nil
}

func (l *udpListener) port() uint16 {
	return uint16(l.conn.LocalAddr().(*net.UDPAddr).Port)
}

// close stops the reader, ends every session and waits for them.
func (l *udpListener) close() {
	l.once.Do(func() { l.conn.Close(); l.sp.p.fds.listenerClosed() })
	<-l.done
	l.mu.Lock()
	l.closing = true
	for _, s := range l.sessions {
		s.tally.endBecause(&endedShutDown)
		s.conn.Close()
	}
	l.mu.Unlock()
	l.sessWG.Wait()
}

// liveSessions lists the listener's sessions.
func (l *udpListener) liveSessions() []liveSession {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var out []liveSession
	for _, s := range l.sessions {
		if left := s.expiry().Sub(now); left > 0 {
			out = append(out, liveSession{s.client, s.endpoint, left}) // l.mu guards endpoint
		}
	}
	return out
}

// dropStale ends the sessions whose endpoint is not serving (removed, or
// no longer serving). They leave the table at once, not when their reply
// goroutine gets round to it: the client's next datagram must open a
// session to a live endpoint, not go to the closed one and be lost.
func (l *udpListener) dropStale(serving func(netip.AddrPort) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for client, s := range l.sessions {
		if !serving(s.endpoint) { // l.mu guards it
			delete(l.sessions, client)
			s.tally.endBecause(&endedStale)
			s.conn.Close()
			n++
		}
	}
	return n
}

// forget takes s out of the session table if it is still there; the next
// datagram from its client opens a new session.
func (l *udpListener) forget(s *udpSession) {
	l.mu.Lock()
	if k := (sessionKey{s.client, s.dst}); l.sessions[k] == s {
		delete(l.sessions, k)
	}
	l.mu.Unlock()
}

func (l *udpListener) readLoop() {
	p := l.sp.p
	defer p.wg.Done()
	defer close(l.done)
	b := newRecvBatch()
	for {
		n, err := readBatch(l.rc, b)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			klog.V(2).InfoS("UDP read failed", "service", l.sp.name, "err", err)
			select {
			case <-time.After(10 * time.Millisecond):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		for i := range b.dgrams[:n] {
			d := &b.dgrams[i]
			if s := l.session(d.from, d.to); s != nil {
				s.send(d.buf[:d.n])
			}
		}
		b.release()
	}
}

// session returns client's session, creating it if needed; nil means the
// datagram is to be dropped. Only the reader creates sessions.
func (l *udpListener) session(client netip.AddrPort, dst netip.Addr) *udpSession {
	p := l.sp.p
	l.mu.Lock()
	s := l.sessions[sessionKey{client, dst}]
	l.mu.Unlock()
	if s != nil {
		return s
	}
	if l.sp.nodePortRefuses(l.role, dst, client) {
		return nil
	}
	b, ep, ok := l.sp.admitUDP(l.role, l.addr, l.port(), client)
	if !ok {
		return nil
	}
	conn, err := net.DialUDP(udpNetwork(ep), nil, net.UDPAddrFromAddrPort(ep))
	if err == nil {
		err = p.keepConn(conn, func() { conn.Close() })
	}
	if err != nil {
		l.sp.udpDialFailed(ep, err)
		return nil
	}
	s = &udpSession{l: l, b: b, client: client, endpoint: ep, conn: conn, clientSA: sockaddr(l.fam, client),
		dst: dst, oob: pktinfoOOB(l.fam, dst)}
	if s.rc, err = conn.SyscallConn(); err != nil {
		conn.Close()
		l.sp.releaseUDP()
		return nil
	}
	_ = s.rc.Control(func(fd uintptr) { growRcvBuf(int(fd)) }) // see frontendRcvBuf
	s.lastActive.Store(time.Now().UnixNano())
	s.tally.start()
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		conn.Close()
		l.sp.releaseUDP()
		return nil
	}
	l.sessions[sessionKey{client, dst}] = s
	l.mu.Unlock()
	p.stats.UDPSessionsOpened.Add(1)
	l.sp.udpOpened.Add(1)
	p.stats.UDPSessionsActive.Add(1)
	if klog.V(4).Enabled() {
		klog.InfoS("New UDP session", "service", l.sp.name, "client", client, "endpoint", ep)
	}
	l.sessWG.Add(1)
	go s.replyLoop()
	return s
}

func udpNetwork(ep netip.AddrPort) string {
	if ep.Addr().Is4() {
		return "udp4"
	}
	return "udp6"
}

// udpSession is one client's flow to one endpoint.
type udpSession struct {
	l        *udpListener
	b        *balancer
	client   netip.AddrPort
	clientSA unix.Sockaddr  // client, in the listener's family
	endpoint netip.AddrPort // written under l.mu and pmu, after a refusal
	conn     *net.UDPConn   // connected to endpoint
	rc       syscall.RawConn

	// settled is pending.settled, read without pmu on every datagram.
	settled atomic.Bool
	pmu     sync.Mutex // guards pending, and endpoint's writes
	pending udpPending // what a refusal before the first reply sends elsewhere

	lastActive atomic.Int64 // unix nanoseconds of the last datagram either way
	unanswered atomic.Int32 // client datagrams without a reply yet (each reply answers one)
	refused    atomic.Bool
	tally      udpTally

	dst netip.Addr // where the client's datagrams arrive (part of its key)
	oob []byte     // control message that sends replies from dst
}

// send forwards one client datagram to the endpoint without blocking: a
// full socket buffer drops the datagram, as the network would.
func (s *udpSession) send(b []byte) {
	p := s.l.sp.p
	s.lastActive.Store(time.Now().UnixNano())
	if s.unanswered.Load() < maxUnanswered {
		s.unanswered.Add(1)
	}
	kept := -1
	if !s.settled.Load() {
		s.pmu.Lock()
		kept = s.pending.keep(b)
		s.settled.Store(s.pending.settled)
		s.pmu.Unlock()
	}
	var werr error
	err := s.rc.Write(func(fd uintptr) bool {
		_, werr = unix.Write(int(fd), b)
		return true
	})
	switch {
	case err != nil:
		// The session is closing.
	case werr == nil:
		p.stats.UDPDatagramsIn.Add(1)
		p.stats.UDPBytesIn.Add(uint64(len(b)))
		first := true
		if kept >= 0 {
			// A refusal may have resent it already.
			s.pmu.Lock()
			first = s.pending.forward(kept)
			s.pmu.Unlock()
		}
		if first {
			s.tally.add(toEndpoint, len(b))
		}
	case werr == unix.ECONNREFUSED:
		s.refuse()
	default:
		p.stats.UDPDropped.Add(1)
	}
}

// refuse moves a session whose endpoint answered with ICMP port
// unreachable to another endpoint, before any reply (see udpFailover), and
// reports true; or else ends it. The reader and the session's goroutine
// may both call it.
func (s *udpSession) refuse() bool {
	if s.refused.Load() {
		return false
	}
	s.pmu.Lock()
	moved := false
	for !moved {
		ep, ok := s.l.sp.udpFailover(s.b, s.l.role, s.client, s.endpoint, &s.pending)
		if !ok {
			break
		}
		var cerr error
		if err := s.rc.Control(func(fd uintptr) {
			if cerr = unix.Connect(int(fd), sockaddr(familyOf(ep.Addr()), ep)); cerr == nil {
				clearSocketError(int(fd))
			}
		}); err != nil || cerr != nil {
			break
		}
		s.l.mu.Lock()
		s.endpoint = ep
		s.l.mu.Unlock()
		// When the new endpoint's refusal of the first comes back on a
		// write of the next, move again.
		moved = s.resend()
	}
	s.pmu.Unlock()
	if moved {
		return true
	}
	if !s.refused.Swap(true) {
		s.tally.endBecause(&endedRefused)
		s.l.forget(s)
		s.conn.Close()
	}
	return false
}

// resend sends the datagrams the session holds (pmu held) to its new
// endpoint, and reports false when a write says the endpoint refused one
// already. A later refusal comes back as an error on a later read or
// write, which moves the session again.
func (s *udpSession) resend() bool {
	p := s.l.sp.p
	refused := false
	_ = s.rc.Write(func(fd uintptr) bool {
		for i, b := range s.pending.bufs {
			switch _, err := unix.Write(int(fd), b); err {
			case nil:
				// Counted again here (see udpPending.forward), but not
				// in the session's tally if it was sent before.
				p.stats.UDPDatagramsIn.Add(1)
				p.stats.UDPBytesIn.Add(uint64(len(b)))
				if s.pending.forward(i) {
					s.tally.add(toEndpoint, len(b))
				}
			case unix.ECONNREFUSED:
				refused = true
				return true
			default:
				p.stats.UDPDropped.Add(1)
			}
		}
		return true
	})
	return !refused
}

// expiry is when the session ends if nothing more happens: the idle timeout
// after the last datagram, or the longer reply timeout while client
// datagrams are unanswered.
func (s *udpSession) expiry() time.Time {
	cfg := &s.l.sp.p.cfg
	timeout := cfg.UDPIdleTimeout
	if s.unanswered.Load() > 0 && cfg.UDPReplyTimeout > timeout {
		timeout = cfg.UDPReplyTimeout
	}
	return time.Unix(0, s.lastActive.Load()).Add(timeout)
}

func (s *udpSession) replyLoop() {
	l := s.l
	p := l.sp.p
	defer l.sessWG.Done()
	defer s.finish()
	// The read deadline is moved lazily: traffic only pushes the expiry
	// later, so a deadline that fires early is simply re-armed, and the
	// deadline is moved earlier only when it is more than one idle timeout
	// too late. A busy session thus costs no timer update per datagram.
	slack := p.cfg.UDPIdleTimeout
	var armed time.Time
	for {
		now := time.Now()
		expiry := s.expiry()
		if !now.Before(expiry) {
			return
		}
		if !armed.After(now) || armed.Sub(expiry) > slack {
			_ = s.conn.SetReadDeadline(expiry)
			armed = expiry
		}
		var bp *[]byte
		var n int
		var rerr error
		err := s.rc.Read(func(fd uintptr) bool {
			if bp == nil {
				bp = datagramPool.Get().(*[]byte)
			}
			n, rerr = unix.Read(int(fd), *bp)
			if rerr == unix.EAGAIN || rerr == unix.EINTR {
				datagramPool.Put(bp)
				bp = nil
				return false
			}
			return true
		})
		if err != nil {
			if bp != nil {
				datagramPool.Put(bp)
			}
			if isTimeout(err) {
				continue // re-check expiry: traffic may have moved it
			}
			return
		}
		if rerr != nil {
			datagramPool.Put(bp)
			if rerr == unix.ECONNREFUSED {
				if s.refuse() {
					continue // moved to another endpoint
				}
			} else {
				s.tally.endBecause(&endedReadErr)
			}
			return
		}
		s.lastActive.Store(time.Now().UnixNano())
		if !s.settled.Load() {
			s.pmu.Lock()
			s.pending.settle()
			s.settled.Store(true)
			s.pmu.Unlock()
		}
		s.answered()
		if err := l.sendTo((*bp)[:n], s.oob, s.clientSA); err != nil {
			p.stats.UDPDropped.Add(1)
		} else {
			p.stats.UDPDatagramsOut.Add(1)
			p.stats.UDPBytesOut.Add(uint64(n))
			s.tally.add(toClient, n)
		}
		datagramPool.Put(bp)
	}
}

// answered counts one reply against the unanswered client datagrams: a
// client with several questions out (a resolver's A and AAAA) keeps the
// reply timeout until each has had one.
func (s *udpSession) answered() {
	for {
		n := s.unanswered.Load()
		if n == 0 || s.unanswered.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// sendTo sends one datagram from the listening socket, with oob selecting
// the source address. It waits while the socket buffer is full.
func (l *udpListener) sendTo(b, oob []byte, to unix.Sockaddr) error {
	var serr error
	err := l.rc.Write(func(fd uintptr) bool {
		for {
			serr = unix.Sendmsg(int(fd), b, oob, to, 0)
			if serr != unix.EINTR {
				break
			}
		}
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (s *udpSession) finish() {
	l := s.l
	s.conn.Close()
	l.forget(s)
	l.sp.releaseUDP()
	l.sp.p.stats.UDPSessionsActive.Add(-1)
	l.mu.Lock()
	ep := s.endpoint
	l.mu.Unlock()
	s.tally.logEnd(l.sp.name, s.client, ep)
}
