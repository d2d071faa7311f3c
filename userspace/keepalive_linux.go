//go:build linux

package userspace

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenConfig sets keep-alive on the listening socket once: Linux copies
// SO_KEEPALIVE and TCP_KEEPIDLE to every accepted socket (tcp_create_openreq_child
// clones them), which saves two setsockopt calls per connection.
func listenConfig() net.ListenConfig {
	return net.ListenConfig{
		KeepAlive: -1, // do not set it again on each accepted connection
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1); serr != nil {
					return
				}
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(keepAlive.Idle.Seconds()))
			})
			if err != nil {
				return err
			}
			return serr
		},
	}
}
