//go:build goroutines

package userspace

import (
	"net"

	"golang.org/x/sys/unix"
)

// unacked returns how many bytes written to c (its FIN included) its peer
// has not acknowledged yet, the socket's send queue (SIOCOUTQ), and
// whether it could tell.
func unacked(c *net.TCPConn) (int, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	n, ierr := 0, error(nil)
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || ierr != nil {
		return 0, false
	}
	return n, true
}

// unsent reports whether c has data in its send queue that its peer's
// window has not let the kernel send yet (SIOCOUTQNSD). What is sent and
// not yet acknowledged does not count.
func unsent(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	n, ierr := 0, error(nil)
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQNSD) }); err != nil || ierr != nil {
		return false
	}
	return n > 0
}

// closedUnder reports whether c's connection has ended under it (TCP
// state CLOSE): a reset, or a keep-alive timeout. Meant for a socket that
// has just read EOF and was sent no FIN: then the EOF is its peer's FIN
// only if the state is CLOSE_WAIT. A write that found the reset first
// took its error (SO_ERROR), so that the read that follows says EOF.
func closedUnder(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var st uint8
	if err := rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			st = info.State
		}
	}); err != nil {
		return false
	}
	return st == unix.BPF_TCP_CLOSE
}
