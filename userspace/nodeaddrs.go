package userspace

import "net/netip"

// NodeAddrs lists the addresses of this host that can serve node ports
// bound to them: every interface's, with the interface as the zone of an
// IPv6 link-local address (fe80::1%eth0), which cannot be bound without
// one. On Linux, IPv6 addresses that are not usable yet (tentative, while
// duplicate address detection runs) or never will be (DAD failed) are left
// out: binding them fails. The kernel announces such an address again when
// DAD ends, so a caller that follows address changes picks it up then.
func NodeAddrs() ([]netip.Addr, error) { return nodeAddrs() }
