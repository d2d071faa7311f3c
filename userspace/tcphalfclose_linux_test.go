//go:build linux

package userspace

import (
	"bytes"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTCPHalfCloseWaitsForQueuedAnswer: as TestTCPHalfCloseWaitsForSlowReader,
// but the answer is small enough that the proxy has written all of it into
// the client's socket, where it waits unsent for the paused reader's
// window (a 4 KiB receive buffer). The proxy holds nothing itself, and the
// endpoint is silent, yet the connection is not: the timeout must not
// reset it and discard the queued answer. Both builds used to.
func TestTCPHalfCloseWaitsForQueuedAnswer(t *testing.T) {
	d := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	halfCloseWaitsForPausedReader(t, bytes.Repeat([]byte("fedcba9876543210"), 256<<10/16), d)
}
