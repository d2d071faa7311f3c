package userspace

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestTCPFailoverStopsAtItsLastAttempt: with more endpoints that refuse
// than DialTimeouts has attempts, a connection makes len(DialTimeouts)
// attempts, no more, and is reset; the proxy goes on serving. Four
// refusing endpoints and two attempts: two dial failures and one give-up.
// An attempt past the last (dialing a third endpoint with
// DialTimeouts[2]) panicked the event loop, index out of range.
func TestTCPFailoverStopsAtItsLastAttempt(t *testing.T) {
	live := startTCPBackend(t, "live")
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{5 * time.Second, 5 * time.Second}})
	dead := spn("dead", "", state.TCP)
	alive := spn("alive", "", state.TCP)
	mustApply(t, p,
		state.ServicePort{Name: dead, Port: 80, ClusterEndpoints: eps(deadAddr(t), deadAddr(t), deadAddr(t), deadAddr(t))},
		state.ServicePort{Name: alive, Port: 81, ClusterEndpoints: eps(live.addr())})
	if err := connectAndRead(proxyAddr(t, p, dead)); !isReset(err) {
		t.Fatalf("connection to a service whose endpoints all refuse: %v, want a reset", err)
	}
	settle(t, "the connection is given up", func() error {
		if n := p.Stats().TCPDialGiveUps.Load(); n != 1 {
			return fmt.Errorf("%d give-ups, want 1", n)
		}
		return nil
	})
	if n := p.Stats().TCPDialFailures.Load(); n != 2 {
		t.Fatalf("%d dial failures, want 2: one for each of the 2 DialTimeouts", n)
	}
	if got := tcpWho(t, proxyAddr(t, p, alive)); got != "live" {
		t.Fatalf("after the give-up, the live service reached %q", got)
	}
}

// TestTCPByteCountersByDirection: BytesToBackend counts what the client
// sent to the endpoint, BytesToClient what came back, each on its own: an
// exchange of 5 bytes out and 7 back.
func TestTCPByteCountersByDirection(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 5)); err != nil {
			return
		}
		c.Write([]byte("7 bytes"))
	}()
	p := newTestProxier(t, Config{})
	name := spn("count", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("5byte")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "7 bytes" {
		t.Fatalf("the client read %q, %v; want %q and EOF", got, err, "7 bytes")
	}
	// The counters are added after the writes they count.
	settle(t, "both directions are counted", func() error {
		if s := p.Stats().Snapshot(); s.BytesToBackend+s.BytesToClient != 12 {
			return fmt.Errorf("%d bytes to the endpoint and %d to the client, want 12 in all", s.BytesToBackend, s.BytesToClient)
		}
		return nil
	})
	if s := p.Stats().Snapshot(); s.BytesToBackend != 5 || s.BytesToClient != 7 {
		t.Fatalf("%d bytes to the endpoint and %d to the client, want 5 and 7", s.BytesToBackend, s.BytesToClient)
	}
}

// TestTCPHalfCloseTrickleIsNotSilence: after the client's FIN, an endpoint
// that goes on sending, a byte at a time, with gaps far shorter than
// TCPHalfCloseTimeout, for several times that timeout, is not silent:
// each byte it sends starts the timeout again, so the client reads all of
// them, and then the endpoint's EOF, and no half-close timeout is
// counted. When the bytes moved did not count as progress, the
// connection was reset one timeout after the FIN, as if silent.
func TestTCPHalfCloseTrickleIsNotSilence(t *testing.T) {
	const (
		timeout = time.Second
		gap     = 100 * time.Millisecond // stretched by a loaded machine, still far below timeout
		sent    = 25                     // 2.5 s of trickle: 2.5 timeouts
	)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
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
		for range sent {
			if _, err := c.Write([]byte{'.'}); err != nil {
				return
			}
			time.Sleep(gap) // the pace of the trickle, not a synchronisation
		}
	}()
	p := newTestProxier(t, Config{TCPHalfCloseTimeout: timeout})
	name := spn("trickle", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
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
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{'.'}, sent)) {
		t.Fatalf("the client read %d bytes and then %v; want %d and EOF (half-close timeouts: %d)",
			len(got), err, sent, p.Stats().HalfCloseTimeouts.Load())
	}
	if n := p.Stats().HalfCloseTimeouts.Load(); n != 0 {
		t.Fatalf("%d half-close timeouts, want 0", n)
	}
}
