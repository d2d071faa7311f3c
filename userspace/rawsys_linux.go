//go:build linux && !goroutines

package userspace

import (
	"encoding/binary"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The event loops make the system calls of their data paths (TCP and UDP)
// without telling the Go scheduler: RawSyscall rather than Syscall. Every
// descriptor they touch is non-blocking, so no call waits; but a connect,
// write or close on loopback runs the peer's side of TCP in the caller's
// context and can take tens of microseconds. Under Syscall the runtime's
// monitor thread then wakes every 20 µs to take the P away from such a
// "blocked" call and hand it back afterwards: measured at a tenth of the
// proxy's CPU during a connection-rate benchmark, for nothing, since the
// loop runs on as soon as the call returns. A call that can block must
// keep using the ordinary wrappers; setup paths (listen, bind) use them
// too, as speed does not matter there.

// Pointers are converted to uintptr in the call expressions themselves,
// which keeps what they point to alive and in place for the call (rule 4
// of unsafe.Pointer: x/sys/unix's RawSyscall is an assembly function).

// errnoErr returns e as an error, or nil for 0. Errno values are small
// integers, which the runtime boxes without allocating.
func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func rawRead(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawWrite(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawSplice moves up to n bytes from rfd to wfd without offsets.
func rawSplice(rfd, wfd, n int, flags int) (int, error) {
	m, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(rfd), 0, uintptr(wfd), 0, uintptr(n), uintptr(flags))
	if e != 0 {
		return 0, e
	}
	return int(m), nil
}

func rawClose(fd int) {
	_, _, _ = unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
}

func rawShutdown(fd, how int) error {
	_, _, e := unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), uintptr(how), 0)
	return errnoErr(e)
}

func rawSocket(domain, typ, proto int) (int, error) {
	fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(domain), uintptr(typ), uintptr(proto))
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

func rawSetsockoptInt(fd, level, opt, value int) error {
	v := int32(value)
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v)), 4, 0)
	return errnoErr(e)
}

func rawGetsockoptInt(fd, level, opt int) (int, error) {
	var v int32
	l := uint32(4)
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&l)), 0)
	return int(v), errnoErr(e)
}

// rawLinger0 sets SO_LINGER to {on, 0}: the next close sends a reset.
func rawLinger0(fd int) {
	l := unix.Linger{Onoff: 1, Linger: 0}
	_, _, _ = unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_LINGER, uintptr(unsafe.Pointer(&l)), unsafe.Sizeof(l), 0)
}

// rawSockaddr is an IPv4 or IPv6 socket address as the kernel takes it.
type rawSockaddr struct {
	sa  unix.RawSockaddrInet6 // or a RawSockaddrInet4 in its first bytes
	len uint32
}

// makeRawSockaddr encodes ap in family fam.
func makeRawSockaddr(fam family, ap netip.AddrPort) rawSockaddr {
	var r rawSockaddr
	if fam == familyIPv6 {
		r.sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: ap.Addr().As16(), Scope_id: zoneIndex(ap.Addr().Zone())}
		putPort(&r.sa.Port, ap.Port())
		r.len = unix.SizeofSockaddrInet6
		return r
	}
	sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(&r.sa))
	sa4.Family = unix.AF_INET
	sa4.Addr = ap.Addr().Unmap().As4()
	putPort(&sa4.Port, ap.Port())
	r.len = unix.SizeofSockaddrInet4
	return r
}

// rawConnect starts a connect of the socket fd to ap (IPv4 or IPv6, as
// the socket's family).
func rawConnect(fd int, fam family, ap netip.AddrPort) error {
	sa := makeRawSockaddr(fam, ap)
	_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa.sa)), uintptr(sa.len))
	return errnoErr(e)
}

// rawSendmsg sends one datagram to, with control message oob, without
// waiting.
func rawSendmsg(fd int, p, oob []byte, to *rawSockaddr) error {
	iov := unix.Iovec{Base: unsafe.SliceData(p)}
	iov.SetLen(len(p))
	msg := unix.Msghdr{Name: (*byte)(unsafe.Pointer(&to.sa)), Namelen: to.len, Iov: &iov}
	msg.SetIovlen(1)
	if len(oob) > 0 {
		msg.Control = &oob[0]
		msg.SetControllen(len(oob))
	}
	_, _, e := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT)
	return errnoErr(e)
}

// rawAccept4 accepts a connection on fd and returns its socket and the
// client's address.
func rawAccept4(fd int, flags int) (int, netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6 // large enough for either family
	l := uint32(unsafe.Sizeof(sa))
	nfd, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&l)), uintptr(flags), 0, 0)
	if e != 0 {
		return -1, netip.AddrPort{}, e
	}
	return int(nfd), parseSockaddr(&sa), nil
}

// rawGetsockname returns the local address of socket fd.
func rawGetsockname(fd int) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6 // large enough for either family
	l := uint32(unsafe.Sizeof(sa))
	_, _, e := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&l)))
	if e != 0 {
		return netip.AddrPort{}, e
	}
	return parseSockaddr(&sa), nil
}

// putPort stores a sockaddr's port, which is in network byte order
// whatever the machine's (parseSockaddr reads it back).
func putPort(field *uint16, port uint16) {
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(field))[:], port)
}

func rawEpollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	return errnoErr(e)
}

// rawEpollWait collects the events pending on epfd, waiting up to timeout
// milliseconds (0: not at all; -1: for ever) for one. The wait holds the
// caller's P: the runtime takes it for a running goroutine.
func rawEpollWait(epfd int, events []unix.EpollEvent, timeout int) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(timeout), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
