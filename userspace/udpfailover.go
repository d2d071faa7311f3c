package userspace

import (
	"net/netip"
	"slices"

	"k8s.io/klog/v2"
)

// udpPending holds a new UDP session's first client datagrams until its
// endpoint answers, so that a refusal (ICMP port unreachable) that comes
// first can send them to another endpoint: the UDP counterpart of TCP's
// connect-time failover. A pod that crashed while still marked ready
// refuses; without this the client's query was lost, and a resolver
// waited out its whole timeout (glibc: 5 s) where kube-proxy's clients get
// the ICMP error at once. Only a few small datagrams are kept, and only
// until the first reply; past those bounds the session keeps none and a
// refusal ends it, as before.
type udpPending struct {
	bufs    [][]byte
	size    int
	tried   []netip.AddrPort // endpoints that refused this session
	settled bool             // a reply came, or more was sent than is kept: nothing is held
	// sent says which datagrams keep numbered reached an endpoint (kept
	// when settle drops them): the session's tally counts each client
	// datagram once, however many endpoints it was sent to (see forward).
	sent [maxPendingDatagrams]bool
}

const (
	// maxPendingDatagrams and maxPendingBytes bound what a session holds
	// for a failover: a DNS query, or a resolver's A and AAAA pair, fits.
	maxPendingDatagrams = 4
	maxPendingBytes     = 4096
)

// keep copies a client datagram sent to the endpoint before its first
// reply, and returns its number (its index in bufs), or -1 if it is not
// kept.
func (p *udpPending) keep(b []byte) int {
	if p.settled {
		return -1
	}
	if len(p.bufs) == maxPendingDatagrams || p.size+len(b) > maxPendingBytes {
		p.settle()
		return -1
	}
	p.bufs = append(p.bufs, slices.Clone(b))
	p.size += len(b)
	return len(p.bufs) - 1
}

// forward records that the datagram keep numbered i (-1: one not kept)
// reached an endpoint, and reports whether it is the first time. The
// data plane's counters count every datagram sent to an endpoint, a resend
// after a refusal too; the session's tally (the "UDP session ended" line)
// counts the client's datagrams that reached an endpoint, each once.
func (p *udpPending) forward(i int) bool {
	if i < 0 {
		return true
	}
	first := !p.sent[i]
	p.sent[i] = true
	return first
}

// settle drops what is held: the endpoint answered, or the session sent
// more than is kept.
func (p *udpPending) settle() {
	p.settled, p.bufs, p.size = true, nil, 0
}

// udpFailover handles a refusal by endpoint ep of a session from client
// picked from b (see udpRefused). When the session has had no reply yet
// and another endpoint remains to try (at most as many as TCP's dial
// attempts, Config.DialTimeouts), it returns that endpoint: the session
// moves there and sends what pend holds again. Otherwise the session ends.
func (sp *servicePort) udpFailover(b *balancer, role socketRole, client, ep netip.AddrPort, pend *udpPending) (netip.AddrPort, bool) {
	sp.udpRefused(b, client, ep)
	if pend.settled || len(pend.bufs) == 0 || len(pend.tried)+1 >= len(sp.p.cfg.DialTimeouts) {
		return netip.AddrPort{}, false
	}
	pend.tried = append(pend.tried, ep)
	next, why, err := b.choose(client.Addr(), pend.tried)
	if err != nil || slices.Contains(pend.tried, next) {
		return netip.AddrPort{}, false
	}
	klog.V(3).InfoS("UDP endpoint refused a session before any reply; its datagrams go to another endpoint", "service", sp.name, "client", client, "refused", ep, "endpoint", next, "datagrams", len(pend.bufs))
	if klog.V(4).Enabled() {
		sp.explainPick(b, role, client, next, why, len(pend.tried)+1)
	}
	return next, true
}
