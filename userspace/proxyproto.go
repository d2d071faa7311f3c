package userspace

import (
	"encoding/binary"
	"net/netip"
	"strconv"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// The PROXY protocol header (https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt)
// tells an endpoint the address of the client a connection comes from,
// which a userspace proxy otherwise hides: the endpoint sees the proxy's.
// A Service asks for it with an annotation (see package source); the
// header is the first thing written on every connection to an endpoint,
// before any byte from the client, and again on the connection a failed
// dial moves on to.

// maxProxyHeader bounds the size of a header: the spec's bound for a
// version 1 line (107 bytes; the longest this proxy writes, TCP6 with two
// full IPv6 addresses, is 104); version 2 takes at most 16+36.
const maxProxyHeader = 107

// proxyV2Signature opens every version 2 header (section 2.2).
var proxyV2Signature = [12]byte{0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A}

// appendProxyHeader appends to b the header of version v for a TCP
// connection from src to dst, the frontend the client addressed.
// IPv4-mapped IPv6 addresses are written as IPv4. When src or dst is
// unknown, or their families differ, the header says so (v1 "UNKNOWN",
// v2 the command LOCAL with AF_UNSPEC) and the endpoint uses the
// connection's own addresses. For v2 that is the form a receiver must
// accept (section 2.2: it may refuse the command PROXY with AF_UNSPEC),
// and the one HAProxy sends when it has no addresses to name.
func appendProxyHeader(b []byte, v state.ProxyProtocol, src, dst netip.AddrPort) []byte {
	sa, da := src.Addr().Unmap().WithZone(""), dst.Addr().Unmap().WithZone("")
	known := src.IsValid() && dst.IsValid() && sa.Is4() == da.Is4()
	if v == state.ProxyProtocolV1 {
		if !known {
			return append(b, "PROXY UNKNOWN\r\n"...)
		}
		b = append(b, "PROXY TCP4 "...)
		if sa.Is6() {
			b[len(b)-2] = '6'
		}
		b = sa.AppendTo(b)
		b = append(b, ' ')
		b = da.AppendTo(b)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(src.Port()), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(dst.Port()), 10)
		return append(b, "\r\n"...)
	}
	b = append(b, proxyV2Signature[:]...)
	if !known {
		return append(b, 0x20, 0x00, 0, 0) // version 2, command LOCAL; AF_UNSPEC, UNSPEC; no addresses
	}
	b = append(b, 0x21) // version 2, command PROXY
	switch {
	case sa.Is4():
		b = append(b, 0x11) // AF_INET, STREAM
		b = binary.BigEndian.AppendUint16(b, 12)
	default:
		b = append(b, 0x21) // AF_INET6, STREAM
		b = binary.BigEndian.AppendUint16(b, 36)
	}
	b = append(b, sa.AsSlice()...)
	b = append(b, da.AsSlice()...)
	b = binary.BigEndian.AppendUint16(b, src.Port())
	return binary.BigEndian.AppendUint16(b, dst.Port())
}

// redirected reports whether sockets of role r take connections a portal
// redirected (or DNATed) to them, whose destination the kernel rewrote:
// the frontend the client addressed is then the original destination,
// not the socket's own address.
func (r socketRole) redirected() bool {
	return r == roleProxyPort || r == roleExternalProxyPort
}
