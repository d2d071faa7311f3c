//go:build linux && !goroutines

package userspace

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// serve lets the endpoint go: it takes the connection that filled its
// queue, and serves the next one as tcpBackend does (its name, then an
// echo), after first calling accepted (if not nil), which may hold the
// greeting back.
func (h *heldEndpoint) serve(t *testing.T, accepted func(net.Conn)) {
	t.Helper()
	filler, err := h.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	filler.Close()
	h.done = make(chan struct{})
	go func() {
		defer close(h.done)
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if accepted != nil {
			accepted(c)
		}
		fmt.Fprintf(c, "%s\n", h.name)
		io.Copy(c, c)
	}()
}

// firstTurn makes ep the next endpoint in turn of name's balancer.
func firstTurn(t *testing.T, p *Proxier, name state.ServicePortName, ep netip.AddrPort) {
	t.Helper()
	p.mu.Lock()
	b := p.services[name].internal
	p.mu.Unlock()
	i := slices.Index(b.sets[0].Load().addrs, ep)
	if i < 0 {
		t.Fatalf("%v is not an endpoint of %s", ep, name)
	}
	b.next[0].Store(uint64(i))
}

// settleDialFailures waits until p has counted n failed dial attempts.
func settleDialFailures(t *testing.T, p *Proxier, n uint64) {
	t.Helper()
	settle(t, fmt.Sprintf("%d dial failures", n), func() error {
		if f := p.Stats().TCPDialFailures.Load(); f != n {
			return fmt.Errorf("%d dial failures", f)
		}
		return nil
	})
}

type whoOutcome struct {
	who string
	err error
}

// whoLater runs tcpWhoErr(addr) and hands back what came of it.
func whoLater(addr string) <-chan whoOutcome {
	done := make(chan whoOutcome, 1)
	go func() {
		who, err := tcpWhoErr(addr)
		done <- whoOutcome{who, err}
	}()
	return done
}

// TestTCPFailoverPastRefusalLeavesNoSockets: a dial attempt that is
// refused has its socket closed when the connection moves on to the next
// endpoint, not only when the connection ends (which closes the last
// attempt's).
func TestTCPFailoverPastRefusalLeavesNoSockets(t *testing.T) {
	live := startTCPBackend(t, "live")
	clock := newFakeClock()
	p := newTestProxier(t, Config{Clock: clock})
	name := spn("refusedfirst", "", state.TCP)
	dead := deadAddr(t)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(dead, live.addr())})
	addr := proxyAddr(t, p, name)
	sockets, goroutines := openSockets(t), runtime.NumGoroutine()
	for i := range 3 {
		clock.Step(DefaultEndpointPenalty + time.Second) // past the refusing one's penalty
		firstTurn(t, p, name, dead)
		if got := tcpWho(t, addr); got != "live" {
			t.Fatalf("connection %d reached %q, want live", i, got)
		}
	}
	if f := p.Stats().TCPDialFailures.Load(); f != 3 {
		t.Fatalf("%d dial failures, want 3: each connection tried the refusing endpoint first", f)
	}
	noLeaks(t, sockets, goroutines)
}

// TestTCPRaceWonClosesTheCurrentAttempt: an earlier attempt that timed
// out and then connects wins, and the current attempt's socket, still
// connecting, is closed (it never carried data), not left open.
func TestTCPRaceWonClosesTheCurrentAttempt(t *testing.T) {
	slow := newHeldEndpoint(t, "slow")
	stuck, _ := synDroppingEndpoint(t)
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{200 * time.Millisecond, 20 * time.Second}})
	name := spn("racewon", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(slow.ep, stuck)})
	firstTurn(t, p, name, slow.ep)
	sockets, goroutines := openSockets(t), runtime.NumGoroutine()
	done := whoLater(proxyAddr(t, p, name))
	settleSynSent(t, "the second attempt connecting", stuck)
	slow.serve(t, nil) // the first attempt's next SYN connects
	got := <-done
	if got.who != "slow" {
		t.Fatalf("reached %q (%v), want slow", got.who, got.err)
	}
	s := p.Stats().Snapshot()
	if s.TCPDialFailures != 0 || s.TCPDialGiveUps != 0 {
		t.Errorf("%d dial failures and %d give-ups, want none: the attempt that lost was closed, not failed", s.TCPDialFailures, s.TCPDialGiveUps)
	}
	noLeaks(t, sockets, goroutines)
}

// TestTCPRaceWonWithDataAndFINAtOnce: an earlier attempt whose connect,
// its endpoint's first bytes and its FIN are all reported by one event
// (its loop was held up meanwhile, as a long round holds it up) passes
// the bytes and then the FIN on: edge-triggered epoll reports none of
// them again.
func TestTCPRaceWonWithDataAndFINAtOnce(t *testing.T) {
	slow := newHeldEndpoint(t, "slow")
	stuck, _ := synDroppingEndpoint(t)
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{200 * time.Millisecond, 20 * time.Second}})
	name := spn("raceburst", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(slow.ep, stuck)})
	firstTurn(t, p, name, slow.ep)
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	settleSynSent(t, "the second attempt connecting", stuck)

	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	for _, lp := range p.loops {
		stalled := make(chan struct{})
		go lp.do(func() {
			close(stalled)
			<-release
		})
		<-stalled
	}
	answered := make(chan struct{})
	slow.serve(t, func(ec net.Conn) {
		// Connected, with the loops held up: the greeting and the FIN
		// come before they look.
		fmt.Fprintf(ec, "hello\n")
		ec.(*net.TCPConn).CloseWrite()
		close(answered)
		<-release // then silent and open until the test ends
	})
	select {
	case <-answered:
	case <-time.After(20 * time.Second):
		t.Fatal("the first attempt's retransmitted SYN never reached the endpoint")
	}
	released = true
	close(release)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if string(got) != "hello\n" || err != nil {
		t.Fatalf("the client read %q and then %v, want the endpoint's greeting and EOF", got, err)
	}
}

// TestTCPEndpointsGoneWhileRacingRefused: when the current attempt is
// refused after the Service's endpoints went, while an earlier attempt
// that timed out still connects, that attempt goes on (as in
// ServiceDeletedWhileRacing of TestTCPDialRace): the connection is not
// reset for want of endpoints, and reaches the earlier attempt's
// endpoint once it answers.
func TestTCPEndpointsGoneWhileRacingRefused(t *testing.T) {
	slow := newHeldEndpoint(t, "slow")
	refusing := newHeldEndpoint(t, "refusing")
	// A third attempt, so that the refusal leaves one to make.
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{200 * time.Millisecond, 20 * time.Second, 20 * time.Second}})
	name := spn("goneracing", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(slow.ep, refusing.ep)})
	firstTurn(t, p, name, slow.ep)
	done := whoLater(proxyAddr(t, p, name))
	settleSynSent(t, "the second attempt connecting", refusing.ep)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80}) // the endpoints go
	refusing.refuse()                                        // its next SYN is refused
	settleDialFailures(t, p, 1)
	slow.serve(t, nil)
	got := <-done
	if got.who != "slow" {
		t.Errorf("reached %q (%v), want slow: the first attempt was still connecting", got.who, got.err)
	}
	if s := p.Stats().Snapshot(); s.TCPNoEndpoints != 0 || s.TCPDialGiveUps != 0 {
		t.Errorf("%d connections without endpoints and %d give-ups, want none", s.TCPNoEndpoints, s.TCPDialGiveUps)
	}
}

// TestTCPRacerRefused: an attempt that timed out and races on, and is
// then refused, is counted as failed, and only it ends: the current
// attempt goes on and connects. When it was the last attempt still
// connecting (the current one had been refused), the connection is
// given up at once, not when the last attempt's time would have been up.
func TestTCPRacerRefused(t *testing.T) {
	t.Run("CurrentGoesOn", func(t *testing.T) {
		racer := newHeldEndpoint(t, "racer")
		current := newHeldEndpoint(t, "current")
		p := newTestProxier(t, Config{DialTimeouts: []time.Duration{200 * time.Millisecond, 20 * time.Second}})
		name := spn("racerrefused", "", state.TCP)
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(racer.ep, current.ep)})
		firstTurn(t, p, name, racer.ep)
		done := whoLater(proxyAddr(t, p, name))
		settleSynSent(t, "the second attempt connecting", current.ep)
		racer.refuse()
		settleDialFailures(t, p, 1)
		current.serve(t, nil)
		got := <-done
		if got.who != "current" {
			t.Errorf("reached %q (%v), want current", got.who, got.err)
		}
		if s := p.Stats().Snapshot(); s.TCPDialFailures != 1 || s.TCPDialGiveUps != 0 {
			t.Errorf("%d dial failures and %d give-ups, want 1 (the refused racer) and 0", s.TCPDialFailures, s.TCPDialGiveUps)
		}
	})
	t.Run("LastOneLeft", func(t *testing.T) {
		logs := captureLog(t, "2")
		racer := newHeldEndpoint(t, "racer")
		p := newTestProxier(t, Config{DialTimeouts: []time.Duration{200 * time.Millisecond, 20 * time.Second}})
		name := spn("racerlast", "", state.TCP)
		dead := deadAddr(t)
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(racer.ep, dead)})
		firstTurn(t, p, name, racer.ep)
		c, err := net.Dial("tcp4", proxyAddr(t, p, name))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		settleDialFailures(t, p, 1) // the second attempt, refused at once
		racer.refuse()
		start := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !isReset(err) || time.Since(start) > 10*time.Second {
			t.Fatalf("the client read %v after %v, want a reset once the racer was refused (1 s or 3 s)", err, time.Since(start))
		}
		if s := p.Stats().Snapshot(); s.TCPDialFailures != 2 || s.TCPDialGiveUps != 1 {
			t.Errorf("%d dial failures and %d give-ups, want 2 and 1", s.TCPDialFailures, s.TCPDialGiveUps)
		}
		if line := logs.lineWith("Every dial attempt failed; resetting connection"); !strings.Contains(line, `err="connection refused"`) {
			t.Errorf("the give-up was logged as %q, want err=\"connection refused\"", line)
		}
	})
	// The racer times out instead: the give-up, when the last attempt's
	// time would have been up, says why the last attempt failed.
	t.Run("LastOneTimesOut", func(t *testing.T) {
		logs := captureLog(t, "2")
		stuck, _ := synDroppingEndpoint(t)
		p := newTestProxier(t, Config{DialTimeouts: []time.Duration{200 * time.Millisecond, 500 * time.Millisecond}})
		name := spn("racertimeout", "", state.TCP)
		dead := deadAddr(t)
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(stuck, dead)})
		firstTurn(t, p, name, stuck)
		if err := connectAndRead(proxyAddr(t, p, name)); !isReset(err) {
			t.Fatalf("the client read %v, want a reset", err)
		}
		if s := p.Stats().Snapshot(); s.TCPDialFailures != 2 || s.TCPDialGiveUps != 1 {
			t.Errorf("%d dial failures and %d give-ups, want 2 and 1", s.TCPDialFailures, s.TCPDialGiveUps)
		}
		if line := logs.lineWith("Every dial attempt failed; resetting connection"); !strings.Contains(line, `err="connection refused"`) {
			t.Errorf("the give-up was logged as %q, want err=\"connection refused\": why the last attempt failed", line)
		}
	})
}

// TestTCPTimedOutEndpointPassedOverWithAffinity: with ClientIP affinity
// on an endpoint that does not answer, the next attempt goes to another
// endpoint, not to the one the client's affinity still names.
func TestTCPTimedOutEndpointPassedOverWithAffinity(t *testing.T) {
	stuck, _ := synDroppingEndpoint(t)
	live := startTCPBackend(t, "live")
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{200 * time.Millisecond, 2 * time.Second}})
	name := spn("stickyhole", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(stuck, live.addr()),
		Affinity: state.Affinity{Type: state.AffinityClientIP}})
	firstTurn(t, p, name, stuck)
	addr := proxyAddr(t, p, name)
	for i := range 2 {
		if got := tcpWho(t, addr); got != "live" {
			t.Fatalf("connection %d reached %q, want live", i, got)
		}
	}
	if g := p.Stats().TCPDialGiveUps.Load(); g != 0 {
		t.Errorf("%d give-ups, want 0", g)
	}
}

// TestTCPRacerEvictionTakesTheOldest: every attempt of
// DefaultDialTimeouts goes on connecting until the last one's time is up;
// with one attempt more, the attempt that times out when every racer's
// slot is taken takes the oldest racer's: that attempt's socket is closed
// and it counts as failed, and the newer ones go on connecting.
func TestTCPRacerEvictionTakesTheOldest(t *testing.T) {
	n := len(DefaultDialTimeouts) + 1
	var holes []netip.AddrPort
	for range n {
		ep, _ := synDroppingEndpoint(t)
		holes = append(holes, ep)
	}
	timeouts := make([]time.Duration, n)
	for i := range timeouts {
		timeouts[i] = 100 * time.Millisecond
	}
	timeouts[len(timeouts)-1] = time.Minute
	p := newTestProxier(t, Config{DialTimeouts: timeouts})
	name := spn("evict", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(holes...)})
	firstTurn(t, p, name, holes[0])
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	settle(t, "the last attempt connecting, and the oldest racer gone", func() error {
		var counts []int
		for _, ep := range holes {
			n, err := synSentTo(ep)
			if err != nil {
				return err
			}
			counts = append(counts, n)
		}
		if counts[0] != 0 || slices.Contains(counts[1:], 0) {
			return fmt.Errorf("connections in SYN_SENT to each endpoint, the first tried first: %v; want 0 to the first, 1 to each other", counts)
		}
		return nil
	})
	if f := p.Stats().TCPDialFailures.Load(); f != 1 {
		t.Errorf("%d dial failures, want 1: the racer that gave way", f)
	}
}

// TestTCPRaceWonMovesAffinity: with ClientIP affinity, when an earlier
// attempt that timed out connects first, while the current attempt, to
// another endpoint, still connects, the client goes to the winner's
// endpoint from then on, not to the current attempt's, which the pick of
// that attempt had recorded.
func TestTCPRaceWonMovesAffinity(t *testing.T) {
	slow := newHeldEndpoint(t, "slow")
	stuck, _ := synDroppingEndpoint(t)
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{200 * time.Millisecond, 20 * time.Second}})
	name := spn("racesticky", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(slow.ep, stuck),
		Affinity: state.Affinity{Type: state.AffinityClientIP}})
	firstTurn(t, p, name, slow.ep)
	done := whoLater(proxyAddr(t, p, name))
	settleSynSent(t, "the second attempt connecting", stuck)
	slow.serve(t, nil)
	if got := <-done; got.who != "slow" {
		t.Fatalf("reached %q (%v), want slow", got.who, got.err)
	}
	p.mu.Lock()
	b := p.services[name].internal
	p.mu.Unlock()
	b.mu.Lock()
	e := b.clients[netip.MustParseAddr("127.0.0.1")]
	b.mu.Unlock()
	if e.endpoint != slow.ep {
		t.Errorf("the client's affinity is %v, want the winner, %v", e.endpoint, slow.ep)
	}
}

// TestTCPFailoverStartsWithNothingRead: the attempt after a refused one
// starts with nothing said of its socket: the refusal's events (its
// hang-up) are not taken for the new endpoint's. An endpoint reached
// after a refusal that later resets, its data waiting for a client that
// reads nothing, is a reset without a FIN before it: its connection ends
// resetDrain later, not after finDrainStall.
func TestTCPFailoverStartsWithNothingRead(t *testing.T) {
	clock := newFakeClock()
	p := newTestProxier(t, Config{Clock: clock})
	name := spn("afterrefusal", "", state.TCP)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dead := deadAddr(t)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(dead, ln.Addr().(*net.TCPAddr).AddrPort())})
	firstTurn(t, p, name, dead)
	c, endpoint := proxiedPair(t, p, name, ln) // the client reads nothing
	if f := p.Stats().TCPDialFailures.Load(); f != 1 {
		t.Fatalf("%d dial failures, want 1: the refusing endpoint first", f)
	}
	full := make(chan struct{})
	sent := make(chan error, 1)
	go func() { sent <- fillUntilBlocked(endpoint, 300*time.Millisecond, full) }()
	select {
	case <-full:
	case <-time.After(20 * time.Second):
		t.Fatal("the endpoint never filled the way to the client")
	}
	endpoint.SetLinger(0)
	endpoint.Close() // a reset, no FIN before it
	<-sent
	settleWithin(t, resetDrain+10*time.Second, "the connection ends", func() error {
		if a := p.Stats().TCPActive.Load(); a != 0 {
			return fmt.Errorf("%d connections active", a)
		}
		return nil
	})
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c); !isReset(err) {
		t.Errorf("the client read to %v, want a reset", err)
	}
}
