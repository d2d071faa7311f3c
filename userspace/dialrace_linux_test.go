//go:build linux

package userspace

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netnstest"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// The dial race tests need endpoints that are slow to connect, for real:
// this kernel has no sch_netem, so they drop SYNs with iptables, in a
// network namespace of their own (see inOwnNetns). Addresses on its
// loopback device:
const (
	raceSlowAddr  = "198.18.0.1" // each connection's first SYN is dropped: the kernel's retransmit, 1 s later, connects
	raceHoleAddr  = "198.18.0.2" // every SYN is dropped
	raceHoleAddr2 = "198.18.0.4" // every SYN is dropped
	raceFineAddr  = "198.18.0.3" // untouched
)

// raceNetnsEnv names, in a test binary run again inside a namespace, the
// test it runs there; raceHostNetnsEnv carries the outer run's namespace,
// so the inner run can make sure it is somewhere else before it changes
// anything.
const (
	raceNetnsEnv     = "KUSP_DIALRACE_NETNS_TEST"
	raceHostNetnsEnv = "KUSP_DIALRACE_HOST_NETNS"
)

var (
	raceNetnsSeq   atomic.Int32
	raceNetnsSweep sync.Once
)

// inOwnNetns runs the calling (top-level) test again in a network
// namespace it creates for it, set up for the dial race tests, and
// reports whether the caller is that inner run, which goes on with the
// test; the outer run reports the inner one's result and returns false.
// Nothing changes in the namespace the tests were started in. Without
// root, ip or iptables it skips, except under CI=true, where it fails.
func inOwnNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(raceNetnsEnv) == t.Name() {
		here, err := os.Readlink("/proc/self/ns/net")
		if err != nil || here == os.Getenv(raceHostNetnsEnv) {
			t.Fatalf("not in a namespace of our own (%q, %v): refusing to change the network", here, err)
		}
		setUpRaceNetns(t)
		return true
	}
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root: a network namespace and iptables")
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipOrFail(t, "needs %s: %v", tool, err)
		}
	}
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		skipOrFail(t, "cannot read this network namespace: %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	raceNetnsSweep.Do(func() { netnstest.SweepStale("kup-dialrace-") })
	name := fmt.Sprintf("kup-dialrace-%d-%d", os.Getpid(), raceNetnsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		skipOrFail(t, "ip netns add %s: %v: %s", name, err, out)
	}
	defer func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	}()
	cmd := exec.Command("ip", "netns", "exec", name, self,
		"-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), raceNetnsEnv+"="+t.Name(), raceHostNetnsEnv+"="+host)
	out, err := cmd.CombinedOutput()
	t.Logf("in namespace %s:\n%s", name, out)
	switch {
	case err != nil:
		t.Fatalf("the test failed in its namespace: %v", err)
	case !strings.Contains(string(out), "--- PASS: "+t.Name()):
		if strings.Contains(string(out), "--- SKIP: "+t.Name()) {
			skipOrFail(t, "skipped in its namespace")
		}
		t.Fatal("the test did not run in its namespace")
	}
	return false
}

// setUpRaceNetns puts the test addresses on the namespace's loopback
// device and drops SYNs to them as their names say. The first SYN of a
// connection is told from its retransmits by hashlimit, per source
// address and port: the first packet takes the one token, later ones are
// "above" the rate. (connbytes cannot tell them: conntrack leaves a
// retransmitted SYN uncounted, so every SYN is packet 1; seen on 6.18.)
func setUpRaceNetns(t *testing.T) {
	t.Helper()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "link", "set", "lo", "up")
	for _, a := range []string{raceSlowAddr, raceHoleAddr, raceHoleAddr2, raceFineAddr} {
		run("ip", "addr", "add", a+"/32", "dev", "lo")
	}
	run("iptables", "-A", "INPUT", "-d", raceSlowAddr, "-p", "tcp", "--syn",
		"-m", "hashlimit", "--hashlimit-above", "1/hour", "--hashlimit-burst", "1",
		"--hashlimit-mode", "srcip,srcport", "--hashlimit-name", "dialrace", "-j", "ACCEPT")
	for _, a := range []string{raceSlowAddr, raceHoleAddr, raceHoleAddr2} {
		run("iptables", "-A", "INPUT", "-d", a, "-p", "tcp", "--syn", "-j", "DROP")
	}
}

// timedWho is tcpWho, timed.
func timedWho(t *testing.T, addr string) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	name := tcpWho(t, addr)
	return name, time.Since(start)
}

// TestTCPDialRace: a dial attempt that times out keeps connecting while
// the next attempt starts, and the first to connect wins, in both builds.
func TestTCPDialRace(t *testing.T) {
	if !inOwnNetns(t) {
		return
	}
	hole := netip.MustParseAddrPort(raceHoleAddr + ":80")
	hole2 := netip.MustParseAddrPort(raceHoleAddr2 + ":80")

	// An endpoint whose connects take 1 s (each first SYN is lost) is
	// reached in about 1 s, as a direct client reaches it, where
	// abandoning each attempt at its timeout took 2.75 s: every new
	// socket's first SYN was lost again, and only the fourth attempt's
	// retransmit, at 1.75 s + 1 s, got through.
	t.Run("FirstSYNLost", func(t *testing.T) {
		slow := startTCPBackendOn(t, "slow", raceSlowAddr+":0")
		if _, d := timedWho(t, slow.addr().String()); d < 900*time.Millisecond {
			t.Fatalf("a direct connection took %v: the first SYN was not dropped", d)
		} else {
			t.Logf("direct: %v", d.Round(time.Millisecond))
		}
		p := newTestProxier(t, Config{})
		name := spn("slow", "", state.TCP)
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(slow.addr())})
		addr := proxyAddr(t, p, name)
		for i := range 3 {
			got, d := timedWho(t, addr)
			t.Logf("connection %d through the proxy: %v", i, d.Round(time.Millisecond))
			if got != "slow" || d > 1800*time.Millisecond {
				t.Errorf("connection %d reached %q in %v; want slow, in about 1 s", i, got, d)
			}
		}
		// The first attempt won each time: the others, to the same
		// endpoint, did not fail it.
		if f := p.Stats().TCPDialFailures.Load(); f != 0 {
			t.Errorf("%d dial failures, want 0", f)
		}
	})

	// With an endpoint that never answers, connections still reach the
	// one that does, after the first attempt's 250 ms, and the silent one
	// is passed over once a connection went elsewhere.
	t.Run("BlackHolePassedOver", func(t *testing.T) {
		fine := startTCPBackendOn(t, "fine", raceFineAddr+":0")
		p := newTestProxier(t, Config{})
		name := spn("hole", "", state.TCP)
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(hole, fine.addr())})
		addr := proxyAddr(t, p, name)
		var slowest time.Duration
		for i := range 6 {
			got, d := timedWho(t, addr)
			t.Logf("connection %d: %v", i, d.Round(time.Millisecond))
			if got != "fine" || d > 700*time.Millisecond {
				t.Errorf("connection %d reached %q in %v; want fine, within 250 ms and a bit", i, got, d)
			}
			slowest = max(slowest, d)
		}
		if slowest < 250*time.Millisecond {
			t.Errorf("no connection waited for the first attempt's 250 ms: was the black hole ever tried?")
		}
		if f := p.Stats().TCPDialFailures.Load(); f != 1 {
			t.Errorf("%d dial failures, want 1: the black hole, once, then passed over", f)
		}
	})

	// With ClientIP affinity, an attempt that timed out and then won is
	// where the client goes next, not the endpoint the attempt raced.
	t.Run("AffinityFollowsTheWinner", func(t *testing.T) {
		slow := startTCPBackendOn(t, "slow", raceSlowAddr+":0")
		p := newTestProxier(t, Config{})
		name := spn("sticky", "", state.TCP)
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(slow.addr(), hole),
			Affinity: state.Affinity{Type: state.AffinityClientIP}})
		addr := proxyAddr(t, p, name)
		p.mu.Lock()
		b := p.services[name].internal
		p.mu.Unlock()
		for i := range 2 {
			got, d := timedWho(t, addr)
			t.Logf("connection %d: %v", i, d.Round(time.Millisecond))
			if got != "slow" || d > 1800*time.Millisecond {
				t.Fatalf("connection %d reached %q in %v; want slow, in about 1 s", i, got, d)
			}
			b.mu.Lock()
			e := b.clients[netip.MustParseAddr("127.0.0.1")]
			b.mu.Unlock()
			if e.endpoint != slow.addr() {
				t.Fatalf("after connection %d the client's affinity is %v, want %v", i, e.endpoint, slow.addr())
			}
		}
	})

	// An attempt still connecting when the next one is refused keeps the
	// time the attempts not made would have had. Before, it had only the
	// refused attempt's 500 ms, so a connection to the slow endpoint
	// (1 s) was reset at 750 ms whenever the slow one came first: every
	// time with ClientIP affinity on it.
	t.Run("SlowBesideRefusing", func(t *testing.T) {
		refusing := netip.MustParseAddrPort(raceFineAddr + ":9") // nothing listens there
		for _, aff := range []state.Affinity{{}, {Type: state.AffinityClientIP}} {
			slow := startTCPBackendOn(t, "slow", raceSlowAddr+":0")
			p := newTestProxier(t, Config{})
			name := spn("slowref", "", state.TCP)
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(slow.addr(), refusing), Affinity: aff})
			addr := proxyAddr(t, p, name)
			for i := range 4 {
				start := time.Now()
				got, err := tcpWhoErr(addr)
				d := time.Since(start)
				t.Logf("affinity %q, connection %d: %q in %v (%v)", aff.Type, i, got, d.Round(time.Millisecond), err)
				if err != nil || got != "slow" || d > 1800*time.Millisecond {
					t.Errorf("affinity %q, connection %d: reached %q in %v (%v); want slow, in about 1 s", aff.Type, i, got, d, err)
				}
			}
			if g := p.Stats().TCPDialGiveUps.Load(); g != 0 {
				t.Errorf("affinity %q: %d connections given up, want 0", aff.Type, g)
			}
		}
	})

	// When no endpoint ever answers, the connection is given up when the
	// last attempt's time is up (3.75 s with the default timeouts), the
	// client is reset, and every racing socket is closed.
	t.Run("AllBlackHoled", func(t *testing.T) {
		logs := captureLog(t, "2")
		p := newTestProxier(t, Config{})
		name := spn("void", "", state.TCP)
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(hole, hole2)})
		addr := proxyAddr(t, p, name)
		sockets, goroutines := openSockets(t), runtime.NumGoroutine()
		start := time.Now()
		err := connectAndRead(addr)
		d := time.Since(start)
		t.Logf("given up after %v: %v", d.Round(time.Millisecond), err)
		if !isReset(err) {
			t.Errorf("got %v, want a reset", err)
		}
		if d < 3700*time.Millisecond || d > 4500*time.Millisecond {
			t.Errorf("given up after %v, want 3.75 s", d)
		}
		st := p.Stats()
		if g, f := st.TCPDialGiveUps.Load(), st.TCPDialFailures.Load(); g != 1 || f != 4 {
			t.Errorf("%d give-ups and %d dial failures, want 1 and 4", g, f)
		}
		// Both builds give the kernel's word for it.
		if line := logs.lineWith("Every dial attempt failed"); !strings.Contains(line, `err="connection timed out"`) {
			t.Errorf("the give-up was logged as %q, want err=\"connection timed out\"", line)
		}
		noLeaks(t, sockets, goroutines)
	})

	// When a connection's Service is deleted while its attempts race, no
	// further attempt is made (its endpoints are no longer its to dial),
	// but those already connecting keep their time, as a SYN already
	// sent does under kube-proxy's kernel modes: a slow endpoint is still
	// reached, and black holes give up when the last attempt's time would
	// have been up.
	t.Run("ServiceDeletedWhileRacing", func(t *testing.T) {
		slow := startTCPBackendOn(t, "slow", raceSlowAddr+":0")
		for _, tc := range []struct {
			eps      []netip.AddrPort
			want     string // "" for a reset
			min, max time.Duration
			failures uint64
		}{
			{eps: []netip.AddrPort{slow.addr()}, want: "slow", min: 900 * time.Millisecond, max: 1800 * time.Millisecond},
			// Two attempts were made (at 0 and 250 ms), none after.
			{eps: []netip.AddrPort{hole, hole2}, min: 3700 * time.Millisecond, max: 4500 * time.Millisecond, failures: 2},
		} {
			p := newTestProxier(t, Config{})
			name := spn("gone", "", state.TCP)
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(tc.eps...)})
			addr := proxyAddr(t, p, name)
			sockets, goroutines := openSockets(t), runtime.NumGoroutine()
			start := time.Now()
			type outcome struct {
				who string
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				who, err := tcpWhoErr(addr)
				done <- outcome{who, err}
			}()
			// The second attempt runs from 250 ms to 750 ms, the first races it.
			time.Sleep(400 * time.Millisecond)
			mustApply(t, p)
			got := <-done
			d := time.Since(start)
			t.Logf("endpoints %v: %q after %v (%v)", tc.eps, got.who, d.Round(time.Millisecond), got.err)
			if got.who != tc.want || tc.want == "" && !isReset(got.err) {
				t.Errorf("endpoints %v: got %q (%v), want %q", tc.eps, got.who, got.err, cmp.Or(tc.want, "a reset"))
			}
			if d < tc.min || d > tc.max {
				t.Errorf("endpoints %v: took %v, want %v to %v", tc.eps, d, tc.min, tc.max)
			}
			if f := p.Stats().TCPDialFailures.Load(); f != tc.failures {
				t.Errorf("endpoints %v: %d dial failures, want %d", tc.eps, f, tc.failures)
			}
			noLeaks(t, sockets, goroutines)
		}
	})

	// A client that resets while its attempts race ends them at once, in
	// both builds: no attempt counts as failed, the connection is not
	// given up, and every socket is closed. The goroutine build dialed
	// on for nobody until the last attempt's time was up.
	t.Run("ClientResetWhileRacing", func(t *testing.T) {
		p := newTestProxier(t, Config{})
		name := spn("left", "", state.TCP)
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(hole, hole2)})
		addr := proxyAddr(t, p, name)
		sockets, goroutines := openSockets(t), runtime.NumGoroutine()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		// Two attempts race by now (at 0 and 250 ms).
		time.Sleep(400 * time.Millisecond)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		settleWithin(t, 2*time.Second, "the racing sockets closed", func() error {
			if n := openSockets(t); n > sockets {
				return fmt.Errorf("%d sockets open, %d before", n, sockets)
			}
			return nil
		})
		// Past the 3.75 s an attempt that went on would take.
		time.Sleep(4 * time.Second)
		st := p.Stats()
		if g, f := st.TCPDialGiveUps.Load(), st.TCPDialFailures.Load(); g != 0 || f != 0 {
			t.Errorf("%d give-ups and %d dial failures, want none: the client had left", g, f)
		}
		noLeaks(t, sockets, goroutines)
	})

	// Closing the proxier ends a connection whose attempts are racing,
	// and closes every one of their sockets.
	t.Run("CloseWhileRacing", func(t *testing.T) {
		sockets, goroutines := openSockets(t), runtime.NumGoroutine()
		p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1")})
		name := spn("void", "", state.TCP)
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(hole, hole2)})
		c, err := net.DialTimeout("tcp", proxyAddr(t, p, name), 5*time.Second)
		if err != nil {
			p.Close()
			t.Fatal(err)
		}
		defer c.Close()
		// Three attempts race by now (at 0, 250 and 750 ms).
		time.Sleep(time.Second)
		p.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
			t.Errorf("the client's read after Close: %v, want the connection ended", err)
		}
		c.Close()
		noLeaks(t, sockets, goroutines)
	})
}

// noLeaks waits until this process has no more sockets and goroutines
// than it had before. Sockets, not every descriptor: an idle event loop
// holds one more (see eventLoop.park).
func noLeaks(t *testing.T, sockets, goroutines int) {
	t.Helper()
	settle(t, "sockets and goroutines back to where they were", func() error {
		if n := openSockets(t); n > sockets {
			return fmt.Errorf("%d sockets open, %d before", n, sockets)
		}
		if n := runtime.NumGoroutine(); n > goroutines {
			return fmt.Errorf("%d goroutines, %d before", n, goroutines)
		}
		return nil
	})
}

// openSockets counts this process's open sockets.
func openSockets(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}
