//go:build unix && (!linux || goroutines)

package userspace

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// socketError returns the pending error of c's socket (SO_ERROR, which
// reading it clears): ECONNRESET once its peer reset it. Nil if none.
func socketError(c *net.TCPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var soErr int
	var gerr error
	if err := rc.Control(func(fd uintptr) { soErr, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR) }); err != nil {
		return err
	}
	if gerr != nil {
		return gerr
	}
	if soErr != 0 {
		return syscall.Errno(soErr)
	}
	return nil
}
