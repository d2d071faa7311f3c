//go:build linux

package userspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// fillUntilBlocked writes chunks to c until a write has waited d without
// finishing (every buffer on the way is full), then closes full. It goes
// on writing, each write bounded by 10 s, until a write fails or 100 MiB
// have gone, and returns what the last write said.
func fillUntilBlocked(c net.Conn, d time.Duration, full chan<- struct{}) error {
	chunk := make([]byte, 64<<10)
	blocked := false
	var err error
	for range 1600 {
		wait := 10 * time.Second
		if !blocked {
			wait = d
		}
		_ = c.SetWriteDeadline(time.Now().Add(wait))
		_, err = c.Write(chunk)
		if !blocked && errors.Is(err, os.ErrDeadlineExceeded) {
			blocked = true
			close(full)
			continue
		}
		if err != nil {
			break
		}
	}
	if !blocked {
		close(full)
	}
	return err
}

// readUntilError reads c until it fails or reaches EOF, within 10 s.
func readUntilError(c net.Conn) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got bytes.Buffer
	_, err := io.Copy(&got, c)
	return got.Bytes(), err
}

// TestTCPEndpointAnswerBeforeResetReachesClient: an endpoint that answers
// an upload it will not take ("413") and closes with the upload unread,
// so its kernel sends a reset, has its answer delivered to the client
// before the reset, as a direct connection or kernel NAT deliver it. Both
// builds used to find the reset by writing more of the upload to the
// endpoint first, and reset the client without reading the answer waiting
// in the endpoint's socket (the goroutine build: unless its other
// direction happened to read the answer first).
func TestTCPEndpointAnswerBeforeResetReachesClient(t *testing.T) {
	const answer = "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n"
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := newTestProxier(t, Config{})
	name := spn("upload", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	addr := proxyAddr(t, p, name)
	for round := range 8 {
		full := make(chan struct{})
		served := answerThenReset(ln, full, []byte(answer), nil)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		uploaded := make(chan error, 1)
		go func() { uploaded <- fillUntilBlocked(c, 300*time.Millisecond, full) }()
		got, rerr := readUntilError(c)
		c.Close()
		werr := <-uploaded
		if err := <-served; err != nil {
			t.Fatalf("round %d: endpoint: %v", round, err)
		}
		if !strings.HasPrefix(string(got), answer) {
			t.Fatalf("round %d: the client read %q and then %v, want the endpoint's answer %q and then a reset", round, got, rerr, answer)
		}
		// The reset goes to whichever of the reader and the writer asks
		// first; the other sees the connection closed.
		if !isReset(rerr) && !isReset(werr) {
			t.Fatalf("round %d: after the answer the client read %v and its upload ended with %v, want a reset", round, rerr, werr)
		}
	}
	settle(t, "the connections no longer active", func() error {
		if a := p.Stats().TCPActive.Load(); a != 0 {
			return errorf("%d connections still counted active", a)
		}
		return nil
	})
}

// TestTCPClientLastWordsBeforeResetReachEndpoint is the mirror: a client
// that sends "QUIT" and closes with the endpoint's data unread (a reset)
// has its QUIT delivered to the endpoint before the reset.
func TestTCPClientLastWordsBeforeResetReachEndpoint(t *testing.T) {
	const quit = "QUIT\r\n"
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := newTestProxier(t, Config{})
	name := spn("quit", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	addr := proxyAddr(t, p, name)
	type result struct {
		got          []byte
		err, sendErr error
	}
	for round := range 16 {
		full := make(chan struct{})
		read := make(chan result, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				close(full)
				read <- result{nil, err, nil}
				return
			}
			defer c.Close()
			sent := make(chan error, 1)
			go func() { sent <- fillUntilBlocked(c, 300*time.Millisecond, full) }()
			got, err := readUntilError(c)
			c.Close()
			read <- result{got, err, <-sent}
		}()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-full: // the endpoint's data waits in the proxy for the client
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the endpoint never filled the way to the client", round)
		}
		if _, err := c.Write([]byte(quit)); err != nil {
			t.Fatal(err)
		}
		c.Close() // with the endpoint's data unread: a reset
		r := <-read
		if string(r.got) != quit {
			t.Fatalf("round %d: the endpoint read %q and then %v, want %q and then a reset", round, r.got, r.err, quit)
		}
		if !isReset(r.err) && !isReset(r.sendErr) {
			t.Fatalf("round %d: after the QUIT the endpoint read %v and its sending ended with %v, want a reset", round, r.err, r.sendErr)
		}
	}
}

// TestTCPLongAnswerBeforeResetIsNotCutShort: the reset passed on to the
// client does not discard what is still on its way to it. The endpoint
// answers with more than the client's receive buffer holds, waits until
// the proxy has acknowledged all of it, and closes with the upload
// unread (a reset); the client, slow, reads only then. A reset
// (SO_LINGER 0 close) of the client's socket at once would discard its
// send queue, and drop what the proxy still held.
func TestTCPLongAnswerBeforeResetIsNotCutShort(t *testing.T) {
	answer := bytes.Repeat([]byte("0123456789abcdef"), 128<<10/16)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := newTestProxier(t, Config{})
	name := spn("long", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	addr := proxyAddr(t, p, name)
	for round := range 3 {
		full := make(chan struct{})
		served := answerThenReset(ln, full, answer, func(c *net.TCPConn) error { return waitAcked(c, 10*time.Second) })
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<10) })
		}}
		c, err := d.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		uploaded := make(chan error, 1)
		go func() { uploaded <- fillUntilBlocked(c, 300*time.Millisecond, full) }()
		if err := <-served; err != nil {
			t.Fatalf("round %d: endpoint: %v", round, err)
		}
		// The endpoint has closed: give its reset a moment to reach the
		// proxy before the client starts reading.
		time.Sleep(100 * time.Millisecond)
		got, rerr := readUntilError(c)
		c.Close()
		werr := <-uploaded
		if !bytes.Equal(got, answer) {
			t.Fatalf("round %d: the client read %d bytes and then %v, want the endpoint's %d-byte answer and then a reset", round, len(got), rerr, len(answer))
		}
		if !isReset(rerr) && !isReset(werr) {
			t.Fatalf("round %d: after the answer the client read %v and its upload ended with %v, want a reset", round, rerr, werr)
		}
	}
}

// waitAcked waits, bounded by d, until the peer has acknowledged
// everything written to c.
func waitAcked(c *net.TCPConn, d time.Duration) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(d)
	for {
		var unacked int
		var ierr error
		if err := rc.Control(func(fd uintptr) { unacked, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil {
			return err
		}
		if ierr != nil {
			return ierr
		}
		if unacked == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d bytes still unacknowledged after %v", unacked, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// answerThenReset serves one connection on ln as an endpoint that refuses
// an upload: it reads the first 1000 bytes, waits until full is closed
// (the rest of the upload waits in the proxy), writes answer, waits for
// then (if not nil), and closes with the upload unread, so its kernel
// sends a reset. The channel gets what came of it.
func answerThenReset(ln net.Listener, full <-chan struct{}, answer []byte, then func(*net.TCPConn) error) <-chan error {
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close() // with the upload unread: a reset
		if _, err := io.ReadFull(c, make([]byte, 1000)); err != nil {
			served <- err
			return
		}
		select {
		case <-full:
		case <-time.After(10 * time.Second):
		}
		if _, err := c.Write(answer); err != nil || then == nil {
			served <- err
			return
		}
		served <- then(c.(*net.TCPConn))
	}()
	return served
}
