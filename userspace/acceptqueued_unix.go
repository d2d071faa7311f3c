//go:build unix

package userspace

import (
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// queuedConns returns drainQueued's next for the listening socket ln: a
// connection queued on it, without waiting for one (Go's Accept would
// wait). Another goroutine may accept from ln meanwhile.
func queuedConns(ln syscall.Conn) func() (*net.TCPConn, bool) {
	rc, err := ln.SyscallConn()
	return func() (*net.TCPConn, bool) {
		if err != nil {
			return nil, false
		}
		for {
			nfd := -1
			var aerr error
			if rc.Control(func(fd uintptr) { nfd, aerr = acceptCloexec(int(fd)) }) != nil {
				return nil, false // closed
			}
			switch aerr {
			case nil:
			case unix.EINTR, unix.ECONNABORTED:
				continue // the next queued connection, if any
			default:
				return nil, false // EAGAIN: none is queued; or out of descriptors
			}
			f := os.NewFile(uintptr(nfd), "accepted")
			nc, err := net.FileConn(f) // a duplicate, non-blocking
			f.Close()
			if err != nil {
				return nil, false
			}
			return nc.(*net.TCPConn), true
		}
	}
}
