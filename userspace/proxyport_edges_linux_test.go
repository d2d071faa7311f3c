package userspace

import (
	"net"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestCloseCancelsDialsInFlight: Close ends the dials still waiting for an
// endpoint's answer, rather than wait out their timeouts; a dial to an
// endpoint that drops SYNs (synDroppingEndpoint, Linux only) would
// otherwise hold Close for the whole 20 s attempt here.
func TestCloseCancelsDialsInFlight(t *testing.T) {
	ep, _ := synDroppingEndpoint(t)
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{20 * time.Second}})
	name := spn("hang", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ep)})
	c, err := net.Dial("tcp", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	settleSynSent(t, "the proxy's dial", ep)
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close still waits 5 s on, for a dial with 20 s to go")
	}
}
