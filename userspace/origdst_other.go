//go:build !linux

package userspace

import (
	"errors"
	"net/netip"
	"syscall"
)

// connOriginalDst: only Linux's netfilter redirects to proxy ports, so
// elsewhere a connection's destination is its socket's own address.
func connOriginalDst(syscall.Conn, bool) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.ErrUnsupported
}
