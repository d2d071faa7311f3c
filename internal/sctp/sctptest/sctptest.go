//go:build linux

// Package sctptest has what SCTP tests share: the rule for when they skip,
// and SCTP backends that echo messages.
package sctptest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp"
)

// Require skips the test when this kernel has no SCTP, unless
// SCTP_REQUIRED=1 (as in the test VM of `make test-sctp`), where it fails:
// a VM without SCTP must not pass by skipping.
func Require(t testing.TB) {
	t.Helper()
	if err := sctp.Available(); err != nil {
		if os.Getenv("SCTP_REQUIRED") == "1" {
			t.Fatalf("SCTP_REQUIRED=1 but this kernel has no SCTP: %v", err)
		}
		t.Skipf("this kernel has no SCTP (%v); `make test-sctp` runs these tests in a VM that has", err)
	}
}

// Who is the message a Backend answers with its name instead of echoing.
const Who = "who?"

// Backend is an SCTP server that answers every message with the same bytes
// on the same stream with the same PPID and ordering, except Who, which it
// answers with its name. It serves until the test ends.
type Backend struct {
	Name string
	Addr netip.AddrPort
	// Accepted counts associations accepted.
	Accepted atomic.Int64

	ln *sctp.Listener
	wg sync.WaitGroup
}

// StartBackend starts a Backend on addr (port 0: any free port).
func StartBackend(t testing.TB, name string, addr netip.AddrPort) *Backend {
	t.Helper()
	ln, err := sctp.Listen(addr, sctp.Options{OutStreams: 64, SendBuffer: 4 << 20})
	if err != nil {
		t.Fatalf("backend %s: %v", name, err)
	}
	b := &Backend{Name: name, Addr: ln.Addr(), ln: ln}
	b.wg.Add(1)
	go b.serve()
	t.Cleanup(b.Close)
	return b
}

// Close stops the backend and ends its associations.
func (b *Backend) Close() {
	b.ln.Close()
	b.wg.Wait()
}

func (b *Backend) serve() {
	defer b.wg.Done()
	var mu sync.Mutex
	conns := map[*sctp.Conn]bool{}
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Abort()
		}
		mu.Unlock()
	}()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		b.Accepted.Add(1)
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
			}()
			buf := make([]byte, 4<<20)
			for {
				n, info, err := c.ReadMsg(buf)
				if err != nil {
					return
				}
				reply := buf[:n]
				if string(reply) == Who {
					reply = []byte(b.Name)
				}
				if _, err := c.WriteMsg(reply, info); err != nil {
					return
				}
			}
		}()
	}
}

// Ask sends msg on c and returns the reply message and its info.
func Ask(c *sctp.Conn, msg []byte, info sctp.Info) ([]byte, sctp.Info, error) {
	if _, err := c.WriteMsg(msg, info); err != nil {
		return nil, sctp.Info{}, err
	}
	buf := make([]byte, max(len(msg), 4096)+1)
	n, ri, err := c.ReadMsg(buf)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return buf[:n], ri, err
}

// Dial opens an association to addr, failing the test if that takes over
// 10 s. The association has a 60 s deadline and is closed when the test
// ends.
func Dial(t testing.TB, addr netip.AddrPort, opts sctp.Options) *sctp.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sctp.Dial(ctx, addr, opts)
	if err != nil {
		t.Fatalf("SCTP dial %s: %v", addr, err)
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// WhoAt opens an association to addr, asks the backend behind it for its
// name (Who), and closes.
func WhoAt(t testing.TB, addr netip.AddrPort) string {
	t.Helper()
	c := Dial(t, addr, sctp.Options{})
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, _, err := Ask(c, []byte(Who), sctp.Info{})
	if err != nil {
		t.Fatalf("ask %s: %v", addr, err)
	}
	return string(got)
}
