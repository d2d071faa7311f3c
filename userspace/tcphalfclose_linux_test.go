//go:build linux

package userspace

import (
	"bytes"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestTCPHalfCloseWaitsForQueuedAnswer: as TestTCPHalfCloseWaitsForSlowReader,
// but the answer is small enough that the proxy has written all of it into
// the client's socket, where it waits unsent for the paused reader's
// window (a 4 KiB receive buffer). The proxy holds nothing itself, and the
// endpoint is silent, yet the connection is not: the timeout must not
// reset it and discard the queued answer. Both builds used to.
func TestTCPHalfCloseWaitsForQueuedAnswer(t *testing.T) {
	const timeout = 300 * time.Millisecond
	answer := bytes.Repeat([]byte("fedcba9876543210"), 256<<10/16)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	release := make(chan struct{})
	defer close(release)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil { // the request, to its FIN
			return
		}
		if _, err := c.Write(answer); err != nil {
			return
		}
		<-release // silent, and open, until the test ends
	}()
	p := newTestProxier(t, Config{TCPHalfCloseTimeout: timeout})
	name := spn("queued", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * timeout) // a reader that has paused, past the timeout
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, len(answer))
	if n, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("the client read %d of %d bytes and then %v, want all of them (half-close timeouts: %d)", n, len(answer), err, p.Stats().HalfCloseTimeouts.Load())
	}
	if !bytes.Equal(got, answer) {
		t.Fatal("the answer arrived changed")
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !isReset(err) || time.Since(start) > 5*time.Second {
		t.Fatalf("after the answer, with the endpoint silent, the client read %v after %v, want a reset within the timeout", err, time.Since(start))
	}
	if n := p.Stats().HalfCloseTimeouts.Load(); n != 1 {
		t.Fatalf("half-close timeouts = %d, want 1", n)
	}
}
