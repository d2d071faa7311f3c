//go:build linux && goroutines

package userspace

import (
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// A client that vanishes (its link went down) is found by the kernel's
// timeout, ETIMEDOUT, and the -v=4 line says the connection timed out,
// as the event loops' does. net.Error's Timeout is true for ETIMEDOUT as
// for a deadline, and the copy took it for its own: a download to a
// vanished client (the write timed out) was taken for data waiting on a
// paused reader, copied on and ended with EPIPE, "the client had closed
// the connection" (each of 60 connections), and an idle one found by the
// keep-alive was taken for a silent half-closed connection, counted in
// HalfCloseTimeouts and reset as one.
//
// The clients' packets are dropped with iptables in a namespace of the
// test's own (see inOwnNetns); the proxy's sockets to them are given a
// user timeout and keep-alive of a second or so, where the defaults take
// minutes.
func TestTCPPeerTimeoutSaysTimedOut(t *testing.T) {
	if !inOwnNetns(t) {
		return
	}
	logs := captureLog(t, "4")
	// The endpoint sends without end to a connection that starts with
	// 'd', and nothing to one that starts with 'i'.
	ln, err := net.Listen("tcp", raceFineAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var kind [1]byte
				if _, err := io.ReadFull(c, kind[:]); err != nil || kind[0] != 'd' {
					io.Copy(io.Discard, c)
					return
				}
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	p := newTestProxier(t, Config{})
	name := spn("vanish", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	addr := proxyAddr(t, p, name)
	const downloads, idle = 6, 6
	for i := range downloads + idle {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		kind := "i"
		if i < downloads {
			kind = "d"
		}
		if _, err := c.Write([]byte(kind)); err != nil {
			t.Fatal(err)
		}
	}
	// Every download fills the proxy's send queue to its client, which
	// reads nothing; every idle connection has reached its endpoint.
	settle(t, "downloads waiting on their clients", func() error {
		waiting, active := 0, 0
		p.conns.each(func(c *tcpConn) {
			active++
			if unsent(c.client) {
				waiting++
			}
		})
		if active != downloads+idle || waiting != downloads || p.Stats().BytesToBackend.Load() != downloads+idle {
			return fmt.Errorf("%d of %d downloads waiting, %d connections, %d bytes to endpoints", waiting, downloads, active, p.Stats().BytesToBackend.Load())
		}
		return nil
	})
	p.conns.each(func(c *tcpConn) {
		rc, err := c.client.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		rc.Control(func(fd uintptr) {
			for _, o := range [][2]int{{unix.TCP_USER_TIMEOUT, 500}, {unix.TCP_KEEPIDLE, 1}, {unix.TCP_KEEPINTVL, 1}, {unix.TCP_KEEPCNT, 1}} {
				if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, o[0], o[1]); err != nil {
					t.Errorf("setsockopt %d: %v", o[0], err)
				}
			}
		})
	})
	port := strconv.Itoa(int(p.ProxyPort(name)))
	for _, dir := range []string{"--sport", "--dport"} {
		if out, err := exec.Command("iptables", "-A", "OUTPUT", "-p", "tcp", dir, port, "-j", "DROP").CombinedOutput(); err != nil {
			t.Fatalf("iptables: %v: %s", err, out)
		}
	}
	var ended []string
	settleWithin(t, 30*time.Second, "every connection ended", func() error {
		ended = ended[:0]
		logs.mu.Lock()
		all := logs.b.String()
		logs.mu.Unlock()
		for line := range strings.Lines(all) {
			if strings.Contains(line, "Connection ended") {
				ended = append(ended, line[strings.Index(line, "reason="):])
			}
		}
		if len(ended) < downloads+idle {
			return fmt.Errorf("%d ended", len(ended))
		}
		return nil
	})
	timedOut := 0
	for _, why := range ended {
		t.Log(strings.TrimSpace(why))
		switch {
		case strings.Contains(why, `failed: connection timed out"`): // the errno alone, as the event loops say it
			timedOut++
		case strings.Contains(why, "had closed"), strings.Contains(why, "half-closed"):
			t.Errorf("a client that timed out: %s", strings.TrimSpace(why))
		}
	}
	// A read that finds EOF after a write took the error says reset, now
	// and then: only most must say it.
	if timedOut < (downloads+idle)/2 {
		t.Errorf("%d of %d connections said they timed out", timedOut, downloads+idle)
	}
	if n := p.Stats().HalfCloseTimeouts.Load(); n != 0 {
		t.Errorf("%d half-close timeouts counted, want 0", n)
	}
}
