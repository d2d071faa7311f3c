package state

import (
	"net/netip"
	"slices"
)

// The node-port addresses (--nodeport-addresses, the config file's
// nodePortAddresses) are read per IP family, as kube-proxy's
// NewNodePortAddresses reads them for the proxier of each family: a family
// none of the CIDRs is in, or one with a zero CIDR (0.0.0.0/0, ::/0),
// serves node ports on every address of that family. So
// --nodeport-addresses=10.0.0.0/8 narrows IPv4 node ports and leaves IPv6
// ones on every IPv6 address. No CIDRs at all means every address of both.

// NodePortCIDRs returns cidrs (masked) in the form the proxy works with:
// nil when every address of both families serves node ports; otherwise
// each family's CIDRs, and a zero CIDR alone for a family that serves node
// ports everywhere (one none of cidrs is in gets 0.0.0.0/0 or ::/0, as
// kube-proxy adds them).
func NodePortCIDRs(cidrs []netip.Prefix) []netip.Prefix {
	if len(cidrs) == 0 {
		return nil
	}
	var out []netip.Prefix
	for _, ipv6 := range []bool{false, true} {
		if NodePortsEverywhere(cidrs, ipv6) {
			out = append(out, zeroPrefix(ipv6))
			continue
		}
		for _, p := range cidrs {
			if p.Addr().Unmap().Is6() == ipv6 {
				out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p)).Masked())
			}
		}
	}
	if NodePortsEverywhere(out, false) && NodePortsEverywhere(out, true) && len(out) == 2 {
		return nil
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Compact(out)
}

// NodePortsEverywhere reports whether cidrs select every address of a
// family (IPv6 if ipv6, else IPv4) for node ports: none are given, none is
// of that family, or one of that family is a zero CIDR.
func NodePortsEverywhere(cidrs []netip.Prefix, ipv6 bool) bool {
	of := false
	for _, p := range cidrs {
		if p.Addr().Unmap().Is6() != ipv6 {
			continue
		}
		if p.Bits()-unmapBits(p) <= 0 {
			return true
		}
		of = true
	}
	return !of
}

// InNodePortCIDRs reports whether node ports are served on a, by cidrs as
// NodePortsEverywhere reads them. A zone (fe80::1%eth0) is ignored.
func InNodePortCIDRs(cidrs []netip.Prefix, a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	if NodePortsEverywhere(cidrs, a.Is6()) {
		return true
	}
	return slices.ContainsFunc(cidrs, func(p netip.Prefix) bool {
		return netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-unmapBits(p), 0)).Contains(a)
	})
}

// zeroPrefix is 0.0.0.0/0, or ::/0 if ipv6.
func zeroPrefix(ipv6 bool) netip.Prefix {
	if ipv6 {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
}

// unmapBits is what a prefix of an IPv4-mapped IPv6 address (::ffff:a.b.c.d/n)
// loses as an IPv4 prefix: 96 bits.
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}
