//go:build unix

package userspace

import (
	"syscall"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestUDPSessionOnTheSparesNumberIsDropped: a UDP session's endpoint
// socket that took the number of the spare descriptor (freed for a moment
// by a shed elsewhere while descriptors ran out) is closed, so the spare
// takes the number back: the datagram is dropped and counted as shed, and
// no session opens. The socket used to keep the number, and TCP clients
// then waited instead of being reset. The next datagram, with the spare
// back, opens its session as usual.
func TestUDPSessionOnTheSparesNumberIsDropped(t *testing.T) {
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("dns", "dns", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	loseSpare(p.shed, syscall.EMFILE) // the session's socket holds the number

	c := dialUDP(t, proxyAddr(t, p, name))
	if _, err := c.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	settle(t, "the datagram counted as shed", func() error {
		if n := p.stats.Shed.Load(); n != 1 {
			return errorf("Shed = %d, want 1", n)
		}
		return nil
	})
	if n := p.stats.UDPSessionsOpened.Load(); n != 0 {
		t.Errorf("%d sessions opened on the spare's number, want 0", n)
	}
	if p.shed.missing.Load() {
		t.Error("the spare was not taken back")
	}
	if got, err := udpExchange(t, c, []byte("second")); err != nil || string(got) != "second" {
		t.Fatalf("with the spare back: %q, %v", got, err)
	}
}
