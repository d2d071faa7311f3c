package userspace

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// freePort returns a port free for TCP and UDP on every one of addrs
// (127.0.0.1 when none are given). It is below the kernel's ephemeral
// range (32768 and up), so a port the proxy or a client binds to 0 can
// never take it in the meantime, not even as a client's source port on
// another address, which would keep a wildcard listener off it: the
// range node ports come from in a cluster, too.
func freePort(t testing.TB, addrs ...string) uint16 {
	t.Helper()
	if len(addrs) == 0 {
		addrs = []string{"127.0.0.1"}
	}
next:
	for range 200 {
		port := strconv.Itoa(20000 + rand.IntN(12000))
		for _, a := range addrs {
			ln, err := net.Listen("tcp4", net.JoinHostPort(a, port))
			if err != nil {
				continue next
			}
			ln.Close()
			c, err := net.ListenPacket("udp4", net.JoinHostPort(a, port))
			if err != nil {
				continue next
			}
			c.Close()
		}
		n, _ := strconv.Atoi(port)
		return uint16(n)
	}
	t.Fatal("no port free for both TCP and UDP")
	return 0
}

// TestLoadBalancerSourceRanges: with the frontends bound (the bind
// portal), a load-balancer IP admits only the sources of its
// loadBalancerSourceRanges: other TCP clients' SYNs and UDP clients'
// datagrams are dropped by the socket's filter. Where there is none (the
// build without one, or a kernel that refuses this process a filter on a
// TCP socket: see socketFilterAllowed), the proxy says so in its log and
// refuses those sources itself: a TCP client is reset before any dial, a
// datagram dropped. The Service's other frontends admit everyone, and a
// change of the ranges applies to the next connection without touching
// the listeners.
func TestLoadBalancerSourceRanges(t *testing.T) {
	const (
		clusterIP = "127.0.0.3"
		lbIP      = "127.0.0.4"
		allowed   = "127.0.0.10"
		other     = "127.0.0.11"
	)
	// Whether the kernel drops the refused sources' packets, by protocol.
	kernelTCP := kernelSourceFilter && socketFilterAllowed(t, "tcp")
	kernelUDP := kernelSourceFilter && socketFilterAllowed(t, "udp")
	logs := captureLog(t, "0")
	tb := startTCPBackend(t, "be-tcp")
	ub := startUDPBackend(t, "be-udp")
	port := freePort(t, lbIP, clusterIP)
	p := newTestProxier(t, Config{ServeFrontends: true, DisableProxyPorts: true,
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil }})
	web, dns := spn("web", "http", state.TCP), spn("web", "dns", state.UDP)
	spec := func(ranges ...string) []state.ServicePort {
		var pfx []netip.Prefix
		for _, r := range ranges {
			pfx = append(pfx, netip.MustParsePrefix(r))
		}
		common := state.ServicePort{Port: port, ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)},
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(lbIP)}, LoadBalancerSourceRanges: pfx}
		tcp, udp := common, common
		tcp.Name, tcp.ClusterEndpoints = web, eps(tb.addr())
		udp.Name, udp.ClusterEndpoints = dns, eps(ub.addr())
		return []state.ServicePort{tcp, udp}
	}
	mustApply(t, p, spec(allowed+"/32", "fd5e:b1b5::/32")...)

	at := func(ip string) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }
	tcpFrom := func(src, dst string) (string, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		return tcpWhoDial(func() (net.Conn, error) { return d.Dial("tcp4", dst) }, dst)
	}
	udpFrom := func(src, dst string, wait time.Duration) (string, error) {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(src)}, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(dst)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("who")); err != nil {
			return "", err
		}
		c.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 100)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}

	if name, err := tcpFrom(allowed, at(lbIP)); err != nil || name != "be-tcp" {
		t.Fatalf("TCP from %s to the load-balancer IP: %q, %v; want be-tcp", allowed, name, err)
	}
	if reply, err := udpFrom(allowed, at(lbIP), 5*time.Second); err != nil || reply != "be-udp" {
		t.Fatalf("UDP from %s to the load-balancer IP: %q, %v; want be-udp", allowed, reply, err)
	}
	before := p.Stats().Snapshot()
	// With a socket filter the kernel drops the SYNs: no handshake, no
	// reset, and the proxy never sees the client. Without one the proxy
	// resets the connection it accepted.
	want := "dropped by the kernel's socket filter (no handshake, the dial times out)"
	if !kernelTCP {
		want = "reset by the proxy (no socket filter on the TCP listener, see the log)"
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(other)}, Timeout: time.Second}
	if c, err := d.Dial("tcp4", at(lbIP)); err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 16))
		c.Close()
		if kernelTCP || !isReset(err) {
			t.Fatalf("TCP from %s to the load-balancer IP connected, then %v; want it %s", other, err, want)
		}
	} else if ne, ok := err.(net.Error); kernelTCP && !(ok && ne.Timeout()) || !kernelTCP && !isReset(err) {
		t.Fatalf("TCP from %s to the load-balancer IP: %v; want it %s", other, err, want)
	}
	if reply, err := udpFrom(other, at(lbIP), 300*time.Millisecond); err == nil {
		t.Fatalf("UDP from %s to the load-balancer IP got %q; want no answer", other, reply)
	}
	after := p.Stats().Snapshot()
	// The proxy counts what it refused itself: the connection, the
	// datagram, each unless the kernel dropped it.
	wantRefused := uint64(0)
	if !kernelTCP {
		wantRefused++
	}
	if !kernelUDP {
		wantRefused++
	}
	if got := after.SourceRefused - before.SourceRefused; got != wantRefused {
		t.Errorf("SourceRefused went up by %d, want %d (the kernel drops TCP: %v, UDP: %v)", got, wantRefused, kernelTCP, kernelUDP)
	}
	// A filter the kernel refused is said in the log, with why.
	const cannot = "Cannot have the kernel drop the traffic of sources outside loadBalancerSourceRanges"
	line := logs.lineWith(cannot)
	switch {
	case kernelSourceFilter && (!kernelTCP || !kernelUDP) && !strings.Contains(line, "operation not permitted"):
		t.Errorf("the kernel refused a socket filter, and the log says %q; want a line %q with its error (operation not permitted)", line, cannot)
	case (kernelTCP && kernelUDP || !kernelSourceFilter) && line != "":
		t.Errorf("the log says %q; want no such line: there was no filter to refuse", line)
	}
	if after.TCPDialFailures != before.TCPDialFailures || after.UDPSessionsOpened != before.UDPSessionsOpened {
		t.Errorf("a refused source was dialled for: %+v, then %+v", before, after)
	}
	// The ranges are the load-balancer IP's only.
	if name, err := tcpFrom(other, at(clusterIP)); err != nil || name != "be-tcp" {
		t.Fatalf("TCP from %s to the cluster IP: %q, %v; want be-tcp", other, name, err)
	}
	if reply, err := udpFrom(other, at(clusterIP), 5*time.Second); err != nil || reply != "be-udp" {
		t.Fatalf("UDP from %s to the cluster IP: %q, %v; want be-udp", other, reply, err)
	}

	listeners := len(p.Listeners())
	mustApply(t, p, spec(allowed+"/32", "127.0.0.8/29")...)
	if name, err := tcpFrom(other, at(lbIP)); err != nil || name != "be-tcp" {
		t.Fatalf("TCP from %s after the ranges grew: %q, %v; want be-tcp", other, name, err)
	}
	if reply, err := udpFrom(other, at(lbIP), 5*time.Second); err != nil || reply != "be-udp" {
		t.Fatalf("UDP from %s after the ranges grew: %q, %v; want be-udp", other, reply, err)
	}
	// A /0 of the address's family admits everyone; so does a list with
	// no range of its family.
	for _, ranges := range [][]string{{"10.0.0.0/8", "0.0.0.0/0"}, {"fd5e:b1b5::/32"}} {
		mustApply(t, p, spec(ranges...)...)
		if name, err := tcpFrom("127.0.0.12", at(lbIP)); err != nil || name != "be-tcp" {
			t.Fatalf("TCP with ranges %v: %q, %v; want be-tcp", ranges, name, err)
		}
	}
	if got := len(p.Listeners()); got != listeners {
		t.Errorf("listeners went from %d to %d when only the ranges changed", listeners, got)
	}
}

// TestNodePortsNotOnServiceAddresses: with the frontends bound (the bind
// portal), a node port served on every address is not served on the
// service addresses the portal put on the host, as kube-proxy's IPVS mode
// leaves its dummy interface's addresses out: LB-IP:nodePort would get
// round loadBalancerSourceRanges.
func TestNodePortsNotOnServiceAddresses(t *testing.T) {
	const lbIP = "127.0.0.4"
	tb := startTCPBackend(t, "be-tcp")
	ub := startUDPBackend(t, "be-udp")
	port, np := freePort(t, lbIP), freePort(t, "127.0.0.1", lbIP)
	p := newTestProxier(t, Config{ServeFrontends: true, DisableProxyPorts: true, ServeNodePorts: true})
	common := state.ServicePort{Port: port, NodePort: np, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(lbIP)},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("127.0.0.10/32")}}
	tcp, udp := common, common
	tcp.Name, tcp.ClusterEndpoints = spn("lb", "tcp", state.TCP), eps(tb.addr())
	udp.Name, udp.ClusterEndpoints = spn("lb", "udp", state.UDP), eps(ub.addr())
	mustApply(t, p, tcp, udp)
	at := func(ip string) string { return net.JoinHostPort(ip, strconv.Itoa(int(np))) }

	if name, err := tcpWhoErr(at("127.0.0.1")); err != nil || name != "be-tcp" {
		t.Fatalf("TCP node port on the host's address: %q, %v", name, err)
	}
	if got, err := udpExchange(t, dialUDP(t, at("127.0.0.1")), []byte("who")); err != nil || string(got) != "be-udp" {
		t.Fatalf("UDP node port on the host's address: %q, %v", got, err)
	}
	if name, err := tcpWhoErr(at(lbIP)); err == nil {
		t.Errorf("TCP node port on the load-balancer IP reached %q; want it refused", name)
	}
	c := dialUDP(t, at(lbIP))
	c.Write([]byte("who"))
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 100)); err == nil {
		t.Errorf("UDP node port on the load-balancer IP answered (%d bytes); want nothing", n)
	}
}
