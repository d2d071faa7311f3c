//go:build !unix

package userspace

import "net"

// socketError would return the pending error of c's socket; this system
// gets none, so a stalled write goes on waiting for its destination.
func socketError(*net.TCPConn) error { return nil }

// awaitSocketError would wait for a pending error on c's socket; this
// system cannot wait for one (on Windows the zero-byte read Go's poller
// waits with completes at once on a socket at EOF), so it returns nil at
// once, and a reset is noticed when the other direction next writes to c.
func awaitSocketError(*net.TCPConn) error { return nil }

// waitSocketError is awaitSocketError without clearing c's read deadline
// first; here it returns nil at once as well.
func waitSocketError(*net.TCPConn) error { return nil }
