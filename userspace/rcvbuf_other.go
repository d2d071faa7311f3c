//go:build unix && !linux

package userspace

import "golang.org/x/sys/unix"

// growRcvBuf asks for frontendRcvBuf on a UDP service socket; the system
// may cap or refuse it, which leaves its default.
func growRcvBuf(fd int) {
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, frontendRcvBuf)
}
