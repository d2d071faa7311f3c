//go:build linux && !goroutines

package userspace

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// tcpOpts are the options of a proxied socket that the proxy sets.
type tcpOpts struct{ keepAlive, keepIdle, noDelay int }

func tcpOptsOf(fd int) tcpOpts {
	var o tcpOpts
	o.keepAlive, _ = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE)
	o.keepIdle, _ = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
	o.noDelay, _ = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
	return o
}

var allOpts = tcpOpts{keepAlive: 1, keepIdle: int(keepAlive.Idle.Seconds()), noDelay: 1}

// proxiedSockets starts a connection through a proxy to a backend of its
// own, and returns the client's end, the backend's end, and the proxy's
// two sockets: the one it accepted and the one it dialed.
func proxiedSockets(t *testing.T) (c, b net.Conn, accepted, dialed int) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	backends := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			backends <- c
		}
	}()
	backend := ln.Addr().(*net.TCPAddr).AddrPort()
	p := newTestProxier(t, Config{})
	name := spn("ka", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(backend)})
	c, err = net.Dial("tcp", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b = <-backends
	t.Cleanup(func() { b.Close() })
	settle(t, "the connection is tracked", func() error {
		accepted, dialed = -1, -1
		fds := p.connFDs()
		if len(fds) != 2 {
			return errorf("%d proxied sockets, want 2", len(fds))
		}
		for _, fd := range fds {
			sa, err := unix.Getpeername(fd)
			if err != nil {
				return err
			}
			if in4, ok := sa.(*unix.SockaddrInet4); ok && netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)) == backend {
				dialed = fd
			} else {
				accepted = fd
			}
		}
		if dialed < 0 || accepted < 0 {
			return errorf("sockets %v: not one to the backend %v and one from the client", fds, backend)
		}
		return nil
	})
	return c, b, accepted, dialed
}

// send writes msg from one end and reads it whole at the other.
func send(t *testing.T, from, to net.Conn, msg []byte) {
	t.Helper()
	if _, err := from.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	_ = to.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(to, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got %d bytes other than the %d sent", len(got), len(msg))
	}
}

// TestProxiedSocketsKeepAliveAndNoDelay checks that both sockets of a
// proxied connection get keep-alive, so a vanished peer is noticed, and
// TCP_NODELAY, so what arrives is passed on at once. The accepted socket
// has them from the start, from its listener. The dialed one gets
// TCP_NODELAY before its second write, and keep-alive once the connection
// has lived keepAliveAfter: a short connection is spared the calls.
func TestProxiedSocketsKeepAliveAndNoDelay(t *testing.T) {
	start := time.Now()
	c, b, accepted, dialed := proxiedSockets(t)
	if got := tcpOptsOf(accepted); got != allOpts {
		t.Errorf("accepted socket: %+v, want %+v", got, allOpts)
	}
	send(t, c, b, []byte("first"))
	send(t, b, c, []byte("reply"))
	got := tcpOptsOf(dialed)
	if got.noDelay != 0 {
		t.Errorf("dialed socket after one small write: TCP_NODELAY=%d, want 0 (set late)", got.noDelay)
	}
	if time.Since(start) < keepAliveAfter/2 && got.keepAlive != 0 {
		t.Errorf("dialed socket %v after it connected: SO_KEEPALIVE=%d, want 0 until %v", time.Since(start), got.keepAlive, keepAliveAfter)
	}
	send(t, c, b, []byte("second"))
	if got := tcpOptsOf(dialed); got.noDelay != 1 {
		t.Errorf("dialed socket after its second write: TCP_NODELAY=%d, want 1", got.noDelay)
	}
	settleWithin(t, keepAliveAfter+5*time.Second, "keep-alive on the dialed socket", func() error {
		if got := tcpOptsOf(dialed); got != allOpts {
			return errorf("dialed socket: %+v, want %+v", got, allOpts)
		}
		return nil
	})
	send(t, b, c, []byte("still proxied"))
}

// TestBigFirstWriteSetsNoDelay: a first write to the endpoint bigger than
// one segment gets TCP_NODELAY before it, or Nagle's algorithm could hold
// its tail back until the rest is acknowledged.
func TestBigFirstWriteSetsNoDelay(t *testing.T) {
	c, b, _, dialed := proxiedSockets(t)
	send(t, c, b, bytes.Repeat([]byte("x"), oneSegment+1))
	if got := tcpOptsOf(dialed); got.noDelay != 1 {
		t.Errorf("dialed socket after a first write of %d bytes: TCP_NODELAY=%d, want 1", oneSegment+1, got.noDelay)
	}
}

// TestKeepAliveWhenHalfClosedEarly: an endpoint that sends and
// half-closes in the connection's first second leaves it half-closed,
// waiting for the client, with the endpoint's socket in CLOSE_WAIT.
// Keep-alive still goes on that socket once the connection has lived
// keepAliveAfter, so an endpoint that vanishes meanwhile is found
// (TestBinaryKeepAliveAfterFINDoesNotCutDelivery follows that through).
func TestKeepAliveWhenHalfClosedEarly(t *testing.T) {
	c, b, _, dialed := proxiedSockets(t)
	if _, err := b.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	if err := b.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c) // to the EOF: the proxy passed the FIN on
	if err != nil || string(got) != "reply" {
		t.Fatalf("the client read %q, then %v; want \"reply\" and EOF", got, err)
	}
	settleWithin(t, keepAliveAfter+5*time.Second, "keep-alive on the dialed socket of the half-closed connection", func() error {
		if got := tcpOptsOf(dialed); got.keepAlive != 1 || got.keepIdle != allOpts.keepIdle {
			return errorf("dialed socket: %+v, want keep-alive on with an idle time of %d s", got, allOpts.keepIdle)
		}
		return nil
	})
	send(t, c, b, []byte("the client still sends"))
}
