//go:build linux

package userspace

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

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
	// The event loops pass it on once the endpoint has had resetDrain to
	// take what the client sent before it (it takes nothing here); the
	// goroutine build finds the reset when its stalled write next looks at
	// the client (stallCheck there), and passes it on resetDrain later.
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

// TestTCPResetAfterHalfClose: a side that sent its FIN and then resets has
// its reset passed on at once, while the other side, which has not
// finished, is silent. The goroutine build used to stop looking at a side
// once it had passed its FIN on, so the other side kept working for a peer
// that was gone until it next sent something, or until
// --tcp-half-close-timeout (5 minutes) passed.
func TestTCPResetAfterHalfClose(t *testing.T) {
	for _, resetter := range []string{"client", "endpoint"} {
		t.Run(resetter, func(t *testing.T) {
			logs := captureLog(t, "4")
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan *net.TCPConn, 1)
			go func() {
				c, err := ln.Accept()
				if err == nil {
					accepted <- c.(*net.TCPConn)
				}
			}()
			p := newTestProxier(t, Config{})
			name := spn("halfreset", "", state.TCP)
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
			nc, err := net.Dial("tcp4", proxyAddr(t, p, name))
			if err != nil {
				t.Fatal(err)
			}
			client := nc.(*net.TCPConn)
			defer client.Close()
			var endpoint *net.TCPConn
			select {
			case endpoint = <-accepted:
				defer endpoint.Close()
			case <-time.After(5 * time.Second):
				t.Fatal("the endpoint got no connection")
			}

			// The resetter sends a little and its FIN; once the other side has
			// read that FIN (so the proxy has passed it on), the resetter gives
			// up with a reset. The other side stays silent throughout.
			resetting, other := client, endpoint
			if resetter == "endpoint" {
				resetting, other = endpoint, client
			}
			if _, err := resetting.Write([]byte("req")); err != nil {
				t.Fatal(err)
			}
			if err := resetting.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			other.SetReadDeadline(time.Now().Add(5 * time.Second))
			if got, err := io.ReadAll(other); err != nil || string(got) != "req" {
				t.Fatalf("the %s's request arrived as %q, %v; want req and its FIN", resetter, got, err)
			}
			resetting.SetLinger(0)
			resetting.Close()

			// The other side's socket is reset (TCP_CLOSE) without sending a
			// byte. The kernel's own NAT and the event loops do it at once.
			const limit = 3 * time.Second
			deadline := time.Now().Add(limit)
			for {
				st := tcpState(t, other)
				if st == unix.BPF_TCP_CLOSE {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the silent side is in TCP state %d %v after the %s's reset, want closed by a reset", st, limit, resetter)
				}
				time.Sleep(20 * time.Millisecond)
			}
			settle(t, "the reset is logged", func() error {
				klog.Flush()
				line := logs.lineWith(`"Connection ended"`)
				if want := `reset=true reason="the ` + resetter + ` reset the connection"`; !strings.Contains(line, want) {
					return fmt.Errorf("got %q, want %s", line, want)
				}
				if a := p.Stats().TCPActive.Load(); a != 0 {
					return fmt.Errorf("%d connections still active", a)
				}
				return nil
			})
		})
	}
}

// tcpState returns the kernel's TCP state of c (unix.BPF_TCP_*).
func tcpState(t *testing.T, c *net.TCPConn) uint8 {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var st uint8
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		if info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); ierr == nil {
			st = info.State
		}
	}); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatal(ierr)
	}
	return st
}
