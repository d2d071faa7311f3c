package userspace

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

func TestUDPProxy(t *testing.T) {
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("dns", "dns", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	c := dialUDP(t, proxyAddr(t, p, name))
	got, err := udpExchange(t, c, []byte("abc123"))
	if err != nil || string(got) != "abc123" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	// The reply must come from the address the client sent to.
	if c.RemoteAddr().String() != proxyAddr(t, p, name) {
		t.Fatalf("connected socket accepted a reply from elsewhere")
	}
}

func TestUDPRoundRobinAndAffinity(t *testing.T) {
	a, b := startUDPBackend(t, "a"), startUDPBackend(t, "b")
	p := newTestProxier(t, Config{})
	name := spn("dns", "", state.UDP)
	svc := state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(a.addr(), b.addr())}
	mustApply(t, p, svc)
	addr := proxyAddr(t, p, name)
	who := func() string {
		c := dialUDP(t, addr) // a new client port: a new session
		got, err := udpExchange(t, c, []byte("who"))
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		return string(got)
	}
	if x, y := who(), who(); x == y {
		t.Fatalf("two new sessions both went to %s", x)
	}
	svc.Affinity = state.Affinity{Type: state.AffinityClientIP}
	mustApply(t, p, svc)
	first := who()
	for range 5 {
		if got := who(); got != first {
			t.Fatalf("ClientIP affinity: %s then %s", first, got)
		}
	}
}

func TestUDPIdleTimeout(t *testing.T) {
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{UDPIdleTimeout: 100 * time.Millisecond, UDPReplyTimeout: 100 * time.Millisecond})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	c := dialUDP(t, proxyAddr(t, p, name))
	if _, err := udpExchange(t, c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if n := p.Stats().UDPSessionsActive.Load(); n != 1 {
		t.Fatalf("active sessions = %d, want 1", n)
	}
	settle(t, "session expired", func() error {
		if n := p.Stats().UDPSessionsActive.Load(); n != 0 {
			return fmt.Errorf("%d sessions still active", n)
		}
		return nil
	})
	// The same client gets a new session.
	if got, err := udpExchange(t, c, []byte("y")); err != nil || string(got) != "y" {
		t.Fatalf("after expiry: %q, %v", got, err)
	}
	if n := p.Stats().UDPSessionsOpened.Load(); n != 2 {
		t.Fatalf("sessions opened = %d, want 2", n)
	}
}

// TestUDPSessionEndIsLogged: at -v=4 a session's end says what went each
// way and how long it lasted, as a TCP connection's does.
func TestUDPSessionEndIsLogged(t *testing.T) {
	logs := captureLog(t, "4")
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{UDPIdleTimeout: 100 * time.Millisecond, UDPReplyTimeout: 100 * time.Millisecond})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	c := dialUDP(t, proxyAddr(t, p, name))
	for _, q := range []string{"abc", "defgh"} {
		if got, err := udpExchange(t, c, []byte(q)); err != nil || string(got) != q {
			t.Fatalf("echo of %q: %q, %v", q, got, err)
		}
	}
	want := fmt.Sprintf(`endpoint="%s" reason="it idled out" datagramsToEndpoint=2 bytesToEndpoint=8 datagramsToClient=2 bytesToClient=8 duration=`, be.addr())
	settle(t, "the end is logged", func() error {
		klog.Flush()
		line := logs.lineWith(`"UDP session ended"`)
		switch {
		case line == "":
			return errors.New("no line yet")
		case !strings.Contains(line, `service="test/dns/UDP" client="`+c.LocalAddr().String()+`"`) || !strings.Contains(line, want):
			return fmt.Errorf("got %s", line)
		}
		return nil
	})
}

// TestUDPSlowFirstReply: an endpoint that answers after the idle timeout
// still reaches the client, because an unanswered datagram gets the longer
// reply timeout (the legacy 250 ms idle timeout lost slow DNS answers).
func TestUDPSlowFirstReply(t *testing.T) {
	be := udpEchoAfter(t, 600*time.Millisecond)
	p := newTestProxier(t, Config{UDPIdleTimeout: 100 * time.Millisecond, UDPReplyTimeout: 3 * time.Second})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be)})
	c := dialUDP(t, proxyAddr(t, p, name))
	if got, err := udpExchange(t, c, []byte("slow")); err != nil || string(got) != "slow" {
		t.Fatalf("slow reply: %q, %v", got, err)
	}
}

// udpEchoAfter starts a UDP backend that echoes the i-th datagram it gets
// after delays[i] (the backend's own slowness, not test synchronisation),
// and then stops answering.
func udpEchoAfter(t *testing.T, delays ...time.Duration) netip.AddrPort {
	be, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	go func() {
		buf := make([]byte, 100)
		for _, d := range delays {
			n, from, err := be.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			time.Sleep(d)
			be.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return be.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestUDPSlowSecondReply: a client with two questions out from one socket,
// as a resolver sends A and AAAA, gets both answers although the second
// comes long after the first and after the idle timeout: the first reply
// answers one datagram, not the session's every datagram.
func TestUDPSlowSecondReply(t *testing.T) {
	be := udpEchoAfter(t, 0, 600*time.Millisecond)
	p := newTestProxier(t, Config{UDPIdleTimeout: 100 * time.Millisecond, UDPReplyTimeout: 3 * time.Second})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be)})
	c := dialUDP(t, proxyAddr(t, p, name))
	for _, q := range []string{"A", "AAAA"} {
		if _, err := c.Write([]byte(q)); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 100)
	for _, want := range []string{"A", "AAAA"} {
		n, err := c.Read(buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("answer %s: got %q, %v", want, buf[:n], err)
		}
	}
}

func TestUDP64KiBDatagram(t *testing.T) {
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("big", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	c := dialUDP(t, proxyAddr(t, p, name))
	for _, size := range []int{1, 4097, 9000, 65507} {
		payload := make([]byte, size)
		rand.Read(payload)
		got, err := udpExchange(t, c, payload)
		if err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("%d-byte datagram: got %d bytes, %v", size, len(got), err)
		}
	}
}

func TestUDPSessionCap(t *testing.T) {
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{UDPMaxSessions: 3, UDPIdleTimeout: time.Minute})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	addr := proxyAddr(t, p, name)
	var clients []*net.UDPConn
	for i := range 3 {
		c := dialUDP(t, addr)
		clients = append(clients, c)
		if _, err := udpExchange(t, c, []byte("hi")); err != nil {
			t.Fatalf("client %d within the cap: %v", i, err)
		}
	}
	extra := dialUDP(t, addr)
	extra.Write([]byte("over"))
	extra.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := extra.Read(make([]byte, 10)); err == nil {
		t.Fatal("a fourth client was served past a cap of 3")
	}
	if n := p.Stats().UDPSessionsRejected.Load(); n != 1 {
		t.Fatalf("rejected = %d, want 1", n)
	}
	// Existing sessions keep working.
	if got, err := udpExchange(t, clients[0], []byte("still")); err != nil || string(got) != "still" {
		t.Fatalf("existing session after the cap: %q, %v", got, err)
	}
}

// TestUDPRefusedEndpoint: an endpoint with nothing listening answers with
// ICMP port unreachable; the session ends and the client's next datagram
// goes to a live endpoint.
func TestUDPRefusedEndpoint(t *testing.T) {
	live := startUDPBackend(t, "live")
	dead := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t)) // nothing listens there
	p := newTestProxier(t, Config{})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(dead, live.addr()),
		Affinity: state.Affinity{Type: state.AffinityClientIP}})
	c := dialUDP(t, proxyAddr(t, p, name))
	answered := false
	for range 4 {
		got, err := udpExchangeTimeout(c, []byte("who"), 300*time.Millisecond)
		if err == nil && string(got) == "live" {
			answered = true
			break
		}
	}
	if !answered {
		t.Fatal("client never reached the live endpoint")
	}
}

// TestUDPRefusingEndpointIsPassedOver: once an endpoint has refused a
// session (ICMP port unreachable), new clients are sent elsewhere for a
// while, as TCP passes over an endpoint that refused a dial; round robin
// would otherwise send every other new client into the refusal.
func TestUDPRefusingEndpointIsPassedOver(t *testing.T) {
	logs := captureLog(t, "4")
	live := startUDPBackend(t, "live")
	dead := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t)) // nothing listens there
	p := newTestProxier(t, Config{EndpointPenalty: time.Minute})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(dead, live.addr())})
	lost := 0
	for range 8 {
		c := dialUDP(t, proxyAddr(t, p, name)) // a new client each time
		if got, err := udpExchangeTimeout(c, []byte("who"), 300*time.Millisecond); err != nil || string(got) != "live" {
			lost++
		}
		c.Close()
	}
	if lost > 0 {
		t.Fatalf("%d of 8 new clients were lost; want none: a refusal before any reply moves the session", lost)
	}
	if n := p.Stats().UDPRefused.Load(); n > 1 {
		t.Fatalf("%d refusals; want at most one before the endpoint is passed over", n)
	}
	if p.Stats().UDPRefused.Load() == 1 {
		klog.Flush()
		if line := logs.lineWith(`"UDP endpoint refused a session before any reply; its datagrams go to another endpoint"`); !strings.Contains(line, `endpoint="`+live.addr().String()+`"`) {
			t.Errorf("the refused session's move: %q", line)
		}
	}
}

// TestUDPRefusalBeforeAReplyMovesTheSession: an endpoint that refuses (a
// crashed pod still marked ready) before a session has had any reply no
// longer loses the client's datagrams: they go again to another endpoint,
// and the client is answered at once, where it waited out its timeout.
// With ClientIP affinity the client stays on the endpoint that answered.
// Once a session has had a reply, a refusal ends it, as before; and when
// every endpoint refuses, the session ends after as many endpoints as TCP
// dials (DialTimeouts).
func TestUDPRefusalBeforeAReplyMovesTheSession(t *testing.T) {
	live := startUDPBackend(t, "live")
	dead := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t))
	dead2 := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t))
	// A penalty too short to matter: round robin keeps choosing the dead
	// endpoints, so every other new session starts there.
	p := newTestProxier(t, Config{EndpointPenalty: time.Nanosecond})
	name := spn("dns", "", state.UDP)
	sticky := state.Affinity{Type: state.AffinityClientIP, Timeout: time.Hour}
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(dead, live.addr())})
	addr := proxyAddr(t, p, name)
	for i := range 6 {
		c := dialUDP(t, addr)
		if got, err := udpExchangeTimeout(c, []byte("who"), 2*time.Second); err != nil || string(got) != "live" {
			t.Fatalf("new client %d: %q, %v; want the live endpoint's answer to its first datagram", i, got, err)
		}
		c.Close()
	}
	if n := p.Stats().UDPRefused.Load(); n < 2 {
		t.Fatalf("%d refusals in 6 new sessions over a dead and a live endpoint; want the dead one picked about every other time", n)
	}

	// A resolver's two questions, over two dead endpoints and a live one:
	// when the second dead endpoint's refusal of the first comes back on
	// the write of the second, the session moves again, where it waited
	// out the reply timeout.
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(dead, dead2, live.addr())})
	for i := range 9 {
		c := dialUDP(t, addr)
		c.Write([]byte("A?"))
		c.Write([]byte("AAAA?"))
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		got := map[string]bool{}
		buf := make([]byte, 100)
		for len(got) < 2 {
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("new client %d with two questions over two dead endpoints: answers %v, then %v", i, got, err)
			}
			got[string(buf[:n])] = true
		}
		c.Close()
	}

	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(dead, live.addr()), Affinity: sticky})
	for range 2 {
		c := dialUDP(t, addr)
		if got, err := udpExchangeTimeout(c, []byte("who"), 2*time.Second); err != nil || string(got) != "live" {
			t.Fatalf("sticky client: %q, %v", got, err)
		}
		c.Close()
	}

	// After a reply, a refusal ends the session: its next datagram is
	// lost and the one after opens a new session.
	flaky := startUDPBackend(t, "flaky")
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(flaky.addr())})
	c := dialUDP(t, addr)
	if got, err := udpExchangeTimeout(c, []byte("who"), 2*time.Second); err != nil || string(got) != "flaky" {
		t.Fatalf("before the endpoint stops: %q, %v", got, err)
	}
	before := p.Stats().UDPSessionsOpened.Load()
	flaky.conn.Close()
	<-flaky.done
	for range 3 {
		udpExchangeTimeout(c, []byte("who"), 200*time.Millisecond)
	}
	if p.Stats().UDPSessionsOpened.Load() == before {
		t.Fatal("a session that had a reply was not ended by its endpoint's refusal")
	}

	// Every endpoint refuses: the session gives up.
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(dead, dead2)})
	refused := p.Stats().UDPRefused.Load()
	c = dialUDP(t, addr)
	if got, err := udpExchangeTimeout(c, []byte("who"), 500*time.Millisecond); err == nil {
		t.Fatalf("an answer %q with every endpoint dead", got)
	}
	if n := p.Stats().UDPRefused.Load() - refused; n < 2 || n > uint64(len(DefaultDialTimeouts)) {
		t.Fatalf("%d refusals for one session over two dead endpoints; want 2, at most %d", n, len(DefaultDialTimeouts))
	}
}

// TestUDPResendCountedOnceInTheSession: a datagram that an endpoint
// refused and that went again to another endpoint counts in the data
// plane's counters each time it was sent (to_endpoint is what endpoints
// were sent), but once in the "UDP session ended" line, which counts what
// the client sent and so credits the endpoint that answered with no more
// than it received.
func TestUDPResendCountedOnceInTheSession(t *testing.T) {
	logs := captureLog(t, "4")
	live := startUDPBackend(t, "live")
	dead := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t)) // nothing listens there
	// A penalty too short to matter: every other new session starts on
	// the dead endpoint.
	p := newTestProxier(t, Config{EndpointPenalty: time.Nanosecond, UDPIdleTimeout: 100 * time.Millisecond, UDPReplyTimeout: 2 * time.Second})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(dead, live.addr())})
	addr := proxyAddr(t, p, name)
	const clients = 6
	for i := range clients {
		// Each client keeps its socket, so the next cannot be given its
		// port and take over its session.
		c := dialUDP(t, addr)
		if got, err := udpExchangeTimeout(c, []byte("who"), 2*time.Second); err != nil || string(got) != "live" {
			t.Fatalf("new client %d: %q, %v", i, got, err)
		}
	}
	var ended []string
	settle(t, "every session's end is logged", func() error {
		klog.Flush()
		ended = nil
		logs.mu.Lock()
		for line := range strings.Lines(logs.b.String()) {
			if strings.Contains(line, `"UDP session ended"`) {
				ended = append(ended, strings.TrimSpace(line))
			}
		}
		logs.mu.Unlock()
		if len(ended) < clients {
			return fmt.Errorf("%d lines, %d sessions open: %q", len(ended), p.Stats().UDPSessionsActive.Load(), ended)
		}
		return nil
	})
	// The sessions are over, and their counts with them.
	st := p.Stats()
	refused := st.UDPRefused.Load()
	if refused == 0 {
		t.Fatal("no session started on the dead endpoint")
	}
	if in, bytes, out := st.UDPDatagramsIn.Load(), st.UDPBytesIn.Load(), st.UDPDatagramsOut.Load(); in != clients+refused || bytes != 3*in || out != clients {
		t.Errorf("datagrams to endpoints %d (%d bytes), to clients %d; want %d (%d bytes): each client's, and each again after a refusal, and %d",
			in, bytes, out, clients+refused, 3*(clients+refused), clients)
	}
	want := fmt.Sprintf(`endpoint="%s" reason="it idled out" datagramsToEndpoint=1 bytesToEndpoint=3 datagramsToClient=1 bytesToClient=4 `, live.addr())
	for _, line := range ended {
		if !strings.Contains(line, want) {
			t.Errorf("a session of one datagram, answered by the live endpoint: %s", line)
		}
	}
}

func udpExchangeTimeout(c *net.UDPConn, payload []byte, d time.Duration) ([]byte, error) {
	if _, err := c.Write(payload); err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	return buf[:n], err
}

// TestUDPReplyFromDeliveredAddress: a proxy port on the wildcard address
// answers from the address each datagram was sent to, here 127.0.0.2 and
// 127.0.0.1 on the same socket.
func TestUDPReplyFromDeliveredAddress(t *testing.T) {
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{BindAddress: netip.IPv4Unspecified()})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	port := p.ProxyPort(name)
	for _, ip := range []string{"127.0.0.2", "127.0.0.1"} {
		// An unconnected socket: it would accept a reply from any address,
		// so check the source explicitly.
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		to := netip.AddrPortFrom(netip.MustParseAddr(ip), port)
		c.WriteToUDPAddrPort([]byte("hello"), to)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 100)
		n, from, err := c.ReadFromUDPAddrPort(buf)
		c.Close()
		if err != nil || string(buf[:n]) != "hello" {
			t.Fatalf("via %s: %q, %v", to, buf[:n], err)
		}
		if from != to {
			t.Fatalf("reply to a datagram sent to %s came from %s", to, from)
		}
	}
}

// TestUDPReplyFromEachDeliveredAddress: one client socket sends to two
// addresses of the same wildcard proxy port, the first answer coming late:
// each reply leaves from the address its datagram went to. (Sessions were
// the client's alone, and the later address took over the earlier one's
// replies.)
func TestUDPReplyFromEachDeliveredAddress(t *testing.T) {
	be, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	go func() {
		buf := make([]byte, 100)
		for {
			n, from, err := be.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			msg := string(buf[:n])
			go func() {
				if msg == "slow" {
					time.Sleep(300 * time.Millisecond)
				}
				be.WriteToUDPAddrPort([]byte(msg), from)
			}()
		}
	}()
	p := newTestProxier(t, Config{BindAddress: netip.IPv4Unspecified()})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.LocalAddr().(*net.UDPAddr).AddrPort())})
	port := p.ProxyPort(name)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slowTo := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), port)
	fastTo := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	c.WriteToUDPAddrPort([]byte("slow"), slowTo)
	time.Sleep(50 * time.Millisecond)
	c.WriteToUDPAddrPort([]byte("fast"), fastTo)
	want := map[string]netip.AddrPort{"slow": slowTo, "fast": fastTo}
	buf := make([]byte, 100)
	for range 2 {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		if msg := string(buf[:n]); from != want[msg] {
			t.Errorf("the reply to %q came from %s, want %s", msg, from, want[msg])
		}
	}
}

// TestUDPSessionMovesOffRemovedEndpoint: a client that keeps one source
// port reaches a live endpoint as soon as its endpoint is removed, not
// after its session idles out.
func TestUDPSessionMovesOffRemovedEndpoint(t *testing.T) {
	a, b := startUDPBackend(t, "a"), startUDPBackend(t, "b")
	p := newTestProxier(t, Config{UDPIdleTimeout: time.Hour, UDPReplyTimeout: time.Hour})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(a.addr())})
	c := dialUDP(t, proxyAddr(t, p, name))
	if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "a" {
		t.Fatalf("before: %q, %v", got, err)
	}
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(b.addr())})
	if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "b" {
		t.Fatalf("after the endpoint moved: %q, %v; want b at once", got, err)
	}
}

// TestUDPSessionStaysOnServingEndpoint: a session whose endpoint turns
// terminating but still serving (or leaves the set new sessions use for
// readiness, topology or a traffic policy) goes on there, as kube-proxy
// keeps such flows (KEP-1669's graceful drain), while new clients go to
// the ready endpoints; it moves once its endpoint is gone or no longer
// serving.
func TestUDPSessionStaysOnServingEndpoint(t *testing.T) {
	a, b := startUDPBackend(t, "a"), startUDPBackend(t, "b")
	p := newTestProxier(t, Config{UDPIdleTimeout: time.Hour, UDPReplyTimeout: time.Hour})
	name := spn("dns", "", state.UDP)
	serving := func(eps ...netip.AddrPort) []netip.AddrPort { return eps }
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(a.addr()), ServingEndpoints: serving(a.addr(), b.addr())})
	c := dialUDP(t, proxyAddr(t, p, name))
	if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "a" {
		t.Fatalf("before: %q, %v", got, err)
	}
	// a terminates, still serving: b takes the new sessions.
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(b.addr()), ServingEndpoints: serving(a.addr(), b.addr())})
	if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "a" {
		t.Fatalf("the session to the terminating, serving endpoint: %q, %v; want a still", got, err)
	}
	if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil || string(got) != "b" {
		t.Fatalf("a new client: %q, %v; want b", got, err)
	}
	// a stops serving: its session moves at once.
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(b.addr()), ServingEndpoints: serving(b.addr())})
	if got, err := udpExchange(t, c, []byte("who")); err != nil || string(got) != "b" {
		t.Fatalf("once a no longer serves: %q, %v; want b at once", got, err)
	}
}

// TestUDPReplyBurst: an endpoint that answers one datagram with many (more
// than the proxy reads per wake-up) gets every reply to the client, whole
// and in order.
func TestUDPReplyBurst(t *testing.T) {
	const replies = 50
	be, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := be.ReadFromUDP(buf)
			if err != nil {
				return
			}
			for i := range replies {
				msg := append([]byte(fmt.Sprintf("%02d:", i)), buf[:n]...)
				if _, err := be.WriteToUDP(msg, from); err != nil {
					return
				}
			}
		}
	}()
	p := newTestProxier(t, Config{})
	name := spn("burst", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53,
		ClusterEndpoints: eps(be.LocalAddr().(*net.UDPAddr).AddrPort())})
	c := dialUDP(t, proxyAddr(t, p, name))
	payload := bytes.Repeat([]byte("x"), 1000)
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := range replies {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if want := append([]byte(fmt.Sprintf("%02d:", i)), payload...); !bytes.Equal(buf[:n], want) {
			t.Fatalf("reply %d: got %d bytes starting %q", i, n, buf[:min(n, 8)])
		}
	}
}

// TestUDPPendingForwardsOnce: the datagrams a session holds for a failover
// count once each in its tally, whether first sent, resent, or (goroutine
// build) resent by a refusal before the first send's write returned and
// the first reply settled the session.
func TestUDPPendingForwardsOnce(t *testing.T) {
	var p udpPending
	a, b := p.keep([]byte("A?")), p.keep([]byte("AAAA?"))
	if a != 0 || b != 1 {
		t.Fatalf("kept as %d and %d, want 0 and 1", a, b)
	}
	if !p.forward(a) || p.forward(a) {
		t.Error("the first datagram: want counted on its first send only")
	}
	if !p.forward(b) {
		t.Error("the second datagram, sent first by a resend: want counted")
	}
	p.settle()
	if p.forward(b) {
		t.Error("the second datagram's own write, after a reply settled the session: counted again")
	}
	if c := p.keep([]byte("x")); c != -1 || !p.forward(c) {
		t.Errorf("a datagram after the reply: kept as %d, want -1, and counted", c)
	}
}
