//go:build linux

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
	var conns []*net.TCPConn
	settle(t, "the connection is tracked", func() error {
		p.connMu.Lock()
		defer p.connMu.Unlock()
		conns = conns[:0]
		for tc := range p.conns {
			conns = append(conns, tc.client, tc.backend)
		}
		if len(conns) != 2 {
			return errorf("%d proxied sockets tracked, want 2", len(conns))
		}
		return nil
	})
	for _, pc := range conns {
		rc, _ := pc.SyscallConn()
		var on, idle int
		rc.Control(func(fd uintptr) {
			on, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
			idle, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		})
		if on != 1 || idle != int(keepAlive.Idle.Seconds()) {
			t.Errorf("socket %v: SO_KEEPALIVE=%d TCP_KEEPIDLE=%d, want 1 and %v", pc.LocalAddr(), on, idle, keepAlive.Idle)
		}
	}
}
