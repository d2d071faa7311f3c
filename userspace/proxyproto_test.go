package userspace

import (
	"bufio"
	"encoding/hex"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestProxyHeaderEncoding checks headers against bytes written out by hand
// from the spec (proxy-protocol.txt, sections 2.1 and 2.2).
func TestProxyHeaderEncoding(t *testing.T) {
	ap := netip.MustParseAddrPort
	v2 := "0d0a0d0a000d0a515549540a" // the signature
	tests := []struct {
		name     string
		v        state.ProxyProtocol
		src, dst netip.AddrPort
		want     string // text for v1, hex for v2
	}{
		{"v1 IPv4", state.ProxyProtocolV1, ap("198.18.10.2:40000"), ap("198.18.0.10:80"),
			"PROXY TCP4 198.18.10.2 198.18.0.10 40000 80\r\n"},
		{"v1 IPv6", state.ProxyProtocolV1, ap("[fd5e:b1b5:10::2]:65535"), ap("[fd5e:b1b5::10]:443"),
			"PROXY TCP6 fd5e:b1b5:10::2 fd5e:b1b5::10 65535 443\r\n"},
		{"v1 IPv4-mapped is IPv4", state.ProxyProtocolV1, ap("[::ffff:192.0.2.1]:1"), ap("[::ffff:192.0.2.2]:2"),
			"PROXY TCP4 192.0.2.1 192.0.2.2 1 2\r\n"},
		{"v1 a zone is not written", state.ProxyProtocolV1, ap("[fe80::1%eth0]:5"), ap("[fe80::2%eth0]:6"),
			"PROXY TCP6 fe80::1 fe80::2 5 6\r\n"},
		{"v1 families differ", state.ProxyProtocolV1, ap("192.0.2.1:1"), ap("[2001:db8::1]:2"),
			"PROXY UNKNOWN\r\n"},
		{"v1 destination unknown", state.ProxyProtocolV1, ap("192.0.2.1:1"), netip.AddrPort{},
			"PROXY UNKNOWN\r\n"},
		{"v2 IPv4", state.ProxyProtocolV2, ap("198.18.10.2:40000"), ap("198.18.0.10:80"),
			v2 + "21" + "11" + "000c" + "c6120a02" + "c612000a" + "9c40" + "0050"},
		{"v2 IPv6", state.ProxyProtocolV2, ap("[fd5e:b1b5:10::2]:65535"), ap("[fd5e:b1b5::10]:443"),
			v2 + "21" + "21" + "0024" +
				"fd5eb1b5001000000000000000000002" + "fd5eb1b5000000000000000000000010" + "ffff" + "01bb"},
		{"v2 IPv4-mapped is IPv4", state.ProxyProtocolV2, ap("[::ffff:192.0.2.1]:1"), ap("[::ffff:192.0.2.2]:2"),
			v2 + "21" + "11" + "000c" + "c0000201" + "c0000202" + "0001" + "0002"},
		{"v2 families differ", state.ProxyProtocolV2, ap("192.0.2.1:1"), ap("[2001:db8::1]:2"),
			v2 + "20" + "00" + "0000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := appendProxyHeader(nil, tc.v, tc.src, tc.dst)
			if tc.v == state.ProxyProtocolV2 {
				if h := hex.EncodeToString(got); h != tc.want {
					t.Fatalf("got  %s\nwant %s", h, tc.want)
				}
				return
			}
			if string(got) != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	// The longest header fits the buffer it is built in, so building it
	// allocates once.
	long := netip.MustParseAddrPort("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe]:65535")
	for _, v := range []state.ProxyProtocol{state.ProxyProtocolV1, state.ProxyProtocolV2} {
		if n := len(appendProxyHeader(nil, v, long, long)); n > maxProxyHeader {
			t.Fatalf("the longest %v header is %d bytes, more than %d", v, n, maxProxyHeader)
		}
	}
}

// recordingBackend answers each connection, once the client has
// half-closed, with everything it received, so a test sees exactly what
// the proxy sent ahead of the client's bytes.
func recordingBackend(t *testing.T, addr string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				got, _ := io.ReadAll(c)
				c.Write(got)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// sendThrough connects to addr, sends payload, half-closes and returns
// what comes back, and the client's own address.
func sendThrough(t *testing.T, addr, payload string) (string, netip.AddrPort) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, payload); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read via %s: %v", addr, err)
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	return string(got), netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
}

// TestProxyProtocolHeaderReachesEndpoint: with the annotation the
// endpoint gets the header, naming the client and the address it
// connected to, before the client's first byte, in both versions and
// families.
func TestProxyProtocolHeaderReachesEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    state.ProxyProtocol
		lo   string
	}{
		{"v1 IPv4", state.ProxyProtocolV1, "127.0.0.1"},
		{"v2 IPv4", state.ProxyProtocolV2, "127.0.0.1"},
		{"v1 IPv6", state.ProxyProtocolV1, "::1"},
		{"v2 IPv6", state.ProxyProtocolV2, "::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo := netip.MustParseAddr(tc.lo)
			if lo.Is6() {
				needIPv6Loopback(t)
			}
			be := recordingBackend(t, netip.AddrPortFrom(lo, 0).String())
			p := newTestProxier(t, Config{BindAddress: lo})
			name := spn("web", "", state.TCP)
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be), ProxyProtocol: tc.v})
			front := netip.AddrPortFrom(lo, p.ProxyPort(name))
			got, client := sendThrough(t, front.String(), "hello")
			if want := string(appendProxyHeader(nil, tc.v, client, front)) + "hello"; got != want {
				t.Fatalf("the endpoint got %q, want %q", got, want)
			}
		})
	}
}

// TestProxyProtocolServedDirectly: a node port served on every address
// names, as the destination, the address the client connected to.
func TestProxyProtocolServedDirectly(t *testing.T) {
	be := recordingBackend(t, "127.0.0.1:0")
	np := freePort(t)
	p := newTestProxier(t, Config{ServeNodePorts: true, DisableProxyPorts: true, BindAddress: netip.MustParseAddr("0.0.0.0")})
	mustApply(t, p, state.ServicePort{Name: spn("web", "", state.TCP), Port: 80, NodePort: np,
		ClusterEndpoints: eps(be), ProxyProtocol: state.ProxyProtocolV1})
	front := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.5"), np)
	got, client := sendThrough(t, front.String(), "x")
	if want := "PROXY TCP4 127.0.0.1 127.0.0.5 "; !strings.HasPrefix(got, want) || client.Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("the endpoint got %q, want it to start %q", got, want)
	}
	if want := string(appendProxyHeader(nil, state.ProxyProtocolV1, client, front)) + "x"; got != want {
		t.Fatalf("the endpoint got %q, want %q", got, want)
	}
}

// TestProxyProtocolFailover: when the first endpoint refuses, the one the
// connection moves on to gets the header, once, at its start.
func TestProxyProtocolFailover(t *testing.T) {
	be := recordingBackend(t, "127.0.0.1:0")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(deadAddr(t), be), ProxyProtocol: state.ProxyProtocolV2})
	addr := proxyAddr(t, p, name)
	for i := range 3 {
		got, client := sendThrough(t, addr, "hello")
		front := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), p.ProxyPort(name))
		if want := string(appendProxyHeader(nil, state.ProxyProtocolV2, client, front)) + "hello"; got != want {
			t.Fatalf("connection %d: the endpoint got %x, want %x", i, got, want)
		}
	}
	if f := p.Stats().TCPDialFailures.Load(); f != 1 {
		t.Fatalf("dial failures = %d, want 1: the dead endpoint was dialled first once", f)
	}
}

// TestProxyProtocolFollowsTheService: without the annotation nothing is
// sent ahead of the client's bytes; turning it on or off on a live
// Service applies to the next connection, keeps the listener and leaves
// open connections alone.
func TestProxyProtocolFollowsTheService(t *testing.T) {
	be := recordingBackend(t, "127.0.0.1:0")
	echo := startTCPBackend(t, "echo")
	p := newTestProxier(t, Config{})
	name := spn("web", "", state.TCP)
	spec := state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be)}
	mustApply(t, p, spec)
	addr := proxyAddr(t, p, name)
	if got, _ := sendThrough(t, addr, "hello"); got != "hello" {
		t.Fatalf("without the annotation the endpoint got %q, want only the client's bytes", got)
	}

	spec.ProxyProtocol = state.ProxyProtocolV1
	mustApply(t, p, spec)
	if a := proxyAddr(t, p, name); a != addr {
		t.Fatalf("the proxy port moved from %s to %s", addr, a)
	}
	if got, _ := sendThrough(t, addr, "hello"); !strings.HasPrefix(got, "PROXY TCP4 127.0.0.1 127.0.0.1 ") || !strings.HasSuffix(got, "\r\nhello") {
		t.Fatalf("with v1 the endpoint got %q", got)
	}

	// A connection open across the change goes on as it began.
	spec.ClusterEndpoints = eps(echo.addr())
	mustApply(t, p, spec)
	open, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	open.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(open)
	// The echo endpoint greets, then echoes the header it got first.
	if greeting, err := r.ReadString('\n'); err != nil || greeting != "echo\n" {
		t.Fatalf("greeting %q, %v", greeting, err)
	}
	if header, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(header, "PROXY TCP4 127.0.0.1 127.0.0.1 ") || !strings.HasSuffix(header, "\r\n") {
		t.Fatalf("the connection's endpoint got the header %q, %v", header, err)
	}

	spec.ProxyProtocol = state.ProxyProtocolNone
	spec.ClusterEndpoints = eps(be)
	mustApply(t, p, spec)
	if got, _ := sendThrough(t, addr, "hello"); got != "hello" {
		t.Fatalf("after the annotation went, the endpoint got %q, want only the client's bytes", got)
	}
	// The connection open across the changes carries on.
	io.WriteString(open, "more\n")
	open.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(r); err != nil || string(rest) != "more\n" {
		t.Fatalf("the connection open across the changes got %q, %v", rest, err)
	}
}

// TestProxyProtocolNotOnUDP: a UDP port asked for the header says once
// that it sends none, and serves datagrams as they are.
func TestProxyProtocolNotOnUDP(t *testing.T) {
	logs := captureLog(t, "0")
	ub := startUDPBackend(t, "be-udp")
	p := newTestProxier(t, Config{})
	name := spn("dns", "", state.UDP)
	spec := state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(ub.addr()), ProxyProtocol: state.ProxyProtocolV2}
	mustApply(t, p, spec)
	if got, err := udpExchange(t, dialUDP(t, proxyAddr(t, p, name)), []byte("who")); err != nil || string(got) != "be-udp" {
		t.Fatalf("UDP with the annotation: %q, %v", got, err)
	}
	spec.ClusterEndpoints = eps(ub.addr(), ub.addr())
	mustApply(t, p, spec)
	const said = "The PROXY protocol is sent on TCP ports only"
	if line := logs.lineWith(said); !strings.Contains(line, `service="test/dns/UDP"`) {
		t.Fatalf("log line %q, want one naming the service", line)
	}
	logs.mu.Lock()
	n := strings.Count(logs.b.String(), said)
	logs.mu.Unlock()
	if n != 1 {
		t.Fatalf("said %d times, want once", n)
	}
}
