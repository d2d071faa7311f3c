// Package portal owns kernel redirection: it makes traffic that clients
// send to service addresses (ClusterIPs, ExternalIPs, load-balancer IPs
// and NodePorts) reach the proxy on this host.
//
// Implementations of Interface:
//   - IPTables (Linux): nat REDIRECT rules to each service port's proxy
//     port (or DNAT to a node address and the proxy port, for a family
//     IPTablesConfig.DNAT names one in), in the legacy userspace chains: KUBE-PORTALS-CONTAINER (from
//     PREROUTING) and KUBE-PORTALS-HOST (from OUTPUT), both prepended, for
//     address portals; KUBE-NODEPORT-CONTAINER and KUBE-NODEPORT-HOST,
//     appended after them and entered only for local destinations
//     ("-m addrtype --dst-type LOCAL"), for NodePorts; and filter
//     KUBE-NODEPORT-NON-LOCAL (from INPUT) accepting new connections to
//     the proxy ports and, as kube-proxy does, TCP to each Service's
//     health-check node port, which the proxy serves without a redirect,
//     whatever the INPUT policy. Every portal rule carries the comment "ns/svc:port";
//     the host chains hold one jump each into their container chains, as
//     node traffic takes the same REDIRECTs, which halves the rules. IPv4
//     through iptables, IPv6 through ip6tables, in the backend (nft or
//     legacy) that holds the host's existing rules. The kernel runs the
//     rules of both backends, so our chains that an earlier run left in
//     the other one (it chose that backend, and another tool's rules have
//     since tipped the choice) would keep catching frontends that are gone:
//     Sync removes them, with their jumps, and logs how many; a failure is
//     logged and retried at the next Sync. Each Sync rewrites our
//     chains with one iptables-restore --noflush per table and family, so
//     stale rules disappear atomically and nothing else is touched; nothing
//     is flushed at start, so a restarted proxy keeps serving until its
//     first Sync. InSync reads the rules back and tells whether a Sync
//     would change anything, so that a periodic resync of unchanged
//     portals can write nothing; it looks for our chains in the other
//     backend too (put there while the proxy runs, by an older build or
//     by hand), without a program where that backend is unused, and finds
//     them not in sync, for the Sync to remove. Traffic from the node itself is REDIRECTed as well and
//     lands on 127.0.0.1 or ::1 (REDIRECT needs no route_localnet); the
//     data plane answers UDP from the address the client sent to.
//     ExternalIPs are caught from every source, like ClusterIPs, as
//     kube-proxy's iptables mode does; the legacy "physdev" exception for
//     bridged pod traffic to non-local external IPs is not kept. A
//     load-balancer IP with SourceRanges is caught only from them, and
//     filter KUBE-PORTALS-FIREWALL (from INPUT, FORWARD and OUTPUT, for
//     new connections) drops what other sources send it, as kube-proxy
//     drops it.
//   - Bind (netfilter-free): adds service addresses as /32 and /128 to a
//     dummy interface it owns (or lo), so the data plane listens on
//     serviceIP:port itself. Off Linux it only checks that the addresses
//     are present.
//   - Noop ("none"): nothing; clients use proxy ports and node ports.
//   - Fake: records the last Sync and renders the same rule text as
//     IPTables, for tests of other packages.
//
// It leaves listening to package userspace and conntrack cleanup to package
// conntrack. FromSnapshot derives the wanted portals from a state.Snapshot
// and the data plane's proxy ports.
//
// Usage, with the iptables portal:
//
//	pt, err := portal.NewIPTables(ctx, portal.IPTablesConfig{NodePortAddresses: prefixes})
//	...
//	if err := proxier.Apply(snap); err != nil { ... }
//	if err := pt.Sync(ctx, portal.FromSnapshot(snap, proxier.ProxyPort, nil)); err != nil {
//		// retried by the next sync
//	}
//	// --cleanup:
//	err = pt.Cleanup(ctx)
package portal
