//go:build unix

package userspace

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// holdClient connects a client to addr, greeted by the backend, and
// closes it when the test ends.
func holdClient(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
}

// freeBelow counts the descriptor numbers below ceiling that are free in
// this process: those a new socket can take.
func freeBelow(ceiling int64) int {
	free := 0
	for fd := 0; int64(fd) < ceiling; fd++ {
		if fdFree(fd) {
			free++
		}
	}
	return free
}

// TestListenerOpensUnderConnectionLoad: connections hold the low
// descriptor numbers, and a Service added while they take most of the
// connections' room still gets its listener (and is served), as long as
// its descriptor is below the connections' ceiling; a few listeners are
// far from their bound. The listeners' ceiling was a descriptor number an
// eighth of the room below the connections', so under load no new
// listener could open however few service ports there were.
func TestListenerOpensUnderConnectionLoad(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	web := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: web, Port: 80, ClusterEndpoints: eps(be.addr())})
	addr := proxyAddr(t, p, web)
	if got := tcpWho(t, addr); got != "a" { // the loops and the pipe pool are set up
		t.Fatalf("reached %q", got)
	}

	// A limit whose connections' room is 240 descriptors from here,
	// listeners far from their bound; then clients take most of it, until
	// 24 numbers are left below the ceiling. A client takes five or six
	// descriptors in this process (client, accepted, dialed, backend's,
	// and in the event loops a pipe), and more while the copies of the
	// goroutine build hold a pipe, so the clients are counted by what
	// they leave, not by a number that fits (36 overran the room in 1
	// run of 5).
	lf := lowestFreeFD(t)
	limit := uint64(lf + 240 + 64)
	p.fds.set(limit)
	if p.fds.maxListeners.Load() < 8 {
		t.Fatalf("listeners' bound %d", p.fds.maxListeners.Load())
	}
	ceiling := p.fds.conns.Load()
	clients := 0
	for ; freeBelow(ceiling) > 24; clients++ {
		if clients == 60 {
			t.Fatalf("60 clients leave %d of the %d descriptors below the ceiling", freeBelow(ceiling), ceiling-int64(lf))
		}
		holdClient(t, addr)
		if n := p.stats.Shed.Load(); n != 0 {
			t.Fatalf("client %d shed with %d descriptors left below the ceiling", clients, freeBelow(ceiling))
		}
	}
	t.Logf("connections' room from %d to %d; %d clients leave %d of it", lf, ceiling, clients, freeBelow(ceiling))

	added := spn("added", "", state.TCP)
	mustApply(t, p,
		state.ServicePort{Name: web, Port: 80, ClusterEndpoints: eps(be.addr())},
		state.ServicePort{Name: added, Port: 81, ClusterEndpoints: eps(be.addr())})
	if got := tcpWho(t, proxyAddr(t, p, added)); got != "a" {
		t.Fatalf("the added Service reached %q", got)
	}
}

// TestListenerCountFollowsCloses: the listeners' count goes up and down
// with the listening sockets of every protocol, including those of a
// service port whose listener failed half-way, so a bound once reached is
// left again when ports go.
func TestListenerCountFollowsCloses(t *testing.T) {
	be := startTCPBackend(t, "a")
	ub := startUDPBackend(t, "u")
	p := newTestProxier(t, Config{})
	before := p.fds.listeners.Load()
	var ports []state.ServicePort
	for i := range 4 {
		ports = append(ports,
			state.ServicePort{Name: spn(fmt.Sprint("t", i), "", state.TCP), Port: 80, ClusterEndpoints: eps(be.addr())},
			state.ServicePort{Name: spn(fmt.Sprint("u", i), "", state.UDP), Port: 53, ClusterEndpoints: eps(ub.addr())})
	}
	mustApply(t, p, ports...)
	held := p.fds.listeners.Load() - before
	if held < int64(len(ports)) {
		t.Fatalf("%d service ports counted as %d listeners", len(ports), held)
	}

	// At the bound: one more port is refused, and the count is unchanged.
	p.fds.maxListeners.Store(p.fds.listeners.Load())
	more := append(ports, state.ServicePort{Name: spn("more", "", state.TCP), Port: 80, ClusterEndpoints: eps(be.addr())})
	if err := p.Apply(state.NewSnapshot(more)); !errors.Is(err, errListenerRoom) {
		t.Fatalf("Apply at the bound: %v, want %v", err, errListenerRoom)
	}
	if got := p.fds.listeners.Load() - before; got != held {
		t.Fatalf("a refused listener changed the count: %d, was %d", got, held)
	}
	// Two ports go: the new one takes the place of one.
	if err := p.Apply(state.NewSnapshot(more[2:])); err != nil {
		t.Fatalf("Apply once ports went: %v", err)
	}
	if got := tcpWho(t, proxyAddr(t, p, more[len(more)-1].Name)); got != "a" {
		t.Fatalf("reached %q", got)
	}
	mustApply(t, p)
	if got := p.fds.listeners.Load(); got != before {
		t.Fatalf("%d listeners counted with no service port, %d before", got, before)
	}
}

// TestCountListener: a listening socket opened outside the data plane (a
// health-check node port) is counted with the data plane's listeners: at
// the bound it is refused and closed, and closing a counted one gives its
// place back, once.
func TestCountListener(t *testing.T) {
	p := newTestProxier(t, Config{})
	before := p.fds.listeners.Load()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counted, err := p.CountListener(ln)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.fds.listeners.Load(); got != before+1 {
		t.Fatalf("%d listeners, want %d", got, before+1)
	}

	p.fds.maxListeners.Store(p.fds.listeners.Load())
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.CountListener(ln2); !errors.Is(err, ErrListenerRoom) {
		t.Fatalf("past the bound: %v, want %v", err, ErrListenerRoom)
	}
	if _, err := ln2.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a refused listener is left open: %v", err)
	}

	counted.Close()
	counted.Close()
	if got := p.fds.listeners.Load(); got != before {
		t.Fatalf("%d listeners after close, want %d", got, before)
	}

	// In the reserve: refused whatever the count.
	p.fds.set(0)
	p.fds.conns.Store(int64(lowestFreeFD(t)))
	ln3, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.CountListener(ln3); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("in the reserve: %v, want EMFILE", err)
	}
}

// TestAcceptedCountsShedConnections: tcp_connections_accepted_total counts
// every connection taken from a listening socket, the shed ones too (they
// are also in shed_total). The event-loop build left out a connection shed
// for the reserve; the goroutine build counted it.
func TestAcceptedCountsShedConnections(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	addr := proxyAddr(t, p, name)
	if got := tcpWho(t, addr); got != "a" {
		t.Fatalf("reached %q", got)
	}
	accepted := p.stats.TCPAccepted.Load()

	// No room at all: every client is shed.
	p.fds.conns.Store(0)
	const clients = 5
	for i := range clients {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			if !isReset(err) {
				t.Fatalf("client %d: %v", i, err)
			}
			continue
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("client %d served with no room", i)
		}
		c.Close()
	}
	settle(t, "shed clients counted", func() error {
		shed, acc := p.stats.Shed.Load(), p.stats.TCPAccepted.Load()-accepted
		if shed != clients || acc != clients {
			return fmt.Errorf("%d clients shed: shed_total %d, accepted_total up by %d", clients, shed, acc)
		}
		return nil
	})
}
