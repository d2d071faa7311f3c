//go:build linux && !goroutines

package userspace

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestTCPDialRaceWonInTheLastRound: an earlier attempt whose connect ends
// while its event loop is held up past the last attempt's deadline wins
// when the loop comes back, as it would have won a moment before the
// deadline; it is not closed as timed out with its client reset. The
// loops are held up with do, as a long round (a burst of new
// connections) holds them up.
func TestTCPDialRaceWonInTheLastRound(t *testing.T) {
	if !inOwnNetns(t) {
		return
	}
	slow := startTCPBackendOn(t, "slow", raceSlowAddr+":0")
	hole := netip.MustParseAddrPort(raceHoleAddr + ":80")
	// The first attempt, to slow, times out at 200 ms and races on; its
	// first SYN is lost, and the retransmit connects at about 1 s. The
	// second, to the black hole, runs out of time at 1.4 s, the last.
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{200 * time.Millisecond, 1200 * time.Millisecond}})
	name := spn("lastround", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(slow.addr(), hole)})
	addr := proxyAddr(t, p, name)
	p.mu.Lock()
	b := p.services[name].internal
	p.mu.Unlock()
	b.next[0].Store(uint64(slices.Index(b.sets[0].Load().addrs, slow.addr()))) // slow's turn first

	type outcome struct {
		who string
		err error
	}
	done := make(chan outcome, 1)
	start := time.Now()
	go func() {
		who, err := tcpWhoErr(addr)
		done <- outcome{who, err}
	}()
	time.Sleep(500 * time.Millisecond) // the attempt races on from 200 ms
	release := make(chan struct{})
	for _, lp := range p.loops {
		stalled := make(chan struct{})
		go lp.do(func() {
			close(stalled)
			<-release
		})
		<-stalled
	}
	if held := time.Since(start); held > 900*time.Millisecond {
		close(release)
		t.Fatalf("the loops were held up only %v after the client connected: too late to hold up the connect's end", held)
	}
	time.Sleep(time.Until(start.Add(1700 * time.Millisecond)))
	close(release)

	got := <-done
	t.Logf("%q after %v (%v)", got.who, time.Since(start).Round(time.Millisecond), got.err)
	if got.who != "slow" {
		t.Errorf("reached %q (%v); want slow: the attempt that connected was given up", got.who, got.err)
	}
	st := p.Stats()
	if g := st.TCPDialGiveUps.Load(); g != 0 {
		t.Errorf("%d connections given up, want none", g)
	}
}
