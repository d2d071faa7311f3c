//go:build unix && (!linux || goroutines)

package userspace

import (
	"net"
	"runtime"
	"syscall"
	"time"

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

// awaitSocketError waits until c's socket has a pending error (a reset, a
// keep-alive timeout) and returns it, or returns nil once c is closed.
// Meant for a socket that has reached EOF and is read no more: it parks in
// Go's poller and costs no descriptor and no timer.
//
// It relies on the poller being edge-triggered (epoll with EPOLLET,
// kqueue with EV_CLEAR), so that a socket at EOF, readable for good, wakes
// it only when something new happens to the socket (the reset, or at most
// the send buffer draining, after which it waits again). Solaris's event
// ports and AIX's poll report such a socket ready at once every time;
// there it returns nil at once, and a reset is noticed as before, when the
// other direction next writes to c.
func awaitSocketError(c *net.TCPConn) error {
	_ = c.SetReadDeadline(time.Time{})
	return waitSocketError(c)
}

// waitSocketError is awaitSocketError without clearing c's read
// deadline first: a deadline that passes makes it return nil, which is
// how a dial race stops watching its client (see tcpClientWatch).
func waitSocketError(c *net.TCPConn) error {
	switch runtime.GOOS {
	case "linux", "android", "darwin", "ios", "dragonfly", "freebsd", "netbsd", "openbsd":
	default:
		return nil
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return nil // closed already
	}
	var failed error
	err = rc.Read(func(fd uintptr) bool {
		soErr, gerr := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case gerr != nil:
			failed = gerr
		case soErr != 0:
			failed = syscall.Errno(soErr)
		default:
			return false // nothing yet: wait for the poller's next word
		}
		return true
	})
	if err != nil {
		return nil // c was closed: the connection ended
	}
	return failed
}
