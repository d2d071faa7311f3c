package userspace

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestLoadBalancerIPAloneLocal: a LoadBalancer Service with
// allocateLoadBalancerNodePorts: false has load-balancer IPs and no node
// port; with no external IPs either, they alone carry its external traffic,
// which externalTrafficPolicy: Local keeps on this node's endpoints, as
// kube-proxy does. It gets an external proxy port of its own (where the
// portal redirects the load-balancer IPs) that reaches only the local
// endpoint, while the proxy port (cluster traffic) reaches every endpoint.
func TestLoadBalancerIPAloneLocal(t *testing.T) {
	local, remote := startTCPBackend(t, "local"), startTCPBackend(t, "remote")
	p := newTestProxier(t, Config{
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil }})
	name := spn("lb", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ExternalLocal: true,
		LoadBalancerIPs:  []netip.Addr{netip.MustParseAddr("198.18.67.10")},
		ClusterEndpoints: eps(local.addr(), remote.addr()), LocalEndpoints: eps(local.addr())})
	ext := p.ExternalProxyPort(name)
	if ext == 0 || ext == p.ProxyPort(name) {
		t.Fatalf("external proxy port %d, proxy port %d: want a separate one for the load-balancer IP's traffic", ext, p.ProxyPort(name))
	}
	seen := map[string]int{}
	for range 6 {
		seen[tcpWhoFrom(t, outsider, fmt.Sprintf("127.0.0.1:%d", ext))]++
	}
	if seen["local"] != 6 {
		t.Fatalf("external proxy port with eTP=Local reached %v; want the local endpoint only", seen)
	}
	seen = map[string]int{}
	for range 6 {
		seen[tcpWhoFrom(t, outsider, proxyAddr(t, p, name))]++
	}
	if seen["remote"] == 0 {
		t.Fatalf("cluster traffic reached %v; want every endpoint", seen)
	}
}
