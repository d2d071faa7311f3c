package userspace

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
)

// Both builds say a side's failure the same way: the event loops' errors
// are the bare errno, the goroutine build's the errno wrapped by net.Conn
// in its operation and addresses, which the -v=4 line said whole ("write
// tcp4 a->b: write: connection timed out").
func TestSideFailedSaysTheErrno(t *testing.T) {
	// A real one, from a socket: a connect refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, refused := net.Dial("tcp", addr)
	if refused == nil {
		c.Close()
		t.Fatalf("a dial to %s, closed, connected", addr)
	}
	if !errors.Is(refused, syscall.ECONNREFUSED) {
		t.Fatalf("a dial to %s, closed: %v, want connection refused", addr, refused)
	}
	wrapped := func(op string, errno syscall.Errno) error {
		return &net.OpError{Op: op, Net: "tcp4",
			Source: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 26201},
			Addr:   &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 26202},
			Err:    os.NewSyscallError(op, errno)}
	}
	timedOut := syscall.ETIMEDOUT.Error() // "connection timed out" on Linux
	deadline := &net.OpError{Op: "read", Net: "tcp4", Err: os.ErrDeadlineExceeded}
	for _, tc := range []struct {
		name    string
		side    string
		reading bool
		err     error
		want    string
	}{
		{"write timed out", "client", false, syscall.ETIMEDOUT, "sending to the client failed: " + timedOut},
		{"write timed out, wrapped", "client", false, wrapped("write", syscall.ETIMEDOUT), "sending to the client failed: " + timedOut},
		{"read timed out", "client", true, syscall.ETIMEDOUT, "reading from the client failed: " + timedOut},
		{"read timed out, wrapped", "client", true, wrapped("read", syscall.ETIMEDOUT), "reading from the client failed: " + timedOut},
		{"unreachable, wrapped", "endpoint", false, wrapped("write", syscall.EHOSTUNREACH), "sending to the endpoint failed: " + syscall.EHOSTUNREACH.Error()},
		{"refused, from a socket", "endpoint", false, refused, "sending to the endpoint failed: " + syscall.ECONNREFUSED.Error()},
		{"reset, wrapped", "endpoint", true, wrapped("read", syscall.ECONNRESET), "the endpoint reset the connection"},
		{"closed, wrapped", "client", false, wrapped("write", syscall.EPIPE), "the client had closed the connection"},
		{"not the kernel's", "client", true, deadline, "reading from the client failed: " + deadline.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sideFailed(tc.side, tc.reading, tc.err); got != tc.want {
				t.Errorf("sideFailed(%q, %v, %v) = %q, want %q", tc.side, tc.reading, tc.err, got, tc.want)
			}
		})
	}
}
