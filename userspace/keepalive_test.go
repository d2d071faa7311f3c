//go:build linux && !goroutines

package userspace

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestAcceptedConnectionsKeepAlive checks that both sides of a proxied
// connection have keep-alive on, so a vanished peer is noticed.
func TestAcceptedConnectionsKeepAlive(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	p := newTestProxier(t, Config{})
	name := spn("ka", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := <-accepted
	defer b.Close()
	var fds []int
	settle(t, "the connection is tracked", func() error {
		fds = p.connFDs()
		if len(fds) != 2 {
			return errorf("%d proxied sockets, want 2", len(fds))
		}
		return nil
	})
	for _, fd := range fds {
		on, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		idle, _ := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		nodelay, _ := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
		if on != 1 || idle != int(keepAlive.Idle.Seconds()) || nodelay != 1 {
			t.Errorf("socket %d: SO_KEEPALIVE=%d TCP_KEEPIDLE=%d TCP_NODELAY=%d, want 1, %v and 1", fd, on, idle, nodelay, keepAlive.Idle)
		}
	}
}
