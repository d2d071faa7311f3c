package sctp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp/sctptest"
)

// TestSCTPEcho: an association over IPv4 and IPv6 loopback, messages both
// ways, addresses as the kernel sees them.
func TestSCTPEcho(t *testing.T) {
	sctptest.Require(t)
	for _, host := range []string{"127.0.0.1", "::1"} {
		t.Run(host, func(t *testing.T) {
			b := sctptest.StartBackend(t, "b", netip.AddrPortFrom(netip.MustParseAddr(host), 0))
			c := sctptest.Dial(t, b.Addr, sctp.Options{})
			got, _, err := sctptest.Ask(c, []byte("hello"), sctp.Info{})
			if err != nil || string(got) != "hello" {
				t.Fatalf("echo: %q, %v", got, err)
			}
			if c.RemoteAddr() != b.Addr || c.LocalAddr().Addr() != b.Addr.Addr() {
				t.Errorf("addresses: local %s remote %s, backend %s", c.LocalAddr(), c.RemoteAddr(), b.Addr)
			}
			// Byte-stream use: Write is one message, Read reads its bytes.
			if _, err := c.Write([]byte("stream")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			n, err := io.ReadFull(c, buf[:6])
			if err != nil || string(buf[:n]) != "stream" {
				t.Fatalf("read: %q, %v", buf[:n], err)
			}
		})
	}
}

// TestSCTPMessagesKeepBoundariesStreamsAndPPID: sizes from one byte to
// larger than a socket buffer arrive as whole, separate messages with their
// stream ids, PPIDs and unordered flag.
func TestSCTPMessagesKeepBoundariesStreamsAndPPID(t *testing.T) {
	sctptest.Require(t)
	ln, err := sctp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), sctp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := sctptest.Dial(t, ln.Addr(), sctp.Options{OutStreams: 20, SendBuffer: 1 << 20})
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetDeadline(time.Now().Add(30 * time.Second))
	in, out, err := s.Streams()
	if err != nil || in != 20 {
		t.Fatalf("server streams in %d out %d (%v); want 20 in", in, out, err)
	}
	msgs := []struct {
		size int
		info sctp.Info
	}{
		{1, sctp.Info{Stream: 0, PPID: 46}},
		{1000, sctp.Info{Stream: 7, PPID: 0x3c000000}},
		{300_000, sctp.Info{Stream: 19, PPID: 60}},
		{2, sctp.Info{Stream: 3, PPID: 1, Unordered: true}},
	}
	go func() {
		for i, m := range msgs {
			if _, err := c.WriteMsg(bytes.Repeat([]byte{byte('a' + i)}, m.size), m.info); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
		}
	}()
	buf := make([]byte, 1<<20)
	for i, m := range msgs {
		n, info, err := s.ReadMsg(buf)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if n != m.size || !bytes.Equal(buf[:n], bytes.Repeat([]byte{byte('a' + i)}, m.size)) {
			t.Fatalf("message %d: %d bytes, want %d of %q", i, n, m.size, rune('a'+i))
		}
		if info != m.info {
			t.Errorf("message %d: info %+v, want %+v", i, info, m.info)
		}
	}
	// A message longer than the buffer is reported, not split silently.
	if _, err := c.WriteMsg(make([]byte, 100), sctp.Info{}); err != nil {
		t.Fatal(err)
	}
	if n, _, err := s.ReadMsg(buf[:10]); !errors.Is(err, sctp.ErrMessageTooLong) || n != 10 {
		t.Errorf("short buffer: %d, %v; want 10, ErrMessageTooLong", n, err)
	}
}

// TestSCTPPollerSemantics: read deadlines, Close unblocking Accept and a
// blocked read, and EOF after the peer closes.
func TestSCTPPollerSemantics(t *testing.T) {
	sctptest.Require(t)
	ln, err := sctp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), sctp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := sctptest.Dial(t, ln.Addr(), sctp.Options{})
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, _, err := s.ReadMsg(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past deadline: %v", err)
	}
	s.SetReadDeadline(time.Time{})

	done := make(chan error, 1)
	go func() { _, _, err := s.ReadMsg(make([]byte, 10)); done <- err }()
	c.Close()
	select {
	case err := <-done:
		if err != io.EOF {
			t.Fatalf("read after the peer closed: %v, want EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("read did not see the peer's shutdown")
	}
	s.Close()

	acc := make(chan error, 1)
	go func() { _, err := ln.Accept(); acc <- err }()
	time.Sleep(20 * time.Millisecond)
	ln.Close()
	select {
	case err := <-acc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("accept after close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Accept")
	}
}

// TestSCTPDialFailures: a closed port is refused at once; a cancelled
// context ends a dial.
func TestSCTPDialFailures(t *testing.T) {
	sctptest.Require(t)
	ln, err := sctp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), sctp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr()
	ln.Close()
	start := time.Now()
	_, err = sctp.Dial(context.Background(), addr, sctp.Options{})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to a closed port: %v, want ECONNREFUSED", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refusal took %s", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := sctp.Dial(ctx, addr, sctp.Options{}); err == nil {
		t.Fatal("dial with a cancelled context succeeded")
	}
}
