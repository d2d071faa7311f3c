//go:build linux && !goroutines

package userspace

import (
	"bufio"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// withTwoLoops makes sure the proxier about to be made starts at least two
// event loops (one per P, up to four), and puts GOMAXPROCS back after it.
func withTwoLoops(t *testing.T) {
	if n := runtime.GOMAXPROCS(0); n < 2 {
		runtime.GOMAXPROCS(2)
		t.Cleanup(func() { runtime.GOMAXPROCS(n) })
	}
}

// TestStalledLoopDoesNotStallAccepts: every loop waits on every TCP
// listening socket, so while all loops but one are stuck, new connections
// are still accepted and served, whichever loop is the free one. (With a
// listener owned by one loop, a stuck owner stalled every new connection.)
func TestStalledLoopDoesNotStallAccepts(t *testing.T) {
	withTwoLoops(t)
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("stall", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	addr := proxyAddr(t, p, name)
	if len(p.loops) < 2 {
		t.Fatalf("%d event loops, want at least 2", len(p.loops))
	}
	for free := range p.loops {
		release := make(chan struct{})
		stalled := make(chan struct{})
		for i, lp := range p.loops {
			if i != free {
				go lp.do(func() {
					stalled <- struct{}{}
					<-release
				})
				<-stalled // the loop is stuck before any connection is made
			}
		}
		for range 5 {
			if err := greeting(addr, "a", 3*time.Second); err != nil {
				close(release)
				t.Fatalf("with only loop %d of %d free: %v", free, len(p.loops), err)
			}
		}
		close(release)
	}
}

// greeting connects to addr and expects the tcpBackend's greeting want
// within d.
func greeting(addr, want string, d time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != want {
		return errorf("greeting %q, want %q", got, want)
	}
	return nil
}

// TestIdleLoopsPark: a loop waits in epoll_wait itself, holding its P, only
// while it is busy. Once idle every loop parks in the runtime's poller, and
// a parked loop still wakes for new work, timers included.
func TestIdleLoopsPark(t *testing.T) {
	withTwoLoops(t)
	be := startTCPBackend(t, "a")
	udp := startUDPBackend(t, "u")
	p := newTestProxier(t, Config{UDPIdleTimeout: 100 * time.Millisecond, UDPReplyTimeout: 100 * time.Millisecond})
	tcpName := spn("idle", "tcp", state.TCP)
	udpName := spn("idle", "udp", state.UDP)
	mustApply(t, p,
		state.ServicePort{Name: tcpName, Port: 80, ClusterEndpoints: eps(be.addr())},
		state.ServicePort{Name: udpName, Port: 53, ClusterEndpoints: eps(udp.addr())})
	allParked := func() error {
		for i, lp := range p.loops {
			if !lp.parked.Load() {
				return errorf("loop %d of %d is not parked", i, len(p.loops))
			}
		}
		return nil
	}
	for round := range 3 {
		if got := tcpWho(t, proxyAddr(t, p, tcpName)); got != "a" {
			t.Fatalf("round %d: TCP via the proxy reached %q, want a", round, got)
		}
		c := dialUDP(t, proxyAddr(t, p, udpName))
		if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "u" {
			t.Fatalf("round %d: UDP via the proxy: %q, %v; want u", round, got, err)
		}
		// The session's idle timeout is a timer on a loop that parks
		// before it is due: it must still fire.
		settle(t, "the UDP session times out", func() error {
			if n := p.stats.UDPSessionsActive.Load(); n != 0 {
				return errorf("%d UDP sessions active", n)
			}
			return nil
		})
		settle(t, "every idle loop parks", allParked)
	}
}

// TestGOMAXPROCSFollowsLoops: each running loop adds a P, so the rest of
// the program keeps the ones it had; Close gives them back.
func TestGOMAXPROCSFollowsLoops(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	be := startTCPBackend(t, "a")
	p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1")})
	defer p.Close()
	name := spn("procs", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	if got, want := runtime.GOMAXPROCS(0), before+len(p.loops); len(p.loops) == 0 || got != want {
		t.Fatalf("with %d loops running GOMAXPROCS is %d, want %d", len(p.loops), got, want)
	}
	p.Close()
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("after Close GOMAXPROCS is %d, want %d again", got, before)
	}
}
