package userspace

import (
	"io"
	"net"
	"net/netip"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// BenchmarkTCPCopy measures bulk throughput through a proxied connection
// on loopback (sink backend, one stream).
func BenchmarkTCPCopy(b *testing.B) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	p := newTestProxier(b, Config{})
	name := spn("sink", "", state.TCP)
	mustApply(b, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
	c, err := net.Dial("tcp", proxyAddr(b, p, name))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApply10kServices measures a no-change Apply (a resync) and an
// endpoint-only change over 10,000 service ports that are already served.
func BenchmarkApply10kServices(b *testing.B) {
	p := New(Config{BindAddress: netip.MustParseAddr("127.0.0.1"), DisableProxyPorts: true})
	defer p.Close()
	ports := make([]state.ServicePort, 10000)
	for i := range ports {
		ports[i] = state.ServicePort{
			Name: state.ServicePortName{Namespace: "bench", Name: "svc" + itoa(i), Port: "p", Protocol: state.TCP},
			Port: 80,
			ClusterEndpoints: eps(
				netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 8080),
				netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), 8080)),
		}
	}
	snap := state.NewSnapshot(ports)
	if err := p.Apply(snap); err != nil {
		b.Fatal(err)
	}
	changed := make([]state.ServicePort, len(ports))
	copy(changed, ports)
	changed[0].ClusterEndpoints = eps(netip.MustParseAddrPort("198.18.255.255:8080"))
	snaps := []state.Snapshot{snap, state.NewSnapshot(changed)}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := p.Apply(snaps[i%2]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}
