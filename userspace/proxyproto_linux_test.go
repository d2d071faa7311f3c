//go:build linux && !goroutines

package userspace

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// TestProxyHeaderWaitsForRoom: when the endpoint's socket has no room for
// the header (EAGAIN), it goes once there is room, and the client's bytes,
// readable all along, wait behind it; only they count as carried.
func TestProxyHeaderWaitsForRoom(t *testing.T) {
	pair := func() [2]int {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
		return fds
	}
	client, backend := pair(), pair() // [0]: the proxy's end; [1]: the peer's
	if err := unix.SetsockoptInt(backend[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 4096); err != nil {
		t.Fatal(err)
	}
	// Fill the endpoint's socket until it takes nothing more.
	var filled bytes.Buffer
	chunk := bytes.Repeat([]byte{'f'}, 97) // odd-sized, so the last write may be partial
	for {
		n, err := unix.Write(backend[0], chunk)
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		filled.Write(chunk[:n])
	}
	header := []byte("PROXY TCP4 198.18.10.2 198.18.0.10 40000 80\r\n")
	pending := &pendingHeader{n: len(header)}
	copy(pending.buf[:], header)
	if _, err := unix.Write(client[1], []byte("client bytes")); err != nil {
		t.Fatal(err)
	}
	c := &tcpConn{
		lp:     &eventLoop{tcpBuf: make([]byte, smallRead)},
		l:      &tcpListener{sp: &servicePort{p: &Proxier{}}},
		cfd:    client[0],
		bfd:    backend[0],
		header: pending,
	}
	c.readable[0] = true

	var got bytes.Buffer
	drain := func(size int) {
		buf := make([]byte, size)
		n, err := unix.Read(backend[1], buf)
		if err != nil && err != unix.EAGAIN {
			t.Fatal(err)
		}
		got.Write(buf[:max(n, 0)])
	}
	if !c.pumpDir(0) {
		t.Fatal("the connection was aborted")
	}
	if c.header == nil {
		t.Fatal("the header went into a full socket")
	}
	for i := 0; c.header != nil || got.Len() < filled.Len()+len(header)+len("client bytes"); i++ {
		if i > 10000 {
			t.Fatalf("stuck: %d bytes of the header left, got %d bytes", pending.n-pending.sent, got.Len())
		}
		drain(61) // a little room at a time: the header goes in parts
		if !c.pumpDir(0) {
			t.Fatal("the connection was aborted")
		}
	}
	want := append(append(filled.Bytes(), header...), "client bytes"...)
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("the endpoint got ...%q, want ...%q", tail(got.Bytes()), tail(want))
	}
	if c.moved[0] != uint64(len("client bytes")) {
		t.Fatalf("counted %d bytes to the endpoint, want only the client's %d", c.moved[0], len("client bytes"))
	}
}

func tail(b []byte) []byte { return b[max(0, len(b)-80):] }
