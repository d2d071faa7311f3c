//go:build linux

package userspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// finFirstConn is a proxied connection whose sender has sent its payload
// and FIN, had the proxy acknowledge all of it, and closed with a reset:
// what fail calls a failure after the FIN. The reader has read nothing
// yet. Its small receive buffer and segments (1000 bytes: the proxy's
// socket to it sizes its send buffer by the segment size, some 80 KB
// then, where the 64 KiB of loopback took 1 MiB and more) keep what does
// not fit in the proxy: in its pipe or its buffer, or unread in the
// sender's socket, beyond 120 KiB or so; with less, all of it waits
// unsent in the proxy's socket to the reader. Most of 200 KB or more is
// not acknowledged to the sender: the proxy's socket from it stops
// widening its window once the proxy stops reading.
type finFirstConn struct {
	p      *Proxier
	logs   *logBuffer
	reader *net.TCPConn
	// failed is when the sender's socket was reset: the proxy can only
	// find the failure later.
	failed time.Time
	// sockets and goroutines are the counts before the connection.
	sockets, goroutines int
}

func newFINFirstConn(t *testing.T, sender string, payload []byte) *finFirstConn {
	t.Helper()
	f := &finFirstConn{logs: captureLog(t, "4")}
	small := func(_, _ string, rc syscall.RawConn) error {
		// A small receive buffer and segments (see finFirstConn).
		return rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<10)
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, 1000)
		})
	}
	lc := net.ListenConfig{}
	if sender == "client" {
		lc.Control = small // the endpoint is the reader
	}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f.p = newTestProxier(t, Config{})
	name := spn("finfirst", "", state.TCP)
	mustApply(t, f.p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	f.sockets, f.goroutines = openSockets(t), runtime.NumGoroutine()
	accepted := make(chan *net.TCPConn, 1)
	go func() {
		defer close(accepted)
		if c, err := ln.Accept(); err == nil {
			accepted <- c.(*net.TCPConn)
		}
	}()
	d := net.Dialer{}
	if sender == "endpoint" {
		d.Control = small // the client is the reader
	}
	nc, err := d.Dial("tcp4", proxyAddr(t, f.p, name))
	if err != nil {
		t.Fatal(err)
	}
	client := nc.(*net.TCPConn)
	t.Cleanup(func() { client.Close() })
	var endpoint *net.TCPConn
	select {
	case endpoint = <-accepted:
		t.Cleanup(func() { endpoint.Close() })
	case <-time.After(5 * time.Second):
		t.Fatal("the endpoint got no connection")
	}
	sending := endpoint
	f.reader = client
	if sender == "client" {
		sending, f.reader = client, endpoint
	}
	if _, err := sending.Write(payload); err != nil {
		t.Fatal(err)
	}
	if err := sending.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := waitAcked(sending, 10*time.Second); err != nil {
		t.Fatalf("the proxy did not take the %s's %d bytes and FIN: %v", sender, len(payload), err)
	}
	sending.SetLinger(0)
	f.failed = time.Now()
	sending.Close()
	return f
}

// ended waits until the proxy counts no connection active and returns
// when it saw that.
func (f *finFirstConn) ended(t *testing.T, within time.Duration) time.Time {
	t.Helper()
	settleWithin(t, within, "the connection ends", func() error {
		if a := f.p.Stats().TCPActive.Load(); a != 0 {
			return fmt.Errorf("%d connections still active", a)
		}
		return nil
	})
	return time.Now()
}

// shortenFINDrainStall sets finDrainStall to d for the test.
func shortenFINDrainStall(t *testing.T, d time.Duration) {
	old := finDrainStall
	finDrainStall = d
	t.Cleanup(func() { finDrainStall = old })
}

// TestTCPFINFirstDrainReleasesStalledReader: a side that failed after its
// FIN has what it sent delivered without a deadline (see fail), but a
// reader that stops taking it, while its kernel answers the proxy's
// window probes, is reset once it has taken and acknowledged nothing for
// finDrainStall (shortened here), as the sender's kernel would have
// dropped its orphaned socket, and the connection's sockets and
// goroutines are released. Both builds held it for ever: a client that
// stops reading a response whose backend had finished kept two sockets,
// the proxy's pipes and (with -tags goroutines) two or three goroutines.
//
// With 128 KiB the proxy still holds some 50 KB of the payload (it waits
// for the reader's window to write more); with 16 KiB it has written all
// of it, and its FIN, to the reader's socket, where it waits unsent (see
// finFirstConn).
func TestTCPFINFirstDrainReleasesStalledReader(t *testing.T) {
	const stall = 2 * time.Second
	shortenFINDrainStall(t, stall)
	for _, size := range []int{128 << 10, 16 << 10} {
		for _, sender := range []string{"endpoint", "client"} {
			t.Run(fmt.Sprintf("%s/%d", sender, size), func(t *testing.T) {
				payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
				f := newFINFirstConn(t, sender, payload)
				// The goroutine build finds the failure while a write to
				// the reader waits only at its stallCheck (5 s).
				end := f.ended(t, 5*time.Second+stall+10*time.Second)
				if d := end.Sub(f.failed); d < stall {
					t.Errorf("the connection ended %v after the sender's reset, before finDrainStall (%v)", d, stall)
				}
				if n := f.p.Stats().HalfCloseTimeouts.Load(); n != 1 {
					t.Errorf("HalfCloseTimeouts = %d, want 1", n)
				}
				klog.Flush()
				reader := map[string]string{"endpoint": "client", "client": "endpoint"}[sender]
				want := fmt.Sprintf("the %s reset the connection after its FIN; then the %s took nothing for %v", sender, reader, stall)
				if line := f.logs.lineWith(`"Connection ended"`); !strings.Contains(line, "reset=true") || !strings.Contains(line, want) {
					t.Errorf("ended with %q, want a reset with the reason %q", line, want)
				}
				// The reader was reset: it reads what its socket held, then
				// the reset, not the whole payload and EOF.
				got, err := readUntilError(f.reader)
				if !isReset(err) || len(got) >= size || !bytes.Equal(got, payload[:len(got)]) {
					t.Errorf("the %s then read %d of %d bytes (intact: %v) and %v, want a part and a reset", reader, len(got), size, bytes.Equal(got, payload[:min(len(got), size)]), err)
				}
				f.reader.Close()
				noLeaks(t, f.sockets, f.goroutines)
			})
		}
	}
}

// TestTCPFINFirstDrainKeepsSlowReader: a reader that takes what a side
// sent before its FIN and failure slowly, but steadily, reads all of it
// and its EOF however long that takes: finDrainStall counts from the
// reader's last progress, not from the failure.
func TestTCPFINFirstDrainKeepsSlowReader(t *testing.T) {
	const stall = time.Second
	shortenFINDrainStall(t, stall)
	const size = 128 << 10
	payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	for _, sender := range []string{"endpoint", "client"} {
		t.Run(sender, func(t *testing.T) {
			f := newFINFirstConn(t, sender, payload)
			// At most 1 KiB every 20 ms, 50 KB/s: 2.6 s or more for all of
			// it, more than twice finDrainStall.
			start := time.Now()
			got, err := readSlowly(f.reader, 1<<10, 20*time.Millisecond, 30*time.Second)
			took := time.Since(start)
			if len(got) != size || !bytes.Equal(got, payload) || err != nil {
				t.Fatalf("the reader read %d of %d bytes (intact: %v) in %v, then %v; want all of them and EOF", len(got), size, bytes.Equal(got, payload[:min(len(got), size)]), took.Round(time.Millisecond), err)
			}
			if n := f.p.Stats().HalfCloseTimeouts.Load(); n != 0 {
				t.Errorf("HalfCloseTimeouts = %d, want 0", n)
			}
			f.reader.Close()
			f.ended(t, 10*time.Second)
			noLeaks(t, f.sockets, f.goroutines)
		})
	}
}

// TestTCPResetAfterFINReaderPausesPastStallCheck: a reader that pauses
// for longer than the goroutine build's stallCheck (5 s) before it takes
// what a side sent before its FIN and its reset still gets all of it and
// the EOF. The goroutine build found that reset while its write to the
// reader waited, and took it for a reset before the FIN (the socket's
// error is EPIPE there, which only a reset after the FIN leaves): it
// reset the reader 2 s (resetDrain) later, with what it still held, and
// the client read 4,940 of 131,072 bytes. TestTCPResetAfterFINDoesNotCutDelivery's reader starts within
// stallCheck, and its 1 MiB fits in the proxy's socket to the reader on
// this kernel, so the write does not wait.
func TestTCPResetAfterFINReaderPausesPastStallCheck(t *testing.T) {
	const size = 128 << 10
	payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	f := newFINFirstConn(t, "endpoint", payload)
	time.Sleep(5*time.Second + resetDrain + time.Second) // the reader's pause, not a wait for the proxy
	got, err := readUntilError(f.reader)
	if len(got) != size || !bytes.Equal(got, payload) || err != nil {
		t.Fatalf("the client read %d of %d bytes (intact: %v), then %v; want all of them and EOF", len(got), size, bytes.Equal(got, payload[:min(len(got), size)]), err)
	}
	f.reader.Close()
	f.ended(t, 10*time.Second)
	noLeaks(t, f.sockets, f.goroutines)
}

// readSlowly reads c, at most chunk bytes every pause, until EOF or an
// error, within limit.
func readSlowly(c net.Conn, chunk int, pause, limit time.Duration) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(limit))
	var got bytes.Buffer
	buf := make([]byte, chunk)
	for {
		n, err := c.Read(buf)
		got.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			return got.Bytes(), nil
		}
		if err != nil {
			return got.Bytes(), err
		}
		time.Sleep(pause) // the reader's pace, not a wait for the proxy
	}
}
