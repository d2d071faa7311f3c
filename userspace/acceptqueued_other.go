//go:build !unix

package userspace

import (
	"net"
	"syscall"
)

// queuedConns would return drainQueued's next for ln; this system's
// listeners cannot accept without waiting, and closing one ends what it
// queued.
func queuedConns(syscall.Conn) func() (*net.TCPConn, bool) {
	return func() (*net.TCPConn, bool) { return nil, false }
}
