//go:build !linux

package userspace

import "net"

// unacked would return how many bytes written to c its peer has not
// acknowledged yet; this system does not say (Linux's SIOCOUTQ), so a
// connection one side of which failed resets the other side once it has
// written it all that the failed side sent, and what the other side had
// not acknowledged by then may be lost.
func unacked(*net.TCPConn) (int, bool) { return 0, false }

// unsent would report whether c has data in its send queue that its
// peer's window has not let the kernel send yet; this system does not say
// (Linux's SIOCOUTQNSD), so a half-closed connection whose answer waits
// there for a paused reader is taken for silent.
func unsent(*net.TCPConn) bool { return false }

// closedUnder would report whether c's connection has ended under it (a
// reset); this system does not say (Linux's TCP_INFO state), so an EOF
// read after a write to c found the reset is taken for its peer's FIN,
// until the failed write says otherwise.
func closedUnder(*net.TCPConn) bool { return false }
