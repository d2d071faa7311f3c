//go:build linux

package userspace

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/
// ip6_tables.h), which x/sys/unix does not define: the same number as
// SO_ORIGINAL_DST, at level SOL_IPV6.
const ip6tSOOriginalDst = 80

// originalDst returns the destination a redirected (REDIRECT or DNAT)
// connection had before netfilter rewrote it, read from conntrack with
// SO_ORIGINAL_DST (IPv4) or IP6T_SO_ORIGINAL_DST (IPv6). It fails when the
// connection has no conntrack entry (ENOENT).
func originalDst(fd int, ipv6 bool) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6 // large enough for either family
	level, opt, l := unix.SOL_IP, unix.SO_ORIGINAL_DST, uint32(unix.SizeofSockaddrInet4)
	if ipv6 {
		level, opt, l = unix.SOL_IPV6, ip6tSOOriginalDst, unix.SizeofSockaddrInet6
	}
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return netip.AddrPort{}, e
	}
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(&sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port), nil
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port), nil
	}
	return netip.AddrPort{}, unix.EAFNOSUPPORT
}
