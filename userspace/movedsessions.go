package userspace

// The endpoints of the UDP sessions whose proxy port moved. An edit that
// moves a service port's redirected traffic to another proxy port (a
// renamed port, whose service port is replaced; a traffic policy that
// gives external traffic a proxy port of its own, or takes it away)
// changes the portal's rules, and its sync deletes the UDP conntrack
// entries of the old mapping: a client's next datagram reaches the new
// proxy port, and opens a session there. kube-proxy keeps such a flow on
// its pod, as its conntrack entry survives the edit. So the proxier
// remembers, for a little longer than the session would have idled, the
// endpoint each session on the old proxy port had, and a new session of
// the same client to the same Service on another proxy port goes on to
// it while that socket's balancer may use it (its traffic policies,
// readiness and hints decide as for any session); else it is balanced as
// usual.

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// movedGrace is how long past a moved session's own idle timeout its
// endpoint is remembered: the client's next datagram may come a little
// after the portal's sync.
const movedGrace = 5 * time.Second

// maxMoved bounds the moved sessions remembered; beyond it, the sessions
// of further moves are balanced afresh.
const maxMoved = 1 << 16

// liveSession is a live UDP session, as its socket lists it (see
// sessionLister).
type liveSession struct {
	client, endpoint netip.AddrPort
	left             time.Duration // until it idles out
}

// sessionLister is a UDP socket that lists its live sessions.
type sessionLister interface {
	liveSessions() []liveSession
}

type movedKey struct {
	svc    state.ServiceName
	proto  state.Protocol
	client netip.AddrPort
}

type movedEntry struct {
	endpoint netip.AddrPort
	from     uint16    // the proxy port the session was on
	until    time.Time // forgotten then
}

// movedSessions maps a Service's clients to the endpoints their sessions
// had on a proxy port the Service moved from. A renamed port is another
// service port of the same Service, so the key is the Service and
// protocol, not the service port. It has a lock of its own: new sessions
// read it, and they never take the Proxier's.
type movedSessions struct {
	n  atomic.Int64 // len(m): new sessions pass by while it is empty
	mu sync.Mutex   // guards m
	m  map[movedKey]movedEntry
}

// rememberSessions remembers the endpoints of the live sessions of s, a
// UDP socket of sp on proxy port from, whose traffic the portal moves to
// another proxy port at its next sync. Called with p.mu held.
func (p *Proxier) rememberSessions(sp *servicePort, s socket, from uint16) {
	l, ok := s.(sessionLister)
	if !ok || p.closed || !p.cfg.HoldReleasedPorts {
		return
	}
	if n := p.moved.remember(sp.name, l.liveSessions(), from, p.cfg.Clock.Now()); n > 0 {
		klog.V(2).InfoS("Too many moved UDP sessions to remember; the next datagrams of their clients are balanced afresh",
			"service", sp.name, "sessions", n, "max", maxMoved)
	}
}

// remember remembers the endpoints of sessions of service port name,
// which were on proxy port from, each until movedGrace past its idle
// timeout from now. It returns how many it could not remember, beyond
// maxMoved.
func (m *movedSessions) remember(name state.ServicePortName, sessions []liveSession, from uint16, now time.Time) int {
	if len(sessions) == 0 {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = make(map[movedKey]movedEntry)
	}
	if len(m.m)+len(sessions) > maxMoved {
		m.sweepLocked(now)
	}
	dropped := 0
	for _, s := range sessions {
		k := movedKey{name.Service(), name.Protocol, s.client}
		if _, ok := m.m[k]; !ok && len(m.m) >= maxMoved {
			dropped++
			continue
		}
		m.m[k] = movedEntry{endpoint: s.endpoint, from: from, until: now.Add(s.left + movedGrace)}
	}
	m.n.Store(int64(len(m.m)))
	return dropped
}

// endpoint returns the endpoint client's session to service port name
// had on a proxy port the Service moved from, if it is remembered at now
// and was not on port, the one the client reaches now.
func (m *movedSessions) endpoint(name state.ServicePortName, client netip.AddrPort, port uint16, now time.Time) (netip.AddrPort, bool) {
	if m.n.Load() == 0 {
		return netip.AddrPort{}, false
	}
	k := movedKey{name.Service(), name.Protocol, client}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[k]
	switch {
	case !ok || e.from == port:
		return netip.AddrPort{}, false
	case !now.Before(e.until):
		delete(m.m, k)
		m.n.Store(int64(len(m.m)))
		return netip.AddrPort{}, false
	}
	return e.endpoint, true
}

// sweep forgets the sessions expired at now.
func (m *movedSessions) sweep(now time.Time) {
	if m.n.Load() == 0 {
		return
	}
	m.mu.Lock()
	m.sweepLocked(now)
	m.mu.Unlock()
}

// sweepLocked is sweep with m.mu held.
func (m *movedSessions) sweepLocked(now time.Time) {
	for k, e := range m.m {
		if !now.Before(e.until) {
			delete(m.m, k)
		}
	}
	m.n.Store(int64(len(m.m)))
}

// forget forgets every session.
func (m *movedSessions) forget() {
	m.mu.Lock()
	clear(m.m)
	m.n.Store(0)
	m.mu.Unlock()
}

// len is the number of sessions remembered.
func (m *movedSessions) len() int { return int(m.n.Load()) }

// chooseUDP picks the endpoint of a new session from client on a socket
// on port, from b: the endpoint the client's session had on a proxy port
// the service port moved from, while b may use it, or else b's choice.
func (sp *servicePort) chooseUDP(b *balancer, port uint16, client netip.AddrPort) (netip.AddrPort, pickWhy, error) {
	p := sp.p
	if ep, ok := p.moved.endpoint(sp.name, client, port, p.cfg.Clock.Now()); ok && b.mayKeep(client.Addr(), ep) {
		b.remember(client.Addr(), ep)
		return ep, pickedMoved, nil
	}
	return b.choose(client.Addr(), nil)
}
