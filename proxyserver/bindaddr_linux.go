package proxyserver

import (
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// addrDAD says where IPv6 duplicate address detection stands for addr, an
// address of this host: tentative while it runs, when bind(2) refuses the
// address (EADDRNOTAVAIL) as if it were not the host's, and failed when
// another host on its link has it, when bind(2) refuses it for good.
func addrDAD(addr netip.Addr) (tentative, failed bool) {
	if !addr.Is6() || addr.Is4In6() {
		return false, false
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		return false, false
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip == addr.WithZone("") {
			return a.Flags&unix.IFA_F_TENTATIVE != 0 && a.Flags&unix.IFA_F_DADFAILED == 0, a.Flags&unix.IFA_F_DADFAILED != 0
		}
	}
	return false, false
}
