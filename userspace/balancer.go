package userspace

import (
	"errors"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// ErrNoEndpoints is returned when a service port has no endpoint to send a
// connection or session to.
var ErrNoEndpoints = errors.New("no endpoints")

// endpointSet is an immutable list of endpoint addresses, with a mutable
// penalty per endpoint: after a failed dial an endpoint is passed over
// until its penalty ends, while other endpoints remain.
type endpointSet struct {
	addrs []netip.AddrPort
	eps   []state.Endpoint // eps[i] is the endpoint of addrs[i]
	index map[netip.AddrPort]int
	// until[i] is the unix-nanosecond time the penalty of addrs[i] ends.
	until []atomic.Int64
	// penalized counts penalties ever set on this set, so picks skip the
	// check while there are none.
	penalized atomic.Int64
}

func newEndpointSet(eps []state.Endpoint) *endpointSet {
	s := &endpointSet{
		addrs: make([]netip.AddrPort, 0, len(eps)),
		eps:   make([]state.Endpoint, 0, len(eps)),
		index: make(map[netip.AddrPort]int, len(eps)),
	}
	for _, ep := range eps {
		if _, dup := s.index[ep.Addr]; dup {
			continue
		}
		s.index[ep.Addr] = len(s.addrs)
		s.addrs = append(s.addrs, ep.Addr)
		s.eps = append(s.eps, ep)
	}
	s.until = make([]atomic.Int64, len(s.addrs))
	return s
}

func (s *endpointSet) has(a netip.AddrPort) bool {
	_, ok := s.index[a]
	return ok
}

// inPenalty reports whether a is passed over at now because a dial to it
// failed recently.
func (s *endpointSet) inPenalty(a netip.AddrPort, now time.Time) bool {
	if s.penalized.Load() == 0 || len(s.addrs) < 2 {
		return false
	}
	return s.until[s.index[a]].Load() > now.UnixNano()
}

// usable reports whether addrs[i] may be picked at now.
func (s *endpointSet) usable(i int, now int64, avoid []netip.AddrPort) bool {
	if len(avoid) > 0 && slices.Contains(avoid, s.addrs[i]) {
		return false
	}
	return s.penalized.Load() == 0 || s.until[i].Load() <= now
}

// rotate picks, for round-robin turn, one of the endpoints usable at now
// (see usable), in rotation: each in turn takes one round of the turns
// of those passed over. It reports false when none is usable.
func (s *endpointSet) rotate(turn uint64, now int64, avoid []netip.AddrPort) (int, bool) {
	n := len(s.addrs)
	usable := 0
	for i := range n {
		if s.usable(i, now, avoid) {
			usable++
		}
	}
	if usable == 0 {
		return 0, false
	}
	k := int(turn / uint64(n) % uint64(usable))
	for i := range n {
		if !s.usable(i, now, avoid) {
			continue
		}
		if k == 0 {
			return i, true
		}
		k--
	}
	return 0, false // not reached: k < usable
}

// affinityEntry remembers which endpoint a client IP was sent to.
type affinityEntry struct {
	endpoint netip.AddrPort
	lastUsed time.Time
}

// balancer picks endpoints for one service port: round robin over the
// current endpoints of the client's IP family, with optional ClientIP
// affinity. Endpoint and affinity updates take effect for the next pick;
// picks never block on updates.
//
// A dual-stack Service's IPv4 clients go to its IPv4 endpoints and IPv6
// clients to its IPv6 ones, as kube-proxy's proxier of each family sends
// them: a pod sees its clients in the family they used, and a family with
// no endpoints refuses, however many the other has.
type balancer struct {
	clock Clock
	// sets and next are indexed by familyIndex.
	sets [2]atomic.Pointer[endpointSet]
	next [2]atomic.Uint64
	aff  atomic.Pointer[state.Affinity]
	// pool says which of the Service's endpoints the balancer picks from,
	// for explainPick; nil says nothing.
	pool atomic.Pointer[endpointPool]

	mu      sync.Mutex // guards the fields below
	clients map[netip.Addr]affinityEntry
}

func newBalancer(clock Clock, eps []state.Endpoint, aff state.Affinity) *balancer {
	b := &balancer{clock: clock, clients: make(map[netip.Addr]affinityEntry)}
	// Start each balancer at a random position so that proxies on many
	// nodes, which all see the same sorted endpoint list, do not all send
	// their first connection to the same endpoint.
	for i, fam := range splitFamilies(eps) {
		b.next[i].Store(rand.Uint64())
		b.sets[i].Store(newEndpointSet(fam))
	}
	b.aff.Store(&aff)
	return b
}

// familyIndex is the index of a's IP family in balancer.sets: 0 for IPv4,
// 1 for IPv6.
func familyIndex(a netip.Addr) int {
	if familyOf(a) == familyIPv4 {
		return 0
	}
	return 1
}

// splitFamilies splits eps by IP family, keeping their order.
func splitFamilies(eps []state.Endpoint) [2][]state.Endpoint {
	var out [2][]state.Endpoint
	for _, ep := range eps {
		i := familyIndex(ep.Addr.Addr())
		out[i] = append(out[i], ep)
	}
	return out
}

// setOf returns the endpoint set a connection from client picks from, and
// its index: client's family, or for a client of unknown address the
// first family with endpoints.
func (b *balancer) setOf(client netip.Addr) (*endpointSet, int) {
	i := 0
	if client.IsValid() {
		i = familyIndex(client)
	} else if len(b.sets[0].Load().addrs) == 0 {
		i = 1
	}
	return b.sets[i].Load(), i
}

// update installs a new endpoint set and affinity. Round robin continues
// from where it was; affinity entries that point at removed endpoints are
// dropped, and a change of affinity type forgets every client.
func (b *balancer) update(eps []state.Endpoint, aff state.Affinity) {
	for i, fam := range splitFamilies(eps) {
		if !sameAddrs(b.sets[i].Load(), fam) {
			b.sets[i].Store(newEndpointSet(fam))
		}
	}
	prev := b.aff.Swap(&aff)
	if prev.Type != aff.Type || !aff.Sticky() {
		b.mu.Lock()
		clear(b.clients)
		b.mu.Unlock()
	}
	b.sweep()
}

// sameAddrs reports whether s holds eps: the same addresses, with the
// same conditions and hints (that explainPick tells).
func sameAddrs(s *endpointSet, eps []state.Endpoint) bool {
	return slices.Equal(s.eps, eps)
}

// has reports whether ep is one of the current endpoints.
func (b *balancer) has(ep netip.AddrPort) bool {
	return b.sets[familyIndex(ep.Addr())].Load().has(ep)
}

// pick returns the endpoint for a new connection or session from client.
// Endpoints in avoid (already tried and failed for this connection) are
// skipped while others remain; a non-empty avoid also replaces the client's
// affinity with the new choice, so a sticky client leaves a dead endpoint.
func (b *balancer) pick(client netip.Addr, avoid []netip.AddrPort) (netip.AddrPort, error) {
	ep, _, err := b.choose(client, avoid)
	return ep, err
}

// pickWhy says how choose chose an endpoint (see explainPick).
type pickWhy uint8

const (
	pickedInTurn       pickWhy = iota // round robin: the next in turn
	pickedPastFailures                // round robin: the next in turn whose connections have not just failed
	pickedAffinity                    // ClientIP affinity: the endpoint the client had
	pickedMoved                       // the endpoint the client's UDP session had on the proxy port it moved from (see movedSessions)
)

// choose is pick, saying how it chose.
func (b *balancer) choose(client netip.Addr, avoid []netip.AddrPort) (netip.AddrPort, pickWhy, error) {
	set, fam := b.setOf(client)
	n := len(set.addrs)
	if n == 0 {
		return netip.AddrPort{}, pickedInTurn, ErrNoEndpoints
	}
	aff := b.aff.Load()
	sticky := aff.Sticky() && client.IsValid()
	var now time.Time
	if sticky {
		now = b.clock.Now()
		if len(avoid) == 0 {
			b.mu.Lock()
			e, ok := b.clients[client]
			if ok && now.Sub(e.lastUsed) < aff.TTL() && set.has(e.endpoint) && !set.inPenalty(e.endpoint, now) {
				e.lastUsed = now
				b.clients[client] = e
				b.mu.Unlock()
				return e.endpoint, pickedAffinity, nil
			}
			b.mu.Unlock()
		}
	}
	turn := b.next[fam].Add(1) - 1
	start := int(turn % uint64(n))
	ep, why := set.addrs[start], pickedInTurn
	if n > 1 && (len(avoid) > 0 || set.penalized.Load() > 0) {
		nowNano := b.clock.Now().UnixNano()
		if !set.usable(start, nowNano, avoid) {
			// Pass over an endpoint that just failed. Its turns go to
			// the usable endpoints in rotation, one round to each, so
			// that no single neighbour takes its whole share. If every
			// one is in its penalty, those this connection has not
			// tried yet are still better than those it has; if it has
			// tried them all, keep the plain choice rather than refuse.
			i, ok := set.rotate(turn, nowNano, avoid)
			if !ok && len(avoid) > 0 {
				i, ok = set.rotate(turn, math.MaxInt64, avoid)
			}
			if ok {
				ep, why = set.addrs[i], pickedPastFailures
			}
		}
	}
	if sticky {
		b.mu.Lock()
		b.clients[client] = affinityEntry{endpoint: ep, lastUsed: now}
		b.mu.Unlock()
	}
	return ep, why, nil
}

// mayKeep reports whether b may send a new session from client to ep:
// ep is one of its current endpoints of client's family (those its
// traffic policies, readiness and topology hints leave), and not passed
// over after a failure.
func (b *balancer) mayKeep(client netip.Addr, ep netip.AddrPort) bool {
	set, _ := b.setOf(client)
	return set.has(ep) && !set.inPenalty(ep, b.clock.Now())
}

// penalize makes picks pass over ep for d, while other endpoints remain.
func (b *balancer) penalize(ep netip.AddrPort, d time.Duration) {
	set := b.sets[familyIndex(ep.Addr())].Load()
	if i, ok := set.index[ep]; ok {
		set.until[i].Store(b.clock.Now().Add(d).UnixNano())
		set.penalized.Add(1)
	}
}

// remember points client's ClientIP affinity at ep, the endpoint of a
// dial attempt that timed out and then connected first: the attempts
// after it had moved the affinity on (choose records every pick).
func (b *balancer) remember(client netip.Addr, ep netip.AddrPort) {
	if !b.aff.Load().Sticky() || !client.IsValid() {
		return
	}
	now := b.clock.Now()
	b.mu.Lock()
	b.clients[client] = affinityEntry{endpoint: ep, lastUsed: now}
	b.mu.Unlock()
}

// forget drops client's affinity if it still points at ep, e.g. after ep
// refused a session.
func (b *balancer) forget(client netip.Addr, ep netip.AddrPort) {
	b.mu.Lock()
	if e, ok := b.clients[client]; ok && e.endpoint == ep {
		delete(b.clients, client)
	}
	b.mu.Unlock()
}

// sweep removes expired affinity entries and entries for endpoints that are
// gone. It runs on every update, so at least once per resync period.
func (b *balancer) sweep() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.clients) == 0 {
		return
	}
	aff := b.aff.Load()
	now := b.clock.Now()
	for c, e := range b.clients {
		if now.Sub(e.lastUsed) >= aff.TTL() || !b.has(e.endpoint) {
			delete(b.clients, c)
		}
	}
}

// affinityClients is the number of remembered clients (for tests and debug
// views).
func (b *balancer) affinityClients() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.clients)
}
