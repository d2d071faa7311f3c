//go:build unix

package userspace

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// connectEnded reports whether the kernel has finished the connect of
// rc's socket, which was sent non-blocking (see fdConnectEnded). A socket
// already closed has ended too: its dial returned.
func connectEnded(rc syscall.RawConn) bool {
	ended := true
	_ = rc.Control(func(fd uintptr) { ended = fdConnectEnded(int(fd)) })
	return ended
}

// fdConnectEnded reports whether the kernel has finished the
// non-blocking connect of the socket fd, with one poll that does not
// wait: the socket polls writable once connected, and with an error
// (POLLERR) once refused or unreachable; while the handshake is under
// way (SYN_SENT) it polls neither (Linux's tcp_poll). Where poll fails,
// the connect counts as unfinished.
func fdConnectEnded(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents != 0
}
