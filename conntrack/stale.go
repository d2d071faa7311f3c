package conntrack

import (
	"net/netip"
	"slices"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// StaleUDP returns the filters of the UDP conntrack entries that a change
// of portals from old to new leaves pointing at a dead mapping. Pass the
// portals of the previous and the new sync (portal.FromSnapshot of each
// snapshot with the proxy ports of the time); after a restart, the
// portals an earlier run left (IPTables.Existing).
//
// What keeps a UDP client on a dead mapping is its own entry: the kernel
// decides NAT on a flow's first datagram only, and every later datagram of
// the same 5-tuple refreshes the entry, so a client that keeps talking
// (DNS resolvers reuse their socket) never meets the new rules. The
// entries that matter are the clients' entries to a frontend (ClusterIP,
// ExternalIP, load-balancer IP, or a node port on any local address):
//   - a frontend that went away: its entries are REDIRECTed to a proxy
//     port that is closed, or soon reused by another service;
//   - a frontend whose proxy port changed (the listener was re-opened, or
//     the proxy restarted and got another port): entries still go to the
//     old port;
//   - a frontend that is new: datagrams sent before the rule existed made
//     unredirected entries that would go on being routed away;
//   - a frontend whose service port lost its last endpoint: the iptables
//     portal now rejects its new flows, and a client's existing entry
//     would carry it past the REJECT to the proxy, which can only drop
//     its datagrams (kube-proxy deletes such entries too).
//
// Each of those gives one filter on the original destination (address and
// port; port only for a node port, as kube-proxy does). Endpoint changes
// give none: in a userspace proxy a client's entry ends at the proxy port,
// which an endpoint change does not move, and the proxy's own entries to
// endpoints carry no NAT, so deleting them moves nothing; it would only
// make a strict INPUT policy (ESTABLISHED only) drop the endpoint's next
// reply. Moving sessions off a dead endpoint is the data plane's job.
// Portals without a proxy port (the bind portal) involve no NAT and give
// no filter unless they gain or lose a proxy port.
func StaleUDP(old, new []portal.Portal) []Filter {
	type key struct {
		nodePort bool
		fam      portal.Family
		ip       netip.Addr
		port     uint16
	}
	type target struct {
		proxyPort uint16
		reject    bool
	}
	mapping := func(ps []portal.Portal) map[key]target {
		m := make(map[key]target)
		for _, p := range ps {
			if p.Protocol() != state.UDP {
				continue
			}
			k := key{nodePort: p.Kind == portal.NodePort, fam: p.Family, port: p.Port}
			if !k.nodePort {
				k.ip = p.IP.Unmap()
			}
			if p.ProxyPort != 0 || m[k].proxyPort == 0 {
				m[k] = target{p.ProxyPort, p.Reject && p.ProxyPort != 0}
			}
		}
		return m
	}
	before, after := mapping(old), mapping(new)
	var out []Filter
	stale := func(k key) {
		f := Filter{Family: k.fam, OrigDstPort: k.port}
		if !k.nodePort {
			f.OrigDst = k.ip
		}
		out = append(out, f)
	}
	for k, was := range before {
		if now := after[k]; now.proxyPort != was.proxyPort || now.reject && !was.reject {
			stale(k)
		}
	}
	for k, now := range after {
		if _, ok := before[k]; !ok && now.proxyPort != 0 {
			stale(k)
		}
	}
	slices.SortFunc(out, compareFilters)
	return slices.Compact(out)
}

// RemovedUDP returns the filters of the UDP conntrack entries that the
// rules of removed portals made (portal.IPTables.Removed): every UDP
// frontend of theirs with a proxy port, by its original destination
// (port only for a node port). Whatever replaces the rules (none, the bind
// portal, or a later run's rules), such an entry keeps its client on the
// old mapping, REDIRECT or DNAT to a proxy port that may be closed or
// serve another Service, for as long as the client keeps talking.
func RemovedUDP(removed []portal.Portal) []Filter {
	return StaleUDP(removed, nil)
}

func compareFilters(a, b Filter) int {
	if c := int(a.Family) - int(b.Family); c != 0 {
		return c
	}
	if c := a.OrigDst.Compare(b.OrigDst); c != 0 {
		return c
	}
	if c := int(a.OrigDstPort) - int(b.OrigDstPort); c != 0 {
		return c
	}
	if c := a.ReplySrc.Compare(b.ReplySrc); c != 0 {
		return c
	}
	return int(a.ReplySrcPort) - int(b.ReplySrcPort)
}

// RetargetedUDP returns the filters of the UDP conntrack entries of every
// portal of family f that redirects (has a proxy port): what a change of
// where the portal sends its traffic (REDIRECT, or DNAT to another node
// address) leaves on the old mapping, which may no longer be this host's.
func RetargetedUDP(portals []portal.Portal, f portal.Family) []Filter {
	var out []Filter
	for _, p := range portals {
		if p.Protocol() != state.UDP || p.Family != f || p.ProxyPort == 0 {
			continue
		}
		flt := Filter{Family: f, OrigDstPort: p.Port}
		if p.Kind != portal.NodePort {
			flt.OrigDst = p.IP.Unmap()
		}
		out = append(out, flt)
	}
	slices.SortFunc(out, compareFilters)
	return slices.Compact(out)
}
