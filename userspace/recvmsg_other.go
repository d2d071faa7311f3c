//go:build unix && (!linux || goroutines)

package userspace

import (
	"net/netip"
	"strconv"
	"syscall"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// datagram is one received datagram: its payload, its sender and the
// address it was sent to.
type datagram struct {
	buf  []byte
	n    int
	from netip.AddrPort
	to   netip.Addr
}

// recvBatch reads one datagram at a time where recvmmsg(2) is missing.
type recvBatch struct {
	dgrams [1]datagram
	oob    [64]byte
}

func newRecvBatch() *recvBatch { return &recvBatch{} }

func (b *recvBatch) release() {
	if buf := b.dgrams[0].buf; buf != nil {
		datagramPool.Put(&buf)
		b.dgrams[0].buf = nil
	}
}

func readBatch(rc syscall.RawConn, b *recvBatch) (int, error) {
	d := &b.dgrams[0]
	var oobn int
	var from unix.Sockaddr
	var rerr error
	err := rc.Read(func(fd uintptr) bool {
		if d.buf == nil {
			d.buf = *datagramPool.Get().(*[]byte)
		}
		// Go's sockets are non-blocking, so no MSG_DONTWAIT (which AIX lacks).
		d.n, oobn, _, from, rerr = unix.Recvmsg(int(fd), d.buf, b.oob[:], 0)
		if rerr == unix.EAGAIN || rerr == unix.EINTR {
			b.release()
			return false
		}
		return true
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		b.release()
		return 0, err
	}
	switch sa := from.(type) {
	case *unix.SockaddrInet4:
		d.from = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		a := netip.AddrFrom16(sa.Addr).Unmap()
		if sa.ZoneId != 0 {
			// A link-local client: its reply must leave by the same
			// interface (see zoneIndex).
			a = a.WithZone(strconv.FormatUint(uint64(sa.ZoneId), 10))
		}
		d.from = netip.AddrPortFrom(a, uint16(sa.Port))
	}
	d.to = netip.Addr{}
	var cm4 ipv4.ControlMessage
	if cm4.Parse(b.oob[:oobn]) == nil && cm4.Dst != nil {
		d.to, _ = netip.AddrFromSlice(cm4.Dst)
	} else {
		var cm6 ipv6.ControlMessage
		if cm6.Parse(b.oob[:oobn]) == nil && cm6.Dst != nil {
			d.to, _ = netip.AddrFromSlice(cm6.Dst)
			d.to = pktinfoDst(d.to.Unmap(), cm6.IfIndex)
		}
	}
	d.to = d.to.Unmap()
	return 1, nil
}
