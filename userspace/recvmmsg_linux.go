//go:build linux && !goroutines

package userspace

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// udpBatch is how many datagrams one recvmmsg call may return.
const udpBatch = 8

// datagram is one received datagram: its payload, its sender and the
// address it was sent to.
type datagram struct {
	buf  []byte // maxDatagram bytes; payload is buf[:n]
	n    int
	from netip.AddrPort
	to   netip.Addr
}

// mmsghdr is struct mmsghdr from <sys/socket.h>.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
}

// recvBatch holds what one recvmmsg call needs: the UDP loop owns one, with
// its buffers, for all the sockets it serves.
type recvBatch struct {
	dgrams [udpBatch]datagram
	hdrs   [udpBatch]mmsghdr
	iovs   [udpBatch]unix.Iovec
	names  [udpBatch]unix.RawSockaddrInet6 // large enough for either family
	oobs   [udpBatch][64]byte
}

func newRecvBatch() *recvBatch {
	b := &recvBatch{}
	for i := range b.dgrams {
		b.dgrams[i].buf = make([]byte, maxDatagram)
		b.iovs[i].Base = &b.dgrams[i].buf[0]
		b.iovs[i].SetLen(maxDatagram)
	}
	return b
}

// recvmmsg reads the datagrams queued on the non-blocking socket fd, up to
// udpBatch, in one recvmmsg(2) call. It returns EAGAIN when none is queued.
// addrs asks for each datagram's sender and destination; a connected
// socket knows them already, and the kernel is spared copying them out.
func recvmmsg(fd int, b *recvBatch, addrs bool) (int, error) {
	for i := range b.hdrs {
		h := &b.hdrs[i].hdr
		h.Iov = &b.iovs[i]
		h.SetIovlen(1)
		if addrs {
			h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
			h.Namelen = uint32(unsafe.Sizeof(b.names[i]))
			h.Control = &b.oobs[i][0]
			h.SetControllen(len(b.oobs[i]))
		} else {
			h.Name, h.Namelen, h.Control = nil, 0, nil
			h.SetControllen(0)
		}
		h.Flags = 0
		b.hdrs[i].len = 0
	}
	var r uintptr
	var errno syscall.Errno
	for {
		r, _, errno = unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), udpBatch, unix.MSG_DONTWAIT, 0, 0)
		if errno != unix.EINTR {
			break
		}
	}
	if errno != 0 {
		return 0, errno
	}
	n := int(r)
	for i := range n {
		d := &b.dgrams[i]
		d.n = int(b.hdrs[i].len)
		d.from, d.to = netip.AddrPort{}, netip.Addr{}
		if addrs {
			d.from = parseSockaddr(&b.names[i])
			d.to = parsePktinfo(b.oobs[i][:b.hdrs[i].hdr.Controllen])
		}
	}
	return n, nil
}

func parseSockaddr(sa *unix.RawSockaddrInet6) netip.AddrPort {
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	case unix.AF_INET6:
		a := netip.AddrFrom16(sa.Addr).Unmap()
		if sa.Scope_id != 0 {
			// A link-local client: its reply must leave by the same
			// interface (see zoneIndex).
			a = a.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10))
		}
		return netip.AddrPortFrom(a, port)
	}
	return netip.AddrPort{}
}

// parsePktinfo returns the destination address from an IP_PKTINFO or
// IPV6_PKTINFO control message. A link-local IPv6 destination carries the
// receiving interface as its zone (see pktinfoDst).
func parsePktinfo(oob []byte) netip.Addr {
	hdrLen := unix.CmsgLen(0)
	for len(oob) >= hdrLen {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < hdrLen || l > len(oob) {
			return netip.Addr{}
		}
		data := oob[hdrLen:l]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&data[0]))
			return netip.AddrFrom4(pi.Addr)
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			pi := (*unix.Inet6Pktinfo)(unsafe.Pointer(&data[0]))
			return pktinfoDst(netip.AddrFrom16(pi.Addr).Unmap(), int(pi.Ifindex))
		}
		oob = oob[min(unix.CmsgSpace(l-hdrLen), len(oob)):]
	}
	return netip.Addr{}
}
