package userspace

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestTCPHalfCloseWaitsForSlowReader: --tcp-half-close-timeout bounds a
// half-closed connection that is silent, not one whose data waits for a
// reader that has paused. The client sends its request and FIN, stops
// reading for longer than the timeout while the endpoint's answer, held
// back by flow control, waits in the proxy, and then reads all of it. The
// event loops used to count the pause as silence and reset the
// connection after the first 128 KB; the goroutine build waited. Once the
// answer is delivered and the endpoint stays silent, the bound applies
// again, in both builds.
func TestTCPHalfCloseWaitsForSlowReader(t *testing.T) {
	halfCloseWaitsForPausedReader(t, bytes.Repeat([]byte("0123456789abcdef"), 20<<20/16), &net.Dialer{})
}

// halfCloseWaitsForPausedReader runs a client, dialed with d, that sends
// its request and FIN, pauses past the half-close timeout while the
// endpoint's answer waits, then reads all of it, and then is reset once
// the endpoint stays silent.
func halfCloseWaitsForPausedReader(t *testing.T, answer []byte, d *net.Dialer) {
	t.Helper()
	const timeout = 300 * time.Millisecond
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
	name := spn("slow", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
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
