// Package conntrack owns conntrack cleanup: deleting the UDP entries that
// would keep clients talking to a service mapping that no longer exists.
//
// Interface has one method, ClearUDP. New returns the netlink
// implementation on Linux (it needs CAP_NET_ADMIN) and Noop elsewhere; Fake
// is an in-memory table for tests. StaleUDP is the pure decision: given
// the portals of the previous and the new sync, which entries are stale
// (its comment explains why endpoint changes need none in a userspace
// proxy). RemovedUDP gives the entries of rules that were removed
// (--cleanup, a run with another portal, our chains in the other iptables
// backend).
//
// It leaves deciding when to clean to the sync loop, and the portals
// themselves to package portal.
//
// Usage, after the portal of a sync has been programmed:
//
//	ct, _ := conntrack.New()
//	if fs := conntrack.StaleUDP(lastPortals, portals); len(fs) > 0 {
//		if _, err := ct.ClearUDP(ctx, fs...); err != nil { ... }
//	}
//	lastPortals = portals
package conntrack
