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
// port). A node port's number is the same on every node of the cluster, so
// its port alone would also match flows that other rules route or
// masquerade to other hosts' node ports (a pod's, say); like kube-proxy's
// filterForPortNAT, a node port's filter also matches where the rules sent
// the flow: the reply's source port is the old proxy port (REDIRECT, or
// DNAT to a node address). For a node port that had no proxy port, the
// entries to clear are unredirected ones, which carry no NAT (NoNAT); a
// masqueraded flow does. Endpoint changes
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
	stale := func(k key, was uint16) {
		out = append(out, frontendFilter(k.nodePort, k.fam, k.ip, k.port, was))
	}
	for k, was := range before {
		if now := after[k]; now.proxyPort != was.proxyPort || now.reject && !was.reject {
			stale(k, was.proxyPort)
		}
	}
	for k, now := range after {
		if _, ok := before[k]; !ok && now.proxyPort != 0 {
			stale(k, 0)
		}
	}
	slices.SortFunc(out, compareFilters)
	return slices.Compact(out)
}

// frontendFilter selects the UDP entries of a frontend: by address and
// port; for a node port (any local address), by port and the proxy port
// its rules sent the flow to (was), or, if they sent it nowhere (was is
// zero), by port and the absence of NAT.
func frontendFilter(nodePort bool, fam portal.Family, ip netip.Addr, port, was uint16) Filter {
	f := Filter{Family: fam, OrigDstPort: port}
	switch {
	case !nodePort:
		f.OrigDst = ip
	case was != 0:
		f.ReplySrcPort = was
	default:
		f.NoNAT = true
	}
	return f
}

// RemovedUDP returns the filters of the UDP conntrack entries that the
// rules of removed portals made (portal.IPTables.Removed): every UDP
// frontend of theirs with a proxy port, by its original destination (for
// a node port, its port and the proxy port it was sent to). Whatever replaces the rules (none, the bind
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
	if c := int(a.ReplySrcPort) - int(b.ReplySrcPort); c != 0 {
		return c
	}
	switch { // false before true
	case a.NoNAT == b.NoNAT:
		return 0
	case a.NoNAT:
		return 1
	}
	return -1
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
		out = append(out, frontendFilter(p.Kind == portal.NodePort, f, p.IP.Unmap(), p.Port, p.ProxyPort))
	}
	slices.SortFunc(out, compareFilters)
	return slices.Compact(out)
}
