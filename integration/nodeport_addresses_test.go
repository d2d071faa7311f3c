//go:build integration && linux

package integration

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The node-port addresses, as kube-proxy reads --nodeport-addresses: per
// IP family, for every portal that serves node ports.

// serveNodePorts starts a test world with backends be1 (8080, IPv4) and
// be6 (8081, IPv6) and the real binary in its node namespace on manifest
// with --portal=mode and args; it waits until the proxy serves: with
// iptables until its portals are synced, else until it logs serving at
// ready (a pattern).
func serveNodePorts(t *testing.T, mode, manifest, ready string, args ...string) (*world, *proxyProc) {
	t.Helper()
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest)
	px := startNodeProxy(t, w, file, append([]string{"--portal=" + mode}, args...)...)
	if mode == "iptables" {
		px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	} else {
		px.waitLog(0, `"Serving".*`+ready, 1, 30*time.Second)
	}
	return w, px
}

// TestBinaryNodePortAddressesOfOneFamily: --nodeport-addresses with CIDRs
// of IPv4 alone narrows the IPv4 node ports to them and leaves the IPv6
// node ports on every IPv6 address, as kube-proxy adds ::/0 for a family
// none of the CIDRs is in; and the other way round. It turned every node
// port of the other family off.
func TestBinaryNodePortAddressesOfOneFamily(t *testing.T) {
	manifest := dualStackManifest + dualStackIPv6Slice
	for _, mode := range []string{"iptables", "bind", "none"} {
		t.Run(mode+"/IPv4 CIDR", func(t *testing.T) {
			w, _ := serveNodePorts(t, mode, manifest, `198.18.11.1:30096`, "--nodeport-addresses=198.18.11.0/24")
			expectReply(t, w.outside, "tcp", nodeOutSide+":30095", "be1:ping")
			expectReply(t, w.outside, "udp", nodeOutSide+":30096", "be1:ping")
			expectNoReply(t, w.pod, "tcp", nodePodSide+":30095") // outside the IPv4 CIDR
			expectReply(t, w.outside, "tcp", "[fd5e:b1b5:11::1]:30095", "be6:ping")
			expectReply(t, w.outside, "udp", "[fd5e:b1b5:11::1]:30096", "be6:ping")
			expectReply(t, w.pod, "tcp", "[fd5e:b1b5:10::1]:30095", "be6:ping")
		})
		t.Run(mode+"/IPv6 CIDR", func(t *testing.T) {
			w, _ := serveNodePorts(t, mode, manifest, `fd5e:b1b5:11::1\]:30096`, "--nodeport-addresses=fd5e:b1b5:11::/64")
			expectReply(t, w.outside, "tcp", "[fd5e:b1b5:11::1]:30095", "be6:ping")
			expectNoReply(t, w.pod, "tcp", "[fd5e:b1b5:10::1]:30095") // outside the IPv6 CIDR
			expectReply(t, w.outside, "tcp", nodeOutSide+":30095", "be1:ping")
			expectReply(t, w.outside, "udp", nodeOutSide+":30096", "be1:ping")
			expectReply(t, w.pod, "tcp", nodePodSide+":30095", "be1:ping")
		})
	}
}

// routeLoopbackVia makes ns send its traffic to 127.0.0.0/8 out through
// gw, as a neighbour of the node can (route_localnet on the sender): its
// own loopback routes go, and 127.0.0.0/8 is routed to gw.
func routeLoopbackVia(t *testing.T, ns netns, gw string) {
	t.Helper()
	ns.mustRun(t, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1", "net.ipv4.conf.eth0.route_localnet=1")
	ns.mustRun(t, "ip", "addr", "flush", "dev", "lo")
	ns.run("ip", "route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local")
	ns.mustRun(t, "ip", "route", "add", "127.0.0.0/8", "via", gw, "dev", "eth0")
}

// TestBinaryIPTablesLoopbackNodePortsAreTheNodesOwn: a neighbour that sends
// to 127.0.0.1 and a node port through the node (CVE-2020-8558's way in)
// is not redirected, whether --nodeport-addresses is every address or
// names 127.0.0.0/8: the PREROUTING rule rewrote that martian destination
// before routing could drop it, and the neighbour reached the Service on
// the node's loopback. The node's own traffic to 127.0.0.1 is served.
func TestBinaryIPTablesLoopbackNodePortsAreTheNodesOwn(t *testing.T) {
	for _, args := range [][]string{nil, {"--nodeport-addresses=127.0.0.0/8,198.18.11.0/24"}} {
		t.Run(fmt.Sprint(args), func(t *testing.T) {
			w, _ := serveNodePorts(t, "iptables", netnsManifest, "", args...)
			routeLoopbackVia(t, w.outside, nodeOutSide)
			// The world is right: a node port the neighbour may use.
			expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")
			expectNoReply(t, w.outside, "tcp", "127.0.0.1:30080")
			expectNoReply(t, w.outside, "udp", "127.0.0.1:30053")
			expectReply(t, w.node, "tcp", "127.0.0.1:30080", "be1:ping")
			expectReply(t, w.node, "udp", "127.0.0.1:30053", "be1:ping")
		})
	}
}

// TestBinaryNoLocalhostNodePorts: --iptables-localhost-nodeports=false
// (kube-proxy's) serves node ports on no loopback address, not even to the
// node itself, with every portal; the node's other addresses serve them.
// It was accepted and ignored.
func TestBinaryNoLocalhostNodePorts(t *testing.T) {
	for _, mode := range []string{"iptables", "bind", "none"} {
		for _, npa := range []string{"", "127.0.0.0/8,::1/128,198.18.10.0/24"} {
			t.Run(mode+"/"+npa, func(t *testing.T) {
				args := []string{"--iptables-localhost-nodeports=false"}
				if npa != "" {
					args = append(args, "--nodeport-addresses="+npa)
				}
				w, _ := serveNodePorts(t, mode, netnsManifest, `:30053`, args...)
				expectReply(t, w.node, "tcp", nodePodSide+":30080", "be1:ping")
				expectReply(t, w.pod, "udp", nodePodSide+":30053", "be1:ping")
				expectNoReply(t, w.node, "tcp", "127.0.0.1:30080")
				expectNoReply(t, w.node, "udp", "127.0.0.1:30053")
			})
		}
	}
}

// linkLocal returns the IPv6 link-local address of dev in ns.
func linkLocal(t *testing.T, ns netns, dev string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := ns.mustRun(t, "ip", "-6", "-o", "addr", "show", "dev", dev, "scope", "link")
		if f := strings.Fields(out); len(f) > 3 && !strings.Contains(out, "tentative") {
			return strings.Split(f[3], "/")[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no usable link-local address on %s: %q", dev, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestBinaryNodePortsOnLinkLocalAddresses: --nodeport-addresses holding
// IPv6 link-local addresses (fe80::/10) serves node ports on them, bound
// with their interface, and a client on the link reaches them; every
// sync failed (bind: invalid argument, no zone) for as long as the proxy
// ran. Zero CIDRs (0.0.0.0/0,::/0) mean every address, as in kube-proxy:
// the wildcard listeners.
func TestBinaryNodePortsOnLinkLocalAddresses(t *testing.T) {
	for _, mode := range []string{"bind", "none"} {
		for _, tc := range []struct{ cidrs, ready string }{
			{"fe80::/10,198.18.11.0/24", `fe80::[0-9a-f:]+%to-out\]:30095`},
			{"0.0.0.0/0,::/0", `\[::\]:30095`},
		} {
			t.Run(mode+"/"+tc.cidrs, func(t *testing.T) {
				w, px := serveNodePorts(t, mode, dualStackManifest+dualStackIPv6Slice, tc.ready, "--nodeport-addresses="+tc.cidrs)
				node := linkLocal(t, w.node, "to-out")
				expectReply(t, w.outside, "tcp", "["+node+"%eth0]:30095", "be6:ping")
				expectReply(t, w.outside, "udp", "["+node+"%eth0]:30096", "be6:ping")
				expectReply(t, w.outside, "tcp", nodeOutSide+":30095", "be1:ping")
				if strings.HasPrefix(tc.cidrs, "fe80") {
					expectNoReply(t, w.outside, "tcp", "[fd5e:b1b5:11::1]:30095") // not link-local
				}
				if strings.Contains(px.log(), "Sync failed") {
					t.Errorf("a sync failed:\n%s", px.log())
				}
			})
		}
	}
}

// TestBinaryNodePortsWaitForDAD: an IPv6 address still in duplicate
// address detection (tentative) is not bound as a node-port address until
// DAD succeeds, when the address watcher has it served at once; one whose
// DAD failed is never bound. Both made every sync fail (bind: cannot
// assign requested address), the second for ever.
func TestBinaryNodePortsWaitForDAD(t *testing.T) {
	for _, mode := range []string{"bind", "none"} {
		t.Run(mode, func(t *testing.T) {
			w, px := serveNodePorts(t, mode, dualStackManifest+dualStackIPv6Slice, `fd5e:b1b5:11::1\]:30095`, "--nodeport-addresses=fd5e:b1b5:11::/64")
			w.node.mustRun(t, "sysctl", "-qw", "net.ipv6.conf.to-out.accept_dad=1", "net.ipv6.conf.to-out.dad_transmits=3")
			// A duplicate: the outside host holds ::77 already.
			w.outside.mustRun(t, "ip", "-6", "addr", "add", "fd5e:b1b5:11::77/64", "dev", "eth0", "nodad")
			from := px.lineCount()
			w.node.mustRun(t, "ip", "-6", "addr", "add", "fd5e:b1b5:11::99/64", "dev", "to-out")
			w.node.mustRun(t, "ip", "-6", "addr", "add", "fd5e:b1b5:11::77/64", "dev", "to-out")
			if out := w.node.mustRun(t, "ip", "-6", "addr", "show", "dev", "to-out"); !strings.Contains(out, "tentative") {
				t.Fatalf("the new addresses are not tentative:\n%s", out)
			}
			px.waitLog(from, `"Serving".*fd5e:b1b5:11::99\]:30095`, 1, 10*time.Second)
			expectReply(t, w.outside, "tcp", "[fd5e:b1b5:11::99]:30095", "be6:ping")
			if out := w.node.mustRun(t, "ip", "-6", "addr", "show", "dev", "to-out"); !strings.Contains(out, "dadfailed") {
				t.Fatalf("fd5e:b1b5:11::77 did not fail DAD:\n%s", out)
			}
			time.Sleep(1500 * time.Millisecond) // a retry would have come by now
			log := px.logFrom(from)
			if strings.Contains(log, "Sync failed") || strings.Contains(log, "fd5e:b1b5:11::77]:30095") {
				t.Errorf("a tentative or DAD-failed address was bound:\n%s", log)
			}
		})
	}
}

// logFrom is the proxy's log from line index from on.
func (p *proxyProc) logFrom(from int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines[from:], "\n")
}

// TestBinaryNodePortAddressesPrimary: --nodeport-addresses=primary
// (kube-proxy's keyword, which it recommends) serves node ports on the
// node's primary IPs; with --manifests, the addresses of the interface of
// each family's default route (the node's route towards the outside host).
// It was refused at start.
func TestBinaryNodePortAddressesPrimary(t *testing.T) {
	for _, mode := range []string{"iptables", "bind", "none"} {
		t.Run(mode, func(t *testing.T) {
			w, px := serveNodePorts(t, mode, dualStackManifest+dualStackIPv6Slice, `fd5e:b1b5:11::1\]:30095`, "--nodeport-addresses=primary")
			px.waitLog(0, `"Node ports are served on this node's primary IPs.*nodePortAddresses=\["198.18.11.1/32","fd5e:b1b5:11::1/128"\]`, 1, time.Second)
			expectReply(t, w.outside, "tcp", nodeOutSide+":30095", "be1:ping")
			expectReply(t, w.outside, "tcp", "[fd5e:b1b5:11::1]:30095", "be6:ping")
			expectReply(t, w.pod, "udp", nodeOutSide+":30096", "be1:ping")
			expectNoReply(t, w.pod, "tcp", nodePodSide+":30095")
			expectNoReply(t, w.pod, "tcp", "[fd5e:b1b5:10::1]:30095")
		})
	}
}

// loopbackExternalIPManifest adds a Service whose external IP is a
// loopback address, which manifests accept.
const loopbackExternalIPManifest = `---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: e2e}
spec:
  clusterIP: 198.18.0.41
  externalIPs: ["127.0.0.2"]
  ports: [{name: http, protocol: TCP, port: 8888}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ext-1, namespace: e2e, labels: {kubernetes.io/service-name: ext}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"]}]
`

// TestBinaryIPTablesLoopbackFrontendsAreTheNodesOwn: an external IP in
// 127.0.0.0/8 was REDIRECTed in PREROUTING, so a neighbour that routes
// 127.0.0.0/8 through the node (CVE-2020-8558's way in) reached the
// Service; now, as for loopback node ports, only the node's own traffic
// to it is served.
func TestBinaryIPTablesLoopbackFrontendsAreTheNodesOwn(t *testing.T) {
	w, _ := serveNodePorts(t, "iptables", netnsManifest+loopbackExternalIPManifest, "")
	routeLoopbackVia(t, w.outside, nodeOutSide)
	expectReply(t, w.outside, "tcp", "198.18.0.41:8888", "be1:ping") // the world is right
	expectNoReply(t, w.outside, "tcp", "127.0.0.2:8888")
	expectReply(t, w.node, "tcp", "127.0.0.2:8888", "be1:ping")
}

// localNodePortManifest is a NodePort Service with externalTrafficPolicy
// Local and its endpoint on this node, so its node port has a proxy port
// of its own.
const localNodePortManifest = `apiVersion: v1
kind: Service
metadata: {name: local, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.72
  externalTrafficPolicy: Local
  ports: [{name: http, protocol: TCP, port: 80, nodePort: 30072}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: e2e, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: node}]
`

// TestBinaryUnredirectedExternalProxyPortIsGuarded: with node ports on
// loopback addresses alone and --iptables-localhost-nodeports=false, no
// node-port rule is written; the Local policy's external proxy port still
// listens, and had no KUBE-NODEPORT-NON-LOCAL rules, so anyone reached it
// straight. Now a new connection sent straight to it is dropped, as to
// any proxy port.
func TestBinaryUnredirectedExternalProxyPortIsGuarded(t *testing.T) {
	w, px := serveNodePorts(t, "iptables", localNodePortManifest, "", "--nodeport-addresses=127.0.0.0/8", "--iptables-localhost-nodeports=false")
	px.waitLog(0, `via="external-proxy-port"`, 1, 30*time.Second)
	m := regexp.MustCompile(`addr="0\.0\.0\.0:(\d+)" via="external-proxy-port"`).FindStringSubmatch(px.log())
	if m == nil {
		t.Fatalf("no external proxy port in the log:\n%s", px.log())
	}
	expectReply(t, w.pod, "tcp", "198.18.0.72:80", "be1:ping") // the world is right
	expectNoReply(t, w.outside, "tcp", nodeOutSide+":"+m[1])
}

// TestBinaryNodePortAddressChangeMovesUDPClients: a restart with other
// --nodeport-addresses leaves each UDP client that keeps its source port on
// the mapping its conntrack entry holds: one narrowed out went on being
// served through the old REDIRECT, one widened in went on being refused.
// Now the first sync deletes the entries of node ports whose rules'
// destinations changed.
func TestBinaryNodePortAddressChangeMovesUDPClients(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	w.node.mustRun(t, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "198.18.200.0/24", "-j", "MASQUERADE") // a nat rule, as any node has
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	const narrowedOut, widenedIn = 45461, 45462
	addr := nodeOutSide + ":30053"
	send := func(port int) clientResult { return dial(t, w.outside, "udp", addr, "ping", port) }

	px := startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	if r := send(narrowedOut); !strings.HasPrefix(r.Reply, "be1:") {
		t.Fatalf("node port on every address: %+v", r)
	}
	px.terminate(10 * time.Second)

	// "Portals synced" comes before the conntrack clean-up.
	px = startNodeProxy(t, w, file, "--portal=iptables", "--nodeport-addresses=198.18.10.0/24")
	px.waitLog(0, `"Deleted stale UDP conntrack entries"`, 1, 30*time.Second)
	expectReply(t, w.pod, "udp", nodePodSide+":30053", "be1:ping") // the world is right
	if r := send(narrowedOut); r.Err == "" {
		t.Errorf("a client narrowed out of --nodeport-addresses is still served through its old entry: %q", r.Reply)
	}
	if r := send(widenedIn); r.Err == "" {
		t.Fatalf("a node port outside --nodeport-addresses answered: %q", r.Reply)
	}
	px.terminate(10 * time.Second)

	px = startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Deleted stale UDP conntrack entries"`, 1, 30*time.Second)
	if r := send(widenedIn); !strings.HasPrefix(r.Reply, "be1:") {
		t.Errorf("a client widened into --nodeport-addresses is still refused through its old entry: %+v; conntrack holds:\n%s", r, w.node.mustRun(t, "conntrack", "-L", "-p", "udp"))
	}
	px.terminate(10 * time.Second)
}

// TestBinaryStopWhileWaitingForPrimaryIPs: a SIGTERM while
// --nodeport-addresses=primary waits for the Node (here behind an API
// server that never answers) stops the proxy there, saying so. Before, the
// wait was logged as having given up after 30 s, and start-up went on
// (portal, listeners, "Starting kube-userspace-proxy") before the proxy
// noticed it was asked to stop.
func TestBinaryStopWhileWaitingForPrimaryIPs(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "unreachable.kubeconfig")
	writeFile(t, kubeconfig, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`)
	p := startProxy(t, "--kubeconfig", kubeconfig, "--portal=none", "--hostname-override=n1", "--nodeport-addresses=primary")
	p.waitLog(0, `"Version info"`, 1, 10*time.Second)
	time.Sleep(500 * time.Millisecond) // into the wait, which retries every second
	took, ok := p.terminate(5 * time.Second)
	if !ok {
		t.Fatalf("the proxy did not stop within 5s of SIGTERM:\n%s", p.log())
	}
	if p.err != nil {
		t.Errorf("exit status after SIGTERM: %v", p.err)
	}
	log := p.log()
	if !strings.Contains(log, "Stopping before start-up finished, while reading this node's primary IPs") {
		t.Errorf("the proxy did not say it stopped while waiting (%v):\n%s", took, log)
	}
	for _, wrong := range []string{"gave up after", "Starting kube-userspace-proxy", "default route's interface"} {
		if strings.Contains(log, wrong) {
			t.Errorf("the log says %q after a SIGTERM during the wait:\n%s", wrong, log)
		}
	}
}
