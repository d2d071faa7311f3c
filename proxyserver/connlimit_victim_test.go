package proxyserver

import (
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// TestConnLimitClosesAWaitingConnectionFirst: over the bound, of one
// client's connections, one waiting for a request goes before one that
// serves a request, though the one serving is older; among those waiting,
// the oldest. (net.Pipe: every connection has the same, zero, client.)
func TestConnLimitClosesAWaitingConnectionFirst(t *testing.T) {
	l := newConnLimit("test", 2)
	pipe := func() net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return a
	}
	serving, waiting, newest := pipe(), pipe(), pipe()
	names := map[net.Conn]string{serving: "the older one serving a request", waiting: "the one waiting", newest: "the newest"}
	l.track(serving, http.StateNew)
	l.track(serving, http.StateActive) // its request came: oldest, and serving it
	l.track(waiting, http.StateNew)
	l.track(newest, http.StateNew) // over the bound
	var kept []string
	for c := range l.conns {
		kept = append(kept, names[c])
	}
	if _, ok := l.conns[waiting]; ok || len(l.conns) != 2 {
		t.Errorf("over the bound, kept %q; want the one waiting closed, and the older one serving a request kept", kept)
	}
}

// TestConnLimitResetsTheConnectionItCloses: the connection closed for the
// bound is reset, so that its socket is freed at once: its client reads
// ECONNRESET, not the end of the stream a FIN would give.
func TestConnLimitResetsTheConnectionItCloses(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	connect := func() (client, server net.Conn) {
		t.Helper()
		client, err := net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		// The dial has completed, so the connection is in the accept
		// queue: Accept returns at once.
		server, err = ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { server.Close() })
		return client, server
	}
	l := newConnLimit("test", 1)
	oldClient, old := connect()
	l.track(old, http.StateNew)
	_, cur := connect()
	l.track(cur, http.StateNew) // over the bound: the older goes
	if _, ok := l.conns[old]; ok {
		t.Fatal("the older connection was kept")
	}
	_ = oldClient.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := oldClient.Read(make([]byte, 1))
	switch {
	case errors.Is(err, syscall.ECONNRESET):
	case errors.Is(err, io.EOF):
		t.Fatal("the client of the connection closed for the bound read the end of the stream (a FIN), want ECONNRESET (a reset)")
	default:
		t.Fatalf("the client of the connection closed for the bound read %d bytes, %v; want ECONNRESET", n, err)
	}
}
