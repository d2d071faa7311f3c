//go:build linux

package userspace

import (
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestTCPClientResetReachesStalledEndpoint: a client that resets while its
// data waits for an endpoint that reads nothing has its reset passed on,
// and the connection ends. The proxy used to notice only when the
// endpoint read again, so a stalled endpoint kept the connection, its
// descriptors and pipes for ever.
func TestTCPClientResetReachesStalledEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *net.TCPConn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c.(*net.TCPConn) // and never read from it
		}
	}()
	p := newTestProxier(t, Config{})
	name := spn("stalled", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var backend *net.TCPConn
	select {
	case backend = <-accepted:
		defer backend.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the endpoint got no connection")
	}
	// Fill every buffer on the way until the client can send no more.
	chunk := make([]byte, 64<<10)
	sent := 0
	for sent < 256<<20 {
		c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := c.Write(chunk)
		sent += n
		if err != nil {
			break // blocked (the deadline), or failed
		}
	}
	if sent >= 256<<20 {
		t.Fatal("the client never blocked: the proxy reads without bound")
	}
	c.(*net.TCPConn).SetLinger(0)
	c.Close() // a reset

	// The endpoint's socket is reset (TCP_CLOSE) without reading a byte.
	rc, err := backend.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	// The event loops see the reset at once; the goroutine build when its
	// stalled write next looks at the client (stallCheck there).
	const stallLimit = 10 * time.Second
	deadline := time.Now().Add(stallLimit)
	for {
		var state uint8
		rc.Control(func(fd uintptr) {
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				state = info.State
			}
		})
		if state == unix.BPF_TCP_CLOSE {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the endpoint's connection is in TCP state %d %v after the client's reset, want closed by a reset", state, stallLimit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	settle(t, "the connection no longer active", func() error {
		if a := p.Stats().TCPActive.Load(); a != 0 {
			return errors.New("the connection is still counted active")
		}
		return nil
	})
}
