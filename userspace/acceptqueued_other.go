//go:build !unix

package userspace

import "net"

// tcpQueued would return drainQueued's next for ln; this system's
// listeners cannot accept without waiting, and closing one ends what it
// queued.
func tcpQueued(*net.TCPListener) func() (*net.TCPConn, bool) {
	return func() (*net.TCPConn, bool) { return nil, false }
}
