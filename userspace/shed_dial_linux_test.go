//go:build linux

package userspace

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestTCPDialOnTheSparesNumberIsShed: the socket of a dial attempt that
// took the number of the spare descriptor (freed for a moment by a shed
// elsewhere while descriptors ran out) is ended, so that the spare takes
// the number back; the client is reset and counted as shed, and the next
// one is served. The connection's first attempt waits on an endpoint that
// drops SYNs; the spare is lost meanwhile, after the accepted socket was
// checked, and the next attempt's socket, to an endpoint that answers, is
// the one that gives it back: the dial's own check, in both builds (the
// event loop checks a socket as it opens it, the goroutine build once it
// has connected).
func TestTCPDialOnTheSparesNumberIsShed(t *testing.T) {
	stuck, _ := synDroppingEndpoint(t)
	fine := startTCPBackend(t, "fine")
	// The first attempt's time must outlast the steps below that give the
	// next attempt somewhere to go: at 250 ms, on a machine ten times
	// busier than its CPUs, it ran out first (1 run in 30), and the next
	// attempt went to stuck again and was given up, not shed.
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{time.Second, 5 * time.Second}})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(stuck)})
	addr := proxyAddr(t, p, name)
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	settleSynSent(t, "the first attempt connecting to the endpoint that drops SYNs", stuck)
	// The next attempt has somewhere to go, and its socket will hold the
	// spare's number.
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(stuck, fine.addr())})
	loseSpare(p.shed, syscall.EMFILE)

	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("the client read %d bytes, %v; want a reset", n, err)
	}
	if n := p.stats.Shed.Load(); n != 1 {
		t.Errorf("Shed = %d, want 1", n)
	}
	if n := p.stats.TCPDialGiveUps.Load(); n != 0 {
		t.Errorf("TCPDialGiveUps = %d, want 0: the connection was shed, not given up", n)
	}
	if p.shed.missing.Load() {
		t.Error("the spare was not taken back")
	}
	if got := tcpWho(t, addr); got != "fine" {
		t.Fatalf("with the spare back, reached %q, want fine", got)
	}
}
