//go:build integration

package integration

import (
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestConntrackClearUDP: a UDP client that keeps its socket (as resolvers
// do) stays on the mapping the kernel chose for its first datagram. When
// the service behind a ClusterIP is replaced (its proxy port moves), the
// client is stuck on the dead port until the stale entries are deleted;
// then it reaches the new service at once.
func TestConntrackClearUDP(t *testing.T) {
	tests := []struct {
		name   string
		client func(*world) netns
		addr   string // where the client sends
		host   string // the backend's address in the service's family
		svc    func(name state.ServicePortName, endpoint string) state.ServicePort
	}{
		{"ClusterIP", func(w *world) netns { return w.pod }, "198.18.0.53:53", backendAddr, func(n state.ServicePortName, ep string) state.ServicePort {
			return state.ServicePort{Name: n, Port: 53, ClusterIPs: addrList("198.18.0.53"), ClusterEndpoints: endpoints(ep)}
		}},
		{"NodePort", func(w *world) netns { return w.outside }, nodeOutSide + ":30053", backendAddr, func(n state.ServicePortName, ep string) state.ServicePort {
			return state.ServicePort{Name: n, Port: 53, ClusterIPs: addrList("198.18.0.53"), NodePort: 30053, ClusterEndpoints: endpoints(ep)}
		}},
		{"IPv6 ClusterIP", func(w *world) netns { return w.pod }, "[fd5e:b1b5::53]:53", "[" + backendAddr6 + "]", func(n state.ServicePortName, ep string) state.ServicePort {
			return state.ServicePort{Name: n, Port: 53, ClusterIPs: addrList("fd5e:b1b5::53"), ClusterEndpoints: endpoints(ep)}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			startBackend(t, w.backend, "8080=old", "8081=new")
			px := startProxyHelper(t, w, "iptables", true)
			newName := state.ServicePortName{Namespace: "kube-system", Name: "dns2", Port: "dns", Protocol: state.UDP}
			oldSvc, newSvc := tc.svc(dnsName, tc.host+":8080"), tc.svc(newName, tc.host+":8081")

			const clientPort = 45353 // the same 5-tuple every time
			client := tc.client(w)
			send := func() clientResult { return dial(t, client, "udp", tc.addr, "q", clientPort) }

			r1 := px.do(proxyReq{Op: "apply", Ports: []state.ServicePort{oldSvc}, Clear: true})
			if r := send(); r.Reply != "old:q" || r.From != tc.addr {
				t.Fatalf("first query: %+v", r)
			}
			// Replace the service: a new proxy port, no conntrack cleanup yet.
			r2 := px.do(proxyReq{Op: "apply", Ports: []state.ServicePort{newSvc}})
			if r1.ProxyPorts[dnsName.String()] == r2.ProxyPorts[newName.String()] {
				t.Skip("the kernel gave the new service the old proxy port; nothing is stale")
			}
			if r2.Stale == 0 {
				t.Fatalf("no stale conntrack filters computed for a moved UDP frontend")
			}
			if r := send(); r.Err == "" {
				t.Fatalf("without cleanup the client reached %q; the test does not show a stale entry", r.Reply)
			}
			cl := px.do(proxyReq{Op: "clear"})
			if cl.Cleared == 0 {
				t.Errorf("ClearUDP deleted no entries")
			}
			if r := send(); r.Reply != "new:q" || r.From != tc.addr {
				t.Errorf("after ClearUDP: %+v, want the new service's answer from %s", r, tc.addr)
			}
			// Endpoint-only changes need no cleanup: the client's entry ends
			// at the proxy port, which does not move.
			moved := newSvc
			moved.ClusterEndpoints = endpoints(tc.host + ":8080")
			if r := px.do(proxyReq{Op: "apply", Ports: []state.ServicePort{moved}}); r.Stale != 0 {
				t.Errorf("endpoint change gave %d stale filters, want 0", r.Stale)
			}
			// The client still reaches the proxy port; which endpoint
			// answers is the data plane's session choice.
			if r := send(); r.Err != "" || !strings.HasSuffix(r.Reply, ":q") {
				t.Errorf("after the endpoint change: %+v, want an answer through the same proxy port", r)
			}
			px.do(proxyReq{Op: "cleanup"})
		})
	}
}
