package portal

import "net/netip"

// IPTablesConfig configures the iptables portal.
type IPTablesConfig struct {
	// NodePortAddresses restricts NodePort rules to node addresses in
	// these prefixes (--nodeport-addresses). If empty, every local
	// address answers a NodePort ("-m addrtype --dst-type LOCAL").
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs are the pods' addresses (--cluster-cidr). A portal
	// that drops new connections for want of a local endpoint
	// (Portal.NoLocal) still takes theirs to external frontends.
	ClusterCIDRs []netip.Prefix
	// NoLocalhostNodePorts stops node ports on loopback addresses
	// (127.0.0.0/8, ::1), kube-proxy's --iptables-localhost-nodeports=false.
	// If false, this host's own traffic reaches them there, as before;
	// traffic from elsewhere never does (see render).
	NoLocalhostNodePorts bool
	// DNAT, if set, is asked at every Sync for the node address of each
	// family that portals DNAT to (to that address and the proxy port)
	// instead of REDIRECTing: REDIRECT sends a packet to the first
	// address of the interface it came in on, and drops it when that
	// interface has no address of its family (Calico's pod interfaces).
	// The zero Addr means REDIRECT.
	DNAT func(Family) netip.Addr
	// Backend forces the iptables backend. If empty, the backend holding
	// the host's existing rules is detected.
	Backend Backend
	// Families are the IP families to program. If nil, IPv4, and IPv6
	// when the kernel has it.
	Families []Family
	// LockWaitSeconds is how long to wait for the xtables lock. If zero,
	// 5.
	LockWaitSeconds int
	// ForCleanup says the portal is made only to remove what an earlier
	// run left, so NewIPTables does not announce it as the portal in use.
	ForCleanup bool
}
