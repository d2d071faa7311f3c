//go:build !linux

package userspace

import (
	"net"
	"net/netip"
)

func nodeAddrs() ([]netip.Addr, error) { return interfaceAddrs() }

// interfaceAddrs is NodeAddrs from the standard library, for systems
// without netlink: addresses with zones, without their DAD state.
func interfaceAddrs() ([]netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue // gone meanwhile
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
					out = append(out, withZone(ip.Unmap(), ifi.Name))
				}
			}
		}
	}
	return out, nil
}

// withZone gives an IPv6 link-local address its interface as zone.
func withZone(a netip.Addr, ifName string) netip.Addr {
	if a.Is6() && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()) && ifName != "" {
		return a.WithZone(ifName)
	}
	return a
}
