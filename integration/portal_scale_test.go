//go:build integration && linux

package integration

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestPortalIPTablesSync5000 times one Sync of 5,000 service ports (each
// with a ClusterIP, 1,000 with a NodePort: 17,000 rules) through the real
// iptables-restore in a namespace. The issue asks for under 2 s; the test
// fails only past 3x that, so a loaded machine does not make it flaky,
// and logs the figure.
func TestPortalIPTablesSync5000(t *testing.T) {
	w := newWorld(t)
	const n = 5000
	ports := make([]state.ServicePort, 0, n)
	proxyPorts := make(map[string]uint16, n)
	for i := range n {
		proto := state.TCP
		if i%2 == 1 {
			proto = state.UDP
		}
		sp := state.ServicePort{
			Name:       state.ServicePortName{Namespace: "scale", Name: fmt.Sprintf("svc-%d", i), Port: "p", Protocol: proto},
			Port:       80,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 19, byte(i / 250), byte(i%250 + 1)})},
		}
		if i < 1000 {
			sp.NodePort = uint16(30000 + i)
		}
		ports = append(ports, sp)
		proxyPorts[sp.Name.String()] = uint16(20000 + i)
	}
	px := startProxyHelper(t, w, "iptables", false)
	first := px.do(proxyReq{Op: "apply", Ports: ports, ProxyPorts: proxyPorts})
	again := px.do(proxyReq{Op: "apply", Ports: ports, ProxyPorts: proxyPorts})
	changed := px.do(proxyReq{Op: "apply", Ports: ports[1:], ProxyPorts: proxyPorts})
	rules := 0
	for _, l := range strings.Split(w.node.mustRun(t, "iptables-"+first.Backend+"-save"), "\n") {
		if strings.HasPrefix(l, "-A KUBE-") {
			rules++
		}
	}
	t.Logf("sync of %d service ports (%d rules, %s backend): first %v, unchanged %v, one removed %v",
		n, rules, first.Backend, first.SyncTook.Round(time.Millisecond), again.SyncTook.Round(time.Millisecond), changed.SyncTook.Round(time.Millisecond))
	// After svc-0 went: a portal per service port, a node-port rule each
	// for the 999 left, and one more each for 127.0.0.0/8 in the host
	// chain (the container chain's first rule leaves loopback alone),
	// one jump in each of the two host chains, and a filter rule per
	// service port.
	if want := (n - 1) + 2*999 + 1 + 2 + (n - 1); rules != want {
		t.Errorf("%d rules in our chains, want %d", rules, want)
	}
	for _, took := range []time.Duration{first.SyncTook, again.SyncTook, changed.SyncTook} {
		if took > 6*time.Second {
			t.Errorf("a sync took %v, want under 2 s (6 s with slack for a loaded machine)", took)
		}
	}
	px.do(proxyReq{Op: "cleanup"})
}
