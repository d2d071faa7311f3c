//go:build unix

package userspace

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func listenForShed(t *testing.T) (*net.TCPListener, syscall.RawConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	rc, err := ln.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return ln, rc
}

// waitQueued returns once a connection waits on ln, from the kernel's
// side (poll), or fails the test after 5s.
func waitQueued(t *testing.T, rc syscall.RawConn) {
	t.Helper()
	var n int
	var perr error
	if err := rc.Control(func(fd uintptr) {
		n, perr = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 5000)
	}); err != nil || perr != nil || n == 0 {
		t.Fatalf("no connection queued within 5s: %v, %v", err, perr)
	}
}

// TestShedFromKeepsSpareWhenNoneWaits: with no client waiting (on Linux
// accept fails with EMFILE all the same), shedFrom returns at once and
// keeps the spare: given up, a dial on another goroutine took it, and the
// next client waited instead of being reset.
func TestShedFromKeepsSpareWhenNoneWaits(t *testing.T) {
	_, rc := listenForShed(t)
	s := newShedder()
	defer s.close()
	spare := s.spare
	if got := s.shedFrom(rc); got != shedNone {
		t.Fatalf("shedFrom = %v, want shedNone", got)
	}
	if s.spare != spare {
		t.Fatal("the spare was given up with no connection to shed")
	}
}

// TestShedFromResetsAWaitingClient: a waiting client is accepted with the
// spare and reset, and the spare is taken back at once.
func TestShedFromResetsAWaitingClient(t *testing.T) {
	ln, rc := listenForShed(t)
	s := newShedder()
	defer s.close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitQueued(t, rc)
	if got := s.shedFrom(rc); got != shedOne {
		t.Fatalf("shedFrom = %v, want shedOne", got)
	}
	if s.spare == nil || s.missing.Load() {
		t.Fatal("the spare was not taken back")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read: %v, want a reset", err)
	}
	if got := s.shedFrom(rc); got != shedNone {
		t.Fatalf("shedFrom with the queue empty again = %v, want shedNone", got)
	}
}

// TestAcceptLoopShedsClientsWhileOutOfDescriptors: while every accept
// fails for want of descriptors (as on Linux with no client waiting), the
// accept loop neither spins nor leaves a client that comes waiting: it is
// reset within outOfDescriptorsRetry or so, and counted as shed.
func TestAcceptLoopShedsClientsWhileOutOfDescriptors(t *testing.T) {
	p := newTestProxier(t, Config{})
	sp := &servicePort{p: p, name: state.ServicePortName{Namespace: "test", Name: "web", Port: "http", Protocol: state.TCP}}
	ln, rc := listenForShed(t)
	closed := make(chan struct{})
	var accepts atomic.Int64
	accept := func() (*net.TCPConn, error) {
		accepts.Add(1)
		select {
		case <-closed:
			return nil, net.ErrClosed
		default:
			return nil, &net.OpError{Op: "accept", Net: "tcp4", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
		}
	}
	done := make(chan struct{})
	var accepted atomic.Uint64
	go func() {
		defer close(done)
		acceptLoop(sp, &accepted, accept, func() shedResult { return p.shed.shedFrom(rc) }, func(*net.TCPConn) bool {
			t.Error("kept a connection no accept returned")
			return false
		}, func(*net.TCPConn) {
			t.Error("served a connection no accept returned")
		})
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			close(closed)
			<-done
		}
	}
	defer stop()

	start := time.Now()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err == nil { // else the reset came before connect returned
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client: %v, want a reset", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the client was reset after %v, want about %v at most", took, outOfDescriptorsRetry)
	}
	stop() // the loop counts the shed after the reset
	if n := p.stats.Shed.Load(); n != 1 {
		t.Errorf("Shed = %d, want 1", n)
	}
	// From 5ms doubling to outOfDescriptorsRetry: a handful of accepts
	// in the time a client takes, not a spin.
	if n := accepts.Load(); n > 100 {
		t.Errorf("%d accepts while out of descriptors: the loop spins", n)
	}
}

// TestKeepAcceptedShedsTheConnectionThatTookTheSparesNumber: the goroutine
// accept loops' keep, given a connection accepted while the spare is
// missing for want of descriptors (another loop's shed had freed its
// number for a moment), resets it and counts it as shed, so the spare
// takes the number back; a spare missing for another reason costs no
// connection.
func TestKeepAcceptedShedsTheConnectionThatTookTheSparesNumber(t *testing.T) {
	for _, tc := range []struct {
		openErr error
		keep    bool
	}{{syscall.EMFILE, false}, {syscall.EACCES, true}} {
		p := newTestProxier(t, Config{})
		sp := &servicePort{p: p, name: state.ServicePortName{Namespace: "test", Name: "web", Port: "http", Protocol: state.TCP}}
		loseSpare(p.shed, tc.openErr)
		ln, _ := listenForShed(t)
		client, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		c, err := ln.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		keep := keepAccepted(sp, func(c *net.TCPConn) { c.SetLinger(0); c.Close() })
		if got := keep(c); got != tc.keep {
			t.Fatalf("spare's open failing with %v: keep = %v, want %v", tc.openErr, got, tc.keep)
		}
		if tc.keep {
			if n := p.fds.dialing.Load(); n != 1 {
				t.Errorf("a kept connection counts %d dialing, want 1", n)
			}
			continue
		}
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("client read: %v, want a reset", err)
		}
		if n := p.stats.Shed.Load(); n != 1 {
			t.Errorf("Shed = %d, want 1", n)
		}
		if n := p.fds.dialing.Load(); n != 0 {
			t.Errorf("a shed connection left %d dialing, want 0", n)
		}
		if p.shed.missing.Load() {
			t.Error("the spare was not taken back")
		}
	}
}
