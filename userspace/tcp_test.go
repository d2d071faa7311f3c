package userspace

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func TestTCPProxy(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("web", "http", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	if got := tcpWho(t, proxyAddr(t, p, name)); got != "a" {
		t.Fatalf("reached %q, want a", got)
	}
}

func TestTCPRoundRobin(t *testing.T) {
	a, b, c := startTCPBackend(t, "a"), startTCPBackend(t, "b"), startTCPBackend(t, "c")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(a.addr(), b.addr(), c.addr())})
	addr := proxyAddr(t, p, name)
	counts := map[string]int{}
	prev := ""
	for range 30 {
		got := tcpWho(t, addr)
		if got == prev {
			t.Fatalf("%s served twice in a row", got)
		}
		prev = got
		counts[got]++
	}
	if counts["a"] != 10 || counts["b"] != 10 || counts["c"] != 10 {
		t.Fatalf("uneven round robin: %v", counts)
	}
}

func TestTCPAffinity(t *testing.T) {
	a, b := startTCPBackend(t, "a"), startTCPBackend(t, "b")
	clock := newFakeClock()
	p := newTestProxier(t, Config{Clock: clock})
	name := spn("web", "", state.TCP)
	svc := state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(a.addr(), b.addr()),
		Affinity: state.Affinity{Type: state.AffinityClientIP, Timeout: time.Minute}}
	mustApply(t, p, svc)
	addr := proxyAddr(t, p, name)
	first := tcpWho(t, addr)
	for range 5 {
		if got := tcpWho(t, addr); got != first {
			t.Fatalf("ClientIP affinity broken: %s then %s", first, got)
		}
	}
	// Expiry: a minute and a second later the client is round-robined again.
	clock.Step(61 * time.Second)
	if got := tcpWho(t, addr); got == first {
		t.Fatalf("affinity outlived its timeout: still %s", got)
	}
	// Shortening the timeout on the live service applies at once.
	sticky := tcpWho(t, addr)
	svc.Affinity.Timeout = 5 * time.Second
	mustApply(t, p, svc)
	if got := tcpWho(t, addr); got != sticky {
		t.Fatalf("timeout change dropped affinity early: %s then %s", sticky, got)
	}
	clock.Step(6 * time.Second)
	if got := tcpWho(t, addr); got == sticky {
		t.Fatal("the new 5s timeout did not expire the client")
	}
	// Turning affinity off makes it plain round robin.
	svc.Affinity = state.Affinity{Type: state.AffinityNone}
	mustApply(t, p, svc)
	if x, y := tcpWho(t, addr), tcpWho(t, addr); x == y {
		t.Fatalf("affinity None still sticky: %s twice", x)
	}
}

// deadAddr returns a loopback address where nothing listens, outside the
// ephemeral range so that no proxy port can take it meanwhile.
func deadAddr(t *testing.T) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t))
}

func TestTCPFailover(t *testing.T) {
	live := startTCPBackend(t, "live")
	dead := deadAddr(t)
	clock := newFakeClock()
	name := spn("web", "", state.TCP)
	for _, aff := range []state.AffinityType{state.AffinityNone, state.AffinityClientIP} {
		t.Run(string(aff), func(t *testing.T) {
			p := newTestProxier(t, Config{Clock: clock})
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(dead, live.addr()),
				Affinity: state.Affinity{Type: aff}})
			addr := proxyAddr(t, p, name)
			for i := range 10 {
				if got := tcpWho(t, addr); got != "live" {
					t.Fatalf("connection %d reached %q", i, got)
				}
			}
			// Round robin reaches the dead endpoint within two connections;
			// after that failure it is passed over while its penalty lasts
			// (the fake clock does not move).
			// With ClientIP the client may have been pinned to the live one
			// from the start.
			if f := p.Stats().TCPDialFailures.Load(); f != 1 && !(aff == state.AffinityClientIP && f == 0) {
				t.Fatalf("dial failures = %d, want 1", f)
			}
			clock.Step(DefaultEndpointPenalty + time.Second)
			for range 2 {
				tcpWho(t, addr)
			}
			if f := p.Stats().TCPDialFailures.Load(); f != 2 && aff == state.AffinityNone {
				t.Fatalf("after the penalty ended, dial failures = %d, want 2 (dead endpoint retried once)", f)
			}
		})
	}
}

func TestTCPFailoverGivesUp(t *testing.T) {
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(deadAddr(t), deadAddr(t))})
	if err := connectAndRead(proxyAddr(t, p, name)); !isReset(err) {
		t.Fatalf("connection after every endpoint failed: %v, want a reset", err)
	}
	if n := p.Stats().TCPDialGiveUps.Load(); n != 1 {
		t.Fatalf("give-ups = %d, want 1", n)
	}
}

// TestConnectionEndIsLogged: at -v=4 a proxied connection's end is logged
// with the bytes it carried each way, for following one connection while
// debugging or teaching. tcpWho reads a 2-byte greeting, sends 5 bytes and
// reads their echo.
func TestConnectionEndIsLogged(t *testing.T) {
	logs := captureLog(t, "4")
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	tcpWho(t, proxyAddr(t, p, name))
	const want = `"Connection ended" service="test/web/TCP" client="127.0.0.1:`
	settle(t, "the end is logged", func() error {
		klog.Flush()
		line := logs.lineWith(`"Connection ended"`)
		switch {
		case line == "":
			return errors.New("no line yet")
		case !strings.Contains(line, want) || !strings.Contains(line, fmt.Sprintf(`endpoint="%s" bytesToEndpoint=5 bytesToClient=7`, be.addr())) ||
			!strings.Contains(line, "reset=false"):
			return fmt.Errorf("got %s", line)
		}
		return nil
	})
}

// TestConnectionResetSaysWhy: at -v=4 a connection that ended with a reset
// says which side reset it.
func TestConnectionResetSaysWhy(t *testing.T) {
	logs := captureLog(t, "4")
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an endpoint that reads a request, then resets
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Read(make([]byte, 16))
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}()
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 16)); !isReset(err) {
		t.Fatalf("read after the endpoint reset: %v, want a reset", err)
	}
	settle(t, "the end is logged", func() error {
		klog.Flush()
		line := logs.lineWith(`"Connection ended"`)
		if !strings.Contains(line, `reset=true reason="the endpoint reset the connection"`) {
			return fmt.Errorf("got %q", line)
		}
		return nil
	})
}

// TestEndpointChangesAreLogged: -v=2 names the endpoints new connections
// use whenever they change, and losing the last one (or getting one back)
// is said at every verbosity.
func TestEndpointChangesAreLogged(t *testing.T) {
	logs := captureLog(t, "2")
	a, b := startTCPBackend(t, "a"), startTCPBackend(t, "b")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	for _, e := range [][]state.Endpoint{eps(a.addr(), b.addr()), eps(b.addr()), nil, eps(a.addr())} {
		mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: e})
	}
	klog.Flush()
	for _, want := range []string{
		fmt.Sprintf(`"Endpoints changed" service="test/web/TCP" endpoints=["%s"]`, b.addr()),
		`"Service port has no endpoints now; new connections are reset by the proxy" service="test/web/TCP"`,
		`"Endpoints changed" service="test/web/TCP" endpoints=[]`,
		`"Service port has endpoints now" service="test/web/TCP" endpoints=1`,
		fmt.Sprintf(`"Endpoints changed" service="test/web/TCP" endpoints=["%s"]`, a.addr()),
	} {
		if logs.lineWith(want) == "" {
			t.Errorf("no log line with %s", want)
		}
	}
}

// TestOutageSaysWhatThePortalDoes: the line that says a service port lost
// its endpoints says what becomes of new connections with the portal in
// use: the iptables portal (Config.PortalRefuses) refuses them (REJECT)
// when the port has no endpoint anywhere and drops them (DROP) when a
// Local policy finds none on this node; without it the proxy resets TCP
// connections and drops datagrams. A port whose last endpoint goes says
// it once, not again for its external traffic. It said "reset and
// datagrams dropped" whatever the portal did.
func TestOutageSaysWhatThePortalDoes(t *testing.T) {
	here := state.Endpoint{Addr: netip.MustParseAddrPort("127.0.0.1:1"), Ready: true, Serving: true, Local: true}
	there := state.Endpoint{Addr: netip.MustParseAddrPort("198.18.0.2:1"), Ready: true, Serving: true}
	for _, tc := range []struct {
		name     string
		refuses  bool
		proto    state.Protocol
		itp, etp bool
		after    []state.Endpoint // the cluster endpoints left; none is on this node
		want     []string
		not      string
	}{
		{"iptables, none left", true, state.TCP, false, true, nil,
			[]string{"Service port has no endpoints now; new connections are refused (the portal's REJECT rule), as kube-proxy refuses them"}, "on this node"},
		{"iptables, UDP, none left", true, state.UDP, true, true, nil,
			[]string{"Service port has no endpoints now; datagrams are refused (the portal's REJECT rule), as kube-proxy refuses them"}, "on this node"},
		{"none, none left", false, state.TCP, false, true, nil,
			[]string{"Service port has no endpoints now; new connections are reset by the proxy"}, "on this node"},
		{"none, UDP, none left", false, state.UDP, false, false, nil,
			[]string{"Service port has no endpoints now; datagrams are dropped by the proxy"}, "on this node"},
		{"iptables, external Local, others elsewhere", true, state.TCP, false, true, []state.Endpoint{there},
			[]string{"Service port has no endpoints on this node now; its external traffic (externalTrafficPolicy: Local) from other hosts: new connections are dropped (the portal's DROP rule), as kube-proxy drops them; from this node it goes to every endpoint"}, "REJECT"},
		{"iptables, internal Local, others elsewhere", true, state.TCP, true, false, []state.Endpoint{there},
			[]string{"Service port has no endpoints on this node now; its internal traffic (internalTrafficPolicy: Local): new connections are dropped (the portal's DROP rule)"}, "REJECT"},
		{"bind, UDP, external Local, others elsewhere", false, state.UDP, false, true, []state.Endpoint{there},
			[]string{"its external traffic (externalTrafficPolicy: Local) from other hosts: datagrams are dropped by the proxy; from this node it goes to every endpoint"}, "DROP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := captureLog(t, "0")
			p := newTestProxier(t, Config{PortalRefuses: tc.refuses})
			port := func(cluster, local []state.Endpoint) state.ServicePort {
				return state.ServicePort{Name: spn("web", "", tc.proto), Port: 80, NodePort: 30080, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.10")},
					InternalLocal: tc.itp, ExternalLocal: tc.etp, ClusterEndpoints: cluster, LocalEndpoints: local}
			}
			mustApply(t, p, port([]state.Endpoint{here, there}, []state.Endpoint{here}))
			mustApply(t, p, port(tc.after, nil))
			klog.Flush()
			for _, want := range tc.want {
				if logs.lineWith(want) == "" {
					t.Errorf("no log line with %q:\n%s", want, logs.b.String())
				}
			}
			if line := logs.lineWith(tc.not); line != "" {
				t.Errorf("logged %q", line)
			}
		})
	}
}

// TestRefusedEndpointIsDialledOnce: an endpoint that refuses at once is
// not dialled again for the same client (it would refuse again); the
// client gets its reset after one attempt. Timeouts are retried (see the
// failover tests): a lost SYN may get through the next time.
func TestRefusedEndpointIsDialledOnce(t *testing.T) {
	logs := captureLog(t, "0")
	dead := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t)) // nothing listens there
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(dead)})
	if err := connectAndRead(proxyAddr(t, p, name)); !isReset(err) {
		t.Fatalf("connection to a service whose only endpoint refuses: %v, want a reset", err)
	}
	settle(t, "the dial is given up", func() error {
		if n := p.Stats().TCPDialGiveUps.Load(); n != 1 {
			return fmt.Errorf("%d give-ups", n)
		}
		return nil
	})
	if n := p.Stats().TCPDialFailures.Load(); n != 1 {
		t.Fatalf("%d dials to the refusing endpoint, want 1", n)
	}
	// Said even at the default verbosity: an outage must not be silent.
	klog.Flush()
	if logs.lineWith(`"Every dial attempt failed; connections are reset (each is logged at -v=2); said at most once a minute" err="`) == "" {
		t.Error("the failed dials were not logged at -v=0")
	}
}

func TestTCPNoEndpointsResets(t *testing.T) {
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80})
	start := time.Now()
	if err := connectAndRead(proxyAddr(t, p, name)); !isReset(err) {
		t.Fatalf("connection to a service without endpoints: %v, want a reset", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("reset took %v, want immediate", d)
	}
	// Counted before the reset is sent.
	if s := p.Stats().Snapshot(); s.TCPNoEndpoints != 1 || s.TCPDialFailures != 0 || s.TCPDialGiveUps != 0 {
		t.Fatalf("no endpoints %d, dial failures %d, give-ups %d; want 1, 0 and 0", s.TCPNoEndpoints, s.TCPDialFailures, s.TCPDialGiveUps)
	}
}

// TestTCPHalfClose: the client sends, shuts down its write side, and still
// reads the whole reply, which the backend only sends after EOF.
func TestTCPHalfClose(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		body, _ := io.ReadAll(c) // until the client's FIN arrives through the proxy
		sum := sha256.Sum256(body)
		c.Write(sum[:])
		c.Write(body)
	}()
	p := newTestProxier(t, Config{})
	name := spn("sum", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := make([]byte, 3<<20)
	rand.Read(body)
	go func() {
		c.Write(body)
		c.(*net.TCPConn).CloseWrite()
	}()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	reply, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read reply after half-close: %v", err)
	}
	sum := sha256.Sum256(body)
	if len(reply) != 32+len(body) || !bytes.Equal(reply[:32], sum[:]) || !bytes.Equal(reply[32:], body) {
		t.Fatalf("reply of %d bytes does not match the %d bytes sent", len(reply), len(body))
	}
}

// TestTCPHalfCloseBounded: a backend that never answers or closes after the
// client's FIN does not keep the connection open beyond the bound.
func TestTCPHalfCloseBounded(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			held <- c // never written to, never closed until the test ends
		}
	}()
	p := newTestProxier(t, Config{TCPHalfCloseTimeout: 200 * time.Millisecond})
	name := spn("silent", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err = c.Read(make([]byte, 1))
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("half-closed silent connection: read returned %v after %v", err, time.Since(start))
	}
	if n := p.Stats().HalfCloseTimeouts.Load(); n != 1 {
		t.Fatalf("half-close timeouts = %d, want 1", n)
	}
	select {
	case bc := <-held:
		bc.Close()
	default:
	}
}

// TestTCPBulkIntegrity pushes data both ways at once through the splice
// path and checks every byte.
func TestTCPBulkIntegrity(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
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
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	p := newTestProxier(t, Config{})
	name := spn("echo", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", proxyAddr(t, p, name))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			body := make([]byte, 4<<20)
			rand.Read(body)
			go func() { c.Write(body); c.(*net.TCPConn).CloseWrite() }()
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			got, err := io.ReadAll(c)
			if err != nil || !bytes.Equal(got, body) {
				t.Errorf("echo of %d bytes: got %d bytes, err %v", len(body), len(got), err)
			}
		}()
	}
	wg.Wait()
}

// TestTCPBackendResetReachesClient: a backend reset is passed on as a reset.
func TestTCPBackendResetReachesClient(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		bufio.NewReader(c).ReadString('\n')
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}()
	p := newTestProxier(t, Config{})
	name := spn("rst", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("go\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("after a backend reset the client read %v, want a reset", err)
	}
}

// TestNoLeaksAfter10000Connections proxies 10,000 connections and checks that
// goroutines and file descriptors return to their baseline.
func TestNoLeaksAfter10000Connections(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	addr := proxyAddr(t, p, name)
	tcpWho(t, addr) // warm up pools
	noneActive := func() error {
		if a := p.Stats().TCPActive.Load(); a != 0 {
			return errorf("%d connections still active", a)
		}
		return nil
	}
	settle(t, "warm-up connection done", noneActive)
	baseG, baseFD := runtime.NumGoroutine(), openFDs(t)

	const total, workers = 10000, 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += workers {
				if _, err := tcpWhoErr(addr); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := p.Stats().TCPAccepted.Load(); got < total {
		t.Fatalf("accepted %d connections, want at least %d", got, total)
	}
	settle(t, "goroutines back to baseline", func() error {
		if g := runtime.NumGoroutine(); g > baseG {
			return errorf("%d goroutines, baseline %d", g, baseG)
		}
		return nil
	})
	settle(t, "fds back to baseline", func() error {
		// Allow the few idle pipes the splice pool keeps for reuse.
		if fd := openFDs(t); fd > baseFD+2*64 { // the splice pool keeps up to 64 idle pipes
			return errorf("%d fds, baseline %d", fd, baseFD)
		}
		return nil
	})
	settle(t, "no connection counted active", noneActive)
}

// connectAndRead connects and reads one byte; the reset of a proxy that has
// nowhere to send the connection shows up in either step.
func connectAndRead(addr string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	return err
}
