//go:build linux && goroutines

package userspace

import (
	"net/netip"
	"syscall"
)

// connOriginalDst is originalDst for a connection Go's poller owns.
func connOriginalDst(c syscall.Conn, ipv6 bool) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var dst netip.AddrPort
	var derr error
	if err := rc.Control(func(fd uintptr) { dst, derr = originalDst(int(fd), ipv6) }); err != nil {
		return netip.AddrPort{}, err
	}
	return dst, derr
}
