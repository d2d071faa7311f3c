//go:build unix

package userspace

import (
	"net"
	"net/netip"
	"strconv"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// maxDatagram is the largest UDP payload over IPv4 (65,535 - 8 - 20); IPv6
// jumbograms aside, nothing larger reaches a UDP socket. Buffers hold it
// whole, so no datagram is ever truncated (the legacy proxier cut them at
// 4 KiB).
const maxDatagram = 65535

// frontendRcvBuf is the receive buffer a UDP service socket asks for. The
// usual default (net.core.rmem_default, 208 KiB) holds about 800 small
// datagrams, so a burst of new clients (each pod's resolver asking A and
// AAAA as a Deployment rolls out) overflows it while the proxy opens their
// sessions; the datagrams lost there are lost silently. The buffer is a
// limit, not an allocation: memory is used only while datagrams wait.
// A session's socket to its endpoint asks for the same: a server that
// answers in bursts (a QUIC-like stream, a GSO send of 64 datagrams)
// would overflow the default as the loop gets round to it.
const frontendRcvBuf = 4 << 20

// clearSocketError reads and so clears a socket's pending error: a
// refusal by the endpoint a session just moved away from, whose ICMP error
// came before the move, would otherwise be read as one by the new
// endpoint (connect(2) leaves it pending). Later errors from the old
// endpoint no longer match the socket.
func clearSocketError(fd int) {
	_, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
}

// maxUnanswered bounds a session's count of client datagrams without a
// reply, so a one-way flow (syslog) cannot wrap it round.
const maxUnanswered = 1 << 20

func sockaddr(f family, ap netip.AddrPort) unix.Sockaddr {
	if f == familyIPv6 {
		return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16(), ZoneId: zoneIndex(ap.Addr().Zone())}
	}
	return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
}

// sessionKey names a UDP session: its client, and the address the client
// sent to. A proxy or node port listening on every address takes datagrams
// to several, and each flow's replies must leave from its own, even when
// one client socket uses two of them.
type sessionKey struct {
	client netip.AddrPort
	dst    netip.Addr
}

// zoneIndex is the interface index of an IPv6 zone, as a link-local
// client's address carries it: a number (as the event loops read it) or
// an interface name (as Go's net package gives it); 0 for none.
func zoneIndex(zone string) uint32 {
	if zone == "" {
		return 0
	}
	if n, err := strconv.ParseUint(zone, 10, 32); err == nil {
		return uint32(n)
	}
	if ifi, err := net.InterfaceByName(zone); err == nil {
		return uint32(ifi.Index)
	}
	return 0
}

// pktinfoDst is the address a datagram was delivered to, as IPV6_PKTINFO
// gives it: dst, received on interface ifindex. A link-local dst keeps the
// interface as its zone, as a link-local client's address does: the same
// address can be on several interfaces, and a reply from it must leave by
// the one the datagram came in on. On a node whose pod-facing veth has
// only fe80::1 (Calico's layout), ip6tables REDIRECT delivers a pod's
// datagrams to fe80::1.
func pktinfoDst(dst netip.Addr, ifindex int) netip.Addr {
	if dst.Is6() && dst.IsLinkLocalUnicast() && ifindex > 0 {
		return dst.WithZone(strconv.Itoa(ifindex))
	}
	return dst
}

// pktinfoOOB builds the control message that makes a reply leave from src
// (IP_PKTINFO's ipi_spec_dst, or IPV6_PKTINFO's address). An invalid src
// lets the kernel choose. A zoned src (a link-local address, see
// pktinfoDst) also names its interface (IPV6_PKTINFO's ipi6_ifindex): the
// kernel refuses a link-local source without one (EINVAL from Linux's
// ip6_datagram_send_ctl), and the reply would be lost.
func pktinfoOOB(f family, src netip.Addr) []byte {
	if !src.IsValid() {
		return nil
	}
	if f == familyIPv6 {
		return (&ipv6.ControlMessage{Src: src.WithZone("").AsSlice(), IfIndex: int(zoneIndex(src.Zone()))}).Marshal()
	}
	return (&ipv4.ControlMessage{Src: src.AsSlice()}).Marshal()
}
