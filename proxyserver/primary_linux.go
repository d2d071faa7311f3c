package proxyserver

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// defaultRouteAddrs returns, for each IP family, the global addresses of
// the interface of the main table's default route (the one with the
// lowest metric); usable ones only (not tentative, DAD not failed).
func defaultRouteAddrs() ([]netip.Addr, error) {
	var out []netip.Addr
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlink.RouteList(nil, fam)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		link, prio := 0, 0
		for _, r := range routes {
			if r.Dst != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			idx := r.LinkIndex
			if idx == 0 && len(r.MultiPath) > 0 {
				idx = r.MultiPath[0].LinkIndex
			}
			if idx != 0 && (link == 0 || r.Priority < prio) {
				link, prio = idx, r.Priority
			}
		}
		if link == 0 {
			continue
		}
		l, err := netlink.LinkByIndex(link)
		if err != nil {
			return nil, fmt.Errorf("default route's interface %d: %w", link, err)
		}
		addrs, err := netlink.AddrList(l, fam)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
				continue
			}
			if ip = ip.Unmap(); ip.IsGlobalUnicast() {
				out = append(out, ip)
			}
		}
	}
	return out, nil
}
