//go:build unix

package userspace

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// connectEnded reports whether the kernel has finished the connect of
// rc's socket, which was sent non-blocking: the socket polls writable
// once connected, and with an error (POLLERR) once refused or
// unreachable; while the handshake is under way (SYN_SENT) it polls
// neither (Linux's tcp_poll). A socket already closed has ended too: its
// dial returned. Where poll fails, the connect counts as unfinished.
func connectEnded(rc syscall.RawConn) bool {
	ended := true
	_ = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, 0)
		ended = err == nil && n > 0 && fds[0].Revents != 0
	})
	return ended
}
