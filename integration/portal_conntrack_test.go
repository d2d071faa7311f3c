//go:build integration && linux

package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestBinaryRemovedRulesLeaveNoUDPEntries: the UDP conntrack entries the
// iptables portal's rules made go with the rules, whoever removes them
// (--cleanup, or a run with the bind portal or none). A client that keeps
// its source port (a resolver, a DNS forwarder's pool) refreshes its entry
// with every datagram, so one left behind keeps it on the dead proxy port
// for ever. The kernel applies an entry's NAT only while some nat rule is
// loaded in the namespace, so the node has one, as any real node has (a
// CNI's or docker's MASQUERADE): without it the test would pass unfixed.
func TestBinaryRemovedRulesLeaveNoUDPEntries(t *testing.T) {
	for _, next := range []string{"cleanup", "bind", "none"} {
		t.Run(next, func(t *testing.T) {
			w := newWorld(t)
			startBackend(t, w.backend, "8080=be1", "8081=be6")
			w.node.mustRun(t, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "198.18.200.0/24", "-j", "MASQUERADE")
			file := filepath.Join(t.TempDir(), "services.yaml")
			writeFile(t, file, netnsManifest)
			px := startNodeProxy(t, w, file, "--portal=iptables")
			px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
			const srcPort = 45454 // the same 5-tuple every time
			clients := []struct {
				name string
				from netns
				addr string
			}{
				{"ClusterIP from the pod", w.pod, "198.18.0.53:53"},
				{"NodePort from the outside", w.outside, nodeOutSide + ":30053"},
			}
			if next == "none" {
				clients = clients[1:] // no portal: nothing serves the ClusterIP
			}
			for _, c := range clients {
				if r := dial(t, c.from, "udp", c.addr, "ping", srcPort); !strings.HasPrefix(r.Reply, "be1:") {
					t.Fatalf("%s through the iptables portal: reply %q, err %q", c.name, r.Reply, r.Err)
				}
			}
			if _, ok := px.terminate(10 * time.Second); !ok {
				t.Fatal("the proxy did not stop on SIGTERM")
			}

			mode := next
			if next == "cleanup" {
				if out, err := w.node.run(proxyBin, "--cleanup"); err != nil {
					t.Fatalf("--cleanup: %v\n%s", err, out)
				}
				mode = "bind"
			}
			px = startNodeProxy(t, w, file, "--portal="+mode)
			if next != "cleanup" {
				px.waitLog(0, `"Removing the iptables portal's rules a previous run left`, 1, 30*time.Second)
			}
			px.waitLog(0, `"Serving".*via="node-port"`, 1, 30*time.Second)
			px.waitLog(0, `"Serving".*198.18.0.53:53|"Serving".*:30053`, 1, 30*time.Second)
			if left := ourRules(t, w.node, "nft"); len(left) > 0 {
				t.Fatalf("iptables rules left: %v", left)
			}
			for _, c := range clients {
				if r := dial(t, c.from, "udp", c.addr, "ping", srcPort); !strings.HasPrefix(r.Reply, "be1:") || r.From != c.addr {
					t.Errorf("%s from the same source port once the rules are gone: reply %q from %q, err %q; conntrack holds:\n%s",
						c.name, r.Reply, r.From, r.Err, w.node.mustRun(t, "conntrack", "-L", "-p", "udp"))
				}
			}
		})
	}
}

// TestBinaryUDPSessionDrainsFromATerminatingEndpoint: a UDP flow whose
// endpoint turns terminating but still serving stays there (kube-proxy
// keeps such flows, KEP-1669's graceful drain) while new flows go to the
// ready endpoint; it moves once the endpoint stops serving. The proxy
// ended it at once, as if the endpoint were gone.
func TestBinaryUDPSessionDrainsFromATerminatingEndpoint(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be2")
	manifest := func(cond1, cond2 string) string {
		return `apiVersion: v1
kind: Service
metadata: {name: dns, namespace: e2e}
spec:
  clusterIP: 198.18.0.53
  ports: [{name: dns, protocol: UDP, port: 53}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: e2e, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, protocol: UDP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"], conditions: ` + cond1 + `}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-2, namespace: e2e, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, protocol: UDP, port: 8081}]
endpoints: [{addresses: ["198.18.12.2"], conditions: ` + cond2 + `}]
`
	}
	const ready, draining, gone = "{ready: true}", "{ready: false, serving: true, terminating: true}", "{ready: false, serving: false, terminating: true}"
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest(ready, ready))
	px := startNodeProxy(t, w, file, "--portal=iptables", "--udp-timeout=5m")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	const srcPort = 45456
	r := dial(t, w.pod, "udp", "198.18.0.53:53", "ping", srcPort)
	if !strings.HasPrefix(r.Reply, "be") {
		t.Fatalf("first query: reply %q, err %q", r.Reply, r.Err)
	}
	first, _, _ := strings.Cut(r.Reply, ":")
	other := map[string]string{"be1": "be2", "be2": "be1"}[first]
	conds := func(of, rest string) string {
		if first == "be1" {
			return manifest(of, rest)
		}
		return manifest(rest, of)
	}

	from := px.lineCount()
	replaceFile(t, file, conds(draining, ready))
	px.waitLog(from, `"Endpoints changed"`, 1, 10*time.Second)
	if r := dial(t, w.pod, "udp", "198.18.0.53:53", "ping", srcPort); !strings.HasPrefix(r.Reply, first+":") {
		t.Errorf("the flow to the terminating, still serving endpoint: reply %q, err %q; want %s still", r.Reply, r.Err, first)
	}
	if r := dial(t, w.pod, "udp", "198.18.0.53:53", "ping", 0); !strings.HasPrefix(r.Reply, other+":") {
		t.Errorf("a new flow: reply %q, err %q; want the ready %s", r.Reply, r.Err, other)
	}
	if strings.Contains(px.log(), "Ended UDP sessions") {
		t.Errorf("sessions were ended:\n%s", px.log())
	}

	from = px.lineCount()
	replaceFile(t, file, conds(gone, ready))
	px.waitLog(from, `"Ended UDP sessions to endpoints removed or no longer serving"`, 1, 10*time.Second)
	if r := dial(t, w.pod, "udp", "198.18.0.53:53", "ping", srcPort); !strings.HasPrefix(r.Reply, other+":") {
		t.Errorf("the flow once its endpoint no longer serves: reply %q, err %q; want %s", r.Reply, r.Err, other)
	}
}

// TestBinaryNodePortConntrackSparesForeignFlows: node-port numbers are the
// same on every node, so a pod's UDP flow to another host's node port,
// masqueraded by an unrelated rule (a CNI's), has this host's node port as
// its original destination port. Deleting this host's node-port entries,
// when its Service goes and on --cleanup, must leave that flow alone: only
// the entries its own rules REDIRECTed (the reply comes from the proxy
// port) go.
func TestBinaryNodePortConntrackSparesForeignFlows(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	startBackend(t, w.outside, "30053=far")
	w.node.mustRun(t, "sysctl", "-qw", "net.ipv4.ip_forward=1") // this namespace's
	w.node.mustRun(t, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "198.18.10.0/24", "-o", "to-out", "-j", "MASQUERADE")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)

	const foreignPort, ownPort = 47002, 47003
	foreign := func() string { // the pod's masqueraded flow to the other host
		return w.node.mustRun(t, "sh", "-c", fmt.Sprintf("conntrack -L -p udp --orig-src %s --sport %d 2>/dev/null || true", podAddr, foreignPort))
	}
	if r := dial(t, w.pod, "udp", outsideAddr+":30053", "ping", foreignPort); !strings.HasPrefix(r.Reply, "far:") {
		t.Fatalf("pod to the other host's port 30053: %+v", r)
	}
	if r := dial(t, w.outside, "udp", nodeOutSide+":30053", "ping", ownPort); !strings.HasPrefix(r.Reply, "be1:") {
		t.Fatalf("this host's node port: %+v", r)
	}
	if !strings.Contains(foreign(), "dport=30053") {
		t.Fatalf("no conntrack entry for the pod's masqueraded flow")
	}
	// The Service goes: its node port's entries are stale.
	at := px.lineCount()
	var kept []string
	for _, doc := range strings.Split(netnsManifest, "---\n") {
		if !strings.Contains(doc, "name: dns") {
			kept = append(kept, doc)
		}
	}
	writeFile(t, file, strings.Join(kept, "---\n"))
	px.waitLog(at, `"Deleted stale UDP conntrack entries"`, 1, 30*time.Second)
	if !strings.Contains(foreign(), "dport=30053") {
		t.Errorf("the pod's flow to another host's port 30053 was deleted with this host's node port; conntrack holds:\n%s", w.node.mustRun(t, "conntrack", "-L", "-p", "udp"))
	}
	own := w.node.mustRun(t, "sh", "-c", fmt.Sprintf("conntrack -L -p udp --orig-src %s --sport %d 2>/dev/null || true", outsideAddr, ownPort))
	if strings.Contains(own, "dport=30053") {
		t.Errorf("the REDIRECTed entry of the removed node port stayed: %s", own)
	}

	// --cleanup: the same.
	writeFile(t, file, netnsManifest)
	px.waitLog(at, `"Portals synced"`, 2, 30*time.Second)
	if _, ok := px.terminate(10 * time.Second); !ok {
		t.Fatal("the proxy did not stop on SIGTERM")
	}
	if r := dial(t, w.pod, "udp", outsideAddr+":30053", "ping", foreignPort); !strings.HasPrefix(r.Reply, "far:") {
		t.Fatalf("pod to the other host's port 30053: %+v", r)
	}
	if out, err := w.node.run(proxyBin, "--cleanup"); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, out)
	}
	if !strings.Contains(foreign(), "dport=30053") {
		t.Errorf("--cleanup deleted the pod's flow to another host's port 30053; conntrack holds:\n%s", w.node.mustRun(t, "conntrack", "-L", "-p", "udp"))
	}
}
