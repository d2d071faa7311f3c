//go:build unix

package userspace

import (
	"errors"
	"math"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func TestFDCeilings(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		limit                    uint64
		wantConns, wantListeners int64
		wantReserve              string
	}{
		{"unknown", 0, math.MaxInt, math.MaxInt, "last 64 "},
		{"huge", 1 << 40, math.MaxInt, math.MaxInt, "last 64 "},
		{"this host", 20000, 20000 - 64, 19936 - 19936/8, "last 64 "},
		{"1024", 1024, 960, 960 - 120, "last 64 "},
		{"small: a quarter", 200, 150, 100, "last 50 "},
		{"100", 100, 75, 50, "last 25 "},
		{"tiny", 8, 6, 4, "last 2 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c fdCeilings
			c.set(tc.limit)
			if got := c.conns.Load(); got != tc.wantConns {
				t.Errorf("conns ceiling %d, want %d", got, tc.wantConns)
			}
			if got := c.maxListeners.Load(); got != tc.wantListeners {
				t.Errorf("listeners' bound %d, want %d", got, tc.wantListeners)
			}
			if tc.limit > 0 && tc.limit < math.MaxInt32 && c.conns.Load() >= int64(tc.limit) {
				t.Errorf("no reserve under a limit of %d", tc.limit)
			}
			// The error names this limit's reserve, and counts as
			// running out of descriptors.
			err := c.errFDReserve()
			if !strings.Contains(err.Error(), tc.wantReserve) || !errors.Is(err, syscall.EMFILE) || !isResourceExhausted(err) {
				t.Errorf("reserve error %q (EMFILE: %v), want it to name the %s descriptors", err, errors.Is(err, syscall.EMFILE), tc.wantReserve)
			}
		})
	}
}

// TestListenersBoundLeavesTheRestOfTheProcess: the first listening socket
// takes the listeners' bound down by the descriptors the rest of the
// process holds, once.
func TestListenersBoundLeavesTheRestOfTheProcess(t *testing.T) {
	var c fdCeilings
	c.set(1024)
	if err := c.listenerFD(30); err != nil {
		t.Fatal(err)
	}
	if err := c.listenerFD(31); err != nil {
		t.Fatal(err)
	}
	if got := c.maxListeners.Load(); got != 840-30 {
		t.Fatalf("listeners' bound %d, want %d", got, 840-30)
	}
	if got := c.listeners.Load(); got != 2 {
		t.Fatalf("%d listeners counted, want 2", got)
	}
}

// lowestFreeFD returns the number the next descriptor would get.
func lowestFreeFD(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Dup(0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(fd)
	return fd
}

// ceilingLeaving returns the descriptor number below which exactly n
// numbers are free in this process.
func ceilingLeaving(n int) int64 {
	fd := 0
	for free := 0; free < n; fd++ {
		if fdFree(fd) {
			free++
		}
	}
	return int64(fd)
}

// fdFree reports whether descriptor number fd is free in this process.
func fdFree(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == syscall.EBADF
}

// TestListenersStopAtTheirBound: a listening socket past the listeners'
// bound is refused, and the service port is reported as not served (Apply
// fails for it, and retries it), while the ports already served go on.
func TestListenersStopAtTheirBound(t *testing.T) {
	be := startTCPBackend(t, "a")
	ub := startUDPBackend(t, "u")
	p := newTestProxier(t, Config{})
	served := spn("served", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: served, Port: 80, ClusterEndpoints: eps(be.addr())})
	addr := proxyAddr(t, p, served)

	p.fds.maxListeners.Store(p.fds.listeners.Load())
	tcp, udp := spn("more", "", state.TCP), spn("dns", "", state.UDP)
	ports := []state.ServicePort{
		{Name: served, Port: 80, ClusterEndpoints: eps(be.addr())},
		{Name: tcp, Port: 81, ClusterEndpoints: eps(be.addr())},
		{Name: udp, Port: 53, ClusterEndpoints: eps(ub.addr())},
	}
	err := p.Apply(state.NewSnapshot(ports))
	if !errors.Is(err, errListenerRoom) {
		t.Fatalf("Apply past the listeners' ceiling: %v, want %v", err, errListenerRoom)
	}
	if p.ProxyPort(tcp) != 0 || p.ProxyPort(udp) != 0 {
		t.Fatalf("ports served past the ceiling: tcp %d, udp %d", p.ProxyPort(tcp), p.ProxyPort(udp))
	}
	if got := tcpWho(t, addr); got != "a" {
		t.Fatalf("the port already served reached %q", got)
	}

	// Room again: the next Apply serves them.
	p.fds.set(0)
	mustApply(t, p, ports...)
	if got := tcpWho(t, proxyAddr(t, p, tcp)); got != "a" {
		t.Fatalf("reached %q", got)
	}
	if reply, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, udp)), []byte("q")); err != nil || len(reply) == 0 {
		t.Fatalf("UDP once listened on: %q, %v", reply, err)
	}
}

// TestConnectionsKeepTheReserve: connections keep no descriptor at or
// above the data plane's ceiling: a client that would need one is reset
// and counted as shed (not left waiting), and the clients already served
// go on; once descriptors are below the ceiling again, clients are served.
func TestConnectionsKeepTheReserve(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	addr := proxyAddr(t, p, name)
	if got := tcpWho(t, addr); got != "a" { // the loops and the pipe pool are set up
		t.Fatalf("reached %q", got)
	}

	// Room for a few connections: each takes four descriptors in this
	// process (client, accepted, dialed, the backend's). Sixteen free
	// numbers below the ceiling, not the lowest free number plus 16: an
	// earlier test's descriptors still open above a lower one that was
	// closed left the first client no room (1 full run of 4).
	p.fds.conns.Store(ceilingLeaving(16))
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	shed := false
	for i := 0; i < 20 && !shed; i++ {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if isReset(err) { // the reset came before connect returned
			shed = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2)
		_, err = c.Read(buf)
		switch {
		case err == nil:
		case isReset(err) || errors.Is(err, net.ErrClosed) || err.Error() == "EOF":
			shed = true
		default:
			t.Fatalf("client %d: %v (neither served nor reset)", i, err)
		}
	}
	if !shed {
		t.Fatal("20 clients served with room for about four")
	}
	// The count may come just after the reset the client saw.
	for deadline := time.Now().Add(5 * time.Second); p.stats.Shed.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := p.stats.Shed.Load(); n == 0 {
		t.Error("the reset client is not counted as shed within 5s")
	}
	// The first client is still served.
	if _, err := held[0].Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	held[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := held[0].Read(buf); err != nil {
		t.Fatalf("a client served before the ceiling was reached: %v", err)
	}

	for _, c := range held {
		c.Close()
	}
	held = nil
	p.fds.set(0)
	settle(t, "served again", func() error {
		_, err := tcpWhoErr(addr)
		return err
	})
}
