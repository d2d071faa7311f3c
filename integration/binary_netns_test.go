//go:build integration && linux

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The real binary, run in the node namespace of a test world (see
// netns_test.go) with the iptables and bind portals, reached by real
// clients from the pod, the outside host and the node itself.

// netnsManifest is what the node serves: a TCP service with a ClusterIP,
// NodePort, ExternalIP and load-balancer IP; a UDP service; and an IPv6
// service. Every endpoint is the backend namespace's echo server.
const netnsManifest = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: e2e}
spec:
  type: LoadBalancer
  clusterIP: 198.18.0.10
  externalIPs: [198.19.0.5]
  ports: [{name: http, protocol: TCP, port: 80, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.1.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: e2e, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"]}]
---
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.53
  ports: [{name: dns, protocol: UDP, port: 53, nodePort: 30053}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: e2e, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, protocol: UDP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"]}]
---
apiVersion: v1
kind: Service
metadata: {name: web6, namespace: e2e}
spec:
  clusterIP: fd5e:b1b5::10
  ipFamilies: [IPv6]
  ports: [{name: http, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web6-1, namespace: e2e, labels: {kubernetes.io/service-name: web6}}
addressType: IPv6
ports: [{name: http, protocol: TCP, port: 8081}]
endpoints: [{addresses: ["fd5e:b1b5:12::2"]}]
`

// checkServed sends real traffic to every frontend of netnsManifest from
// where clients use it; nodeOwnAddr adds a NodePort on the node's own
// address, from the node.
func checkServed(t *testing.T, w *world, nodeOwnAddr bool) {
	t.Helper()
	cases := []struct {
		name               string
		from               netns
		proto, addr, reply string
	}{
		{"TCP ClusterIP from the pod", w.pod, "tcp", "198.18.0.10:80", "be1:ping"},
		{"TCP ClusterIP from the node", w.node, "tcp", "198.18.0.10:80", "be1:ping"},
		{"UDP ClusterIP from the pod", w.pod, "udp", "198.18.0.53:53", "be1:ping"},
		{"UDP ClusterIP from the node", w.node, "udp", "198.18.0.53:53", "be1:ping"},
		{"TCP NodePort from the outside", w.outside, "tcp", nodeOutSide + ":30080", "be1:ping"},
		{"UDP NodePort from the outside", w.outside, "udp", nodeOutSide + ":30053", "be1:ping"},
		{"NodePort on the node's own address", w.node, "tcp", nodePodSide + ":30080", "be1:ping"},
		{"ExternalIP from the pod", w.pod, "tcp", "198.19.0.5:80", "be1:ping"},
		{"LB IP from the outside", w.outside, "tcp", "198.19.1.1:80", "be1:ping"},
		{"IPv6 ClusterIP from the pod", w.pod, "tcp", "[fd5e:b1b5::10]:80", "be6:ping"},
	}
	for _, tc := range cases {
		if tc.name == "NodePort on the node's own address" && !nodeOwnAddr {
			continue
		}
		t.Run(tc.name, func(t *testing.T) { expectReply(t, tc.from, tc.proto, tc.addr, tc.reply) })
	}
}

// startNodeProxy runs the real binary in the node namespace.
func startNodeProxy(t *testing.T, w *world, file string, args ...string) *proxyProc {
	t.Helper()
	full := append([]string{"netns", "exec", string(w.node), proxyBin, "--manifests", file, "--hostname-override=node", "-v=2"}, args...)
	return startCommand(t, "ip", full...)
}

// serveManifest starts a test world whose backend serves backends
// ("port=name"), and the real binary in its node namespace on manifest
// with --portal=mode; it waits until the proxy serves: with iptables until
// its portals are synced, with bind until it logs serving at bindReady (a
// pattern of a frontend's address and port). It returns the world, the
// proxy and the manifest file, for edits.
func serveManifest(t *testing.T, mode, manifest, bindReady string, backends ...string) (*world, *proxyProc, string) {
	t.Helper()
	w := newWorld(t)
	startBackend(t, w.backend, backends...)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest)
	px := startNodeProxy(t, w, file, "--portal="+mode)
	if mode == "iptables" {
		px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	} else {
		px.waitLog(0, `"Serving".*`+bindReady, 1, 30*time.Second)
	}
	return w, px, file
}

func TestBinaryIPTablesPortal(t *testing.T) {
	top := t // the restarted proxy lives as long as the test, not a subtest
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6", "8082=be2")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)

	t.Run("serves", func(t *testing.T) { checkServed(t, w, true) })
	before := ourRules(t, w.node, "nft")

	t.Run("kill -9 and restart", func(t *testing.T) {
		px.cmd.Process.Kill()
		<-px.done
		start := time.Now()
		px = startNodeProxy(top, w, file, "--portal=iptables")
		// Clients succeed again within 2 s: the rules were kept and the
		// new process took the same proxy ports (it serves within
		// 100 ms here). The client runs in this process: a client
		// helper's exit would count (a second under the race detector,
		// see dialHere).
		var r clientResult
		for time.Since(start) < 5*time.Second {
			if r = dialHere(t, w.pod, "tcp", "198.18.0.10:80", "ping", 0); r.Err == "" && strings.HasPrefix(r.Reply, "be1:") {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		took := time.Since(start)
		if r.Err != "" || took > 2*time.Second {
			t.Fatalf("after restart: %+v after %v, want a reply within 2s", r, took)
		}
		t.Logf("served again %v after the restart", took)
		px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
		if after := ourRules(t, w.node, "nft"); !slices.Equal(before, after) {
			t.Fatalf("rules changed across the restart:\nbefore:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
		}
		checkServed(t, w, true)
	})

	t.Run("a UDP client keeping its port follows endpoint and service changes", func(t *testing.T) {
		const port = 40053 // the client's source port: its conntrack entry stays the same flow
		expectFrom := func(prefix string) {
			t.Helper()
			var r clientResult
			for range 20 { // changes apply asynchronously; bounded
				if r = dial(t, w.pod, "udp", "198.18.0.53:53", "ping", port); r.Err == "" && strings.HasPrefix(r.Reply, prefix) {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Fatalf("UDP from port %d: %+v, want a reply from %s", port, r, prefix)
		}
		expectFrom("be1:")
		// The endpoint moves: the proxy ends the session at once.
		from := px.lineCount()
		writeFile(t, file, strings.Replace(netnsManifest, "ports: [{name: dns, protocol: UDP, port: 8080}]", "ports: [{name: dns, protocol: UDP, port: 8082}]", 1))
		px.waitLog(from, `"Applying edited manifests"`, 1, 10*time.Second)
		expectFrom("be2:")
		// The service goes and comes back on a new proxy port: the
		// client's conntrack entry to the old port is deleted, so its next
		// datagram is redirected afresh.
		from = px.lineCount()
		withoutDNS := strings.Replace(netnsManifest, "name: dns, namespace: e2e}", "name: dns-gone, namespace: e2e}", 1)
		writeFile(t, file, withoutDNS)
		px.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
		from = px.lineCount()
		writeFile(t, file, netnsManifest)
		px.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
		expectFrom("be1:")
	})

	t.Run("a service without endpoints refuses, as kube-proxy's REJECT does", func(t *testing.T) {
		// A UDP client that keeps its port has a conntrack entry that
		// would carry it past the REJECT: the proxy deletes it.
		const keptPort = 40054
		if r := dial(t, w.pod, "udp-connected", "198.18.0.53:53", "ping", keptPort); r.Err != "" || !strings.HasPrefix(r.Reply, "be1:") {
			t.Fatalf("UDP before the endpoints go: %+v", r)
		}
		from := px.lineCount()
		writeFile(t, file, strings.ReplaceAll(netnsManifest, `endpoints: [{addresses: ["198.18.12.2"]}]`, `endpoints: []`))
		px.waitLog(from, `"Applying edited manifests"`, 1, 10*time.Second)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) { // the rules follow within a sync
			if out, _ := w.pod.run("nc", "-z", "-v", "-w2", "198.18.0.10", "80"); strings.Contains(out, "refused") {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("nc -z to a service without endpoints still connects 5s after the edit: %q", out)
			}
		}
		// nc exits at once with "Connection refused", instead of
		// connecting and then reading a reset.
		refused := func(from netns, shell string) {
			t.Helper()
			start := time.Now()
			out, err := from.run("sh", "-c", shell)
			if err == nil || !strings.Contains(out, "refused") || time.Since(start) > time.Second {
				t.Errorf("%s in %s: %v after %v: %q; want a quick refusal", shell, from, err, time.Since(start).Round(time.Millisecond), out)
			}
		}
		refused(w.pod, "nc -z -v -w2 198.18.0.10 80")
		refused(w.outside, "nc -z -v -w2 "+nodeOutSide+" 30080")
		refused(w.node, "nc -z -v -w2 198.18.0.10 80")
		// nc -u cannot tell: a resolver's connected socket can, a new one
		// and the one that kept its port. The kept port's conntrack entry
		// goes just after the rules change (first the REJECT, so no new
		// entry can form): wait for that, or its datagram may still take
		// the old entry to the proxy, which has nowhere to send it.
		px.waitLog(from, `"Deleted stale UDP conntrack entries"`, 1, 10*time.Second)
		for _, port := range []int{0, keptPort} {
			start := time.Now()
			// In this process: a client helper's exit would count.
			if r := dialHere(t, w.pod, "udp-connected", "198.18.0.53:53", "ping", port); !strings.Contains(r.Err, "connection refused") || time.Since(start) > time.Second {
				t.Errorf("UDP from port %d to a service without endpoints: %+v after %v; want a quick \"connection refused\"", port, r, time.Since(start).Round(time.Millisecond))
			}
		}
		for _, r := range ourRules(t, w.node, "nft") {
			if strings.Contains(r, "e2e/web:http has no endpoints") && !strings.Contains(r, "REJECT") {
				t.Errorf("no-endpoints rule is not a REJECT: %s", r)
			}
		}

		from = px.lineCount()
		writeFile(t, file, netnsManifest)
		px.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
		expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
		expectReply(t, w.pod, "udp", "198.18.0.53:53", "be1:ping")
	})

	t.Run("a deleted service stops answering and its rules go", func(t *testing.T) {
		from := px.lineCount()
		cut := netnsManifest[:strings.Index(netnsManifest, "---\napiVersion: v1\nkind: Service\nmetadata: {name: dns")]
		writeFile(t, file, cut)
		px.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
		expectNoReply(t, w.pod, "udp", "198.18.0.53:53")
		for _, r := range ourRules(t, w.node, "nft") {
			if strings.Contains(r, "e2e/dns") || strings.Contains(r, "e2e/web6") {
				t.Errorf("rule of a deleted service left: %s", r)
			}
		}
		expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	})

	t.Run("--cleanup removes everything", func(t *testing.T) {
		px.cmd.Process.Kill()
		<-px.done
		for i := range 2 { // harmless the second time
			out, err := exec.Command("ip", "netns", "exec", string(w.node), proxyBin, "--cleanup").CombinedOutput()
			if err != nil {
				t.Fatalf("--cleanup: %v\n%s", err, out)
			}
			// It says what it removed, and only then.
			if said := strings.Contains(string(out), `"Removed the iptables portal's rules"`); said != (i == 0) || strings.Contains(string(out), "Using iptables portal") {
				t.Errorf("--cleanup run %d said:\n%s", i+1, out)
			}
		}
		if left := ourRules(t, w.node, "nft"); len(left) > 0 {
			t.Fatalf("left after --cleanup:\n%s", strings.Join(left, "\n"))
		}
	})
}

func TestBinaryBindPortal(t *testing.T) {
	top := t
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=bind")
	px.waitLog(0, `"Serving".*198.18.0.53:53`, 1, 30*time.Second)
	if out, _ := w.node.run("iptables-nft-save"); strings.Contains(out, "KUBE-") {
		t.Fatalf("the bind portal wrote iptables rules:\n%s", out)
	}
	dev := bindDevice(t, w.node)

	checkServed(t, w, false)

	t.Run("kill -9 and restart", func(t *testing.T) {
		before := serviceAddrsOn(t, w.node, dev)
		px.cmd.Process.Kill()
		<-px.done
		start := time.Now()
		px = startNodeProxy(top, w, file, "--portal=bind")
		// TCP: a try before the proxy is back is refused at once, where a
		// UDP try would wait out its read timeout.
		var r clientResult
		for time.Since(start) < 5*time.Second {
			if r = dial(t, w.pod, "tcp", "198.18.0.10:80", "ping", 0); r.Err == "" && strings.HasPrefix(r.Reply, "be1:") {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if took := time.Since(start); r.Err != "" || took > 2*time.Second {
			t.Fatalf("after restart: %+v after %v, want a reply within 2s", r, took)
		}
		px.waitLog(0, `"Serving".*198.18.0.53:53`, 1, 10*time.Second)
		expectReply(t, w.pod, "udp", "198.18.0.53:53", "be1:ping")
		if after := serviceAddrsOn(t, w.node, dev); !slices.Equal(before, after) {
			t.Fatalf("addresses changed across the restart: %v, then %v", before, after)
		}
		expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")
	})

	t.Run("a deleted service stops answering and its address goes", func(t *testing.T) {
		from := px.lineCount()
		cut := netnsManifest[:strings.Index(netnsManifest, "---\napiVersion: v1\nkind: Service\nmetadata: {name: dns")]
		writeFile(t, file, cut)
		px.waitLog(from, `"Stopped serving".*198.18.0.53:53`, 1, 10*time.Second)
		expectNoReply(t, w.pod, "udp", "198.18.0.53:53")
		if addrs := strings.Join(serviceAddrsOn(t, w.node, dev), " "); strings.Contains(addrs, "198.18.0.53/32") || strings.Contains(addrs, "fd5e:b1b5::10/128") {
			t.Fatalf("addresses of deleted services left on %s: %s", dev, addrs)
		}
		expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	})

	t.Run("--cleanup removes the addresses", func(t *testing.T) {
		px.cmd.Process.Kill()
		<-px.done
		out, err := exec.Command("ip", "netns", "exec", string(w.node), proxyBin, "--cleanup").CombinedOutput()
		if err != nil {
			t.Fatalf("--cleanup: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), `"Removed the bind portal's service addresses"`) && !strings.Contains(string(out), `"Deleted the bind portal's interface`) {
			t.Errorf("--cleanup does not say what it removed:\n%s", out)
		}
		if addrs := serviceAddrsOn(t, w.node, dev); len(addrs) > 0 {
			t.Fatalf("addresses left on %s after --cleanup: %v", dev, addrs)
		}
	})
}

// TestBinaryAutoPortal: auto picks iptables where it is usable (root, a
// network namespace with netfilter), and none for an unprivileged user,
// saying which and why.
func TestBinaryAutoPortal(t *testing.T) {
	w := newWorld(t)
	requireTool(t, "setpriv")
	// A directory the unprivileged run can read and watch.
	dir, err := os.MkdirTemp("", "kup-auto-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=auto")
	px.waitLog(0, `"Portal chosen" portal="iptables"`, 1, 20*time.Second)
	px.waitLog(0, `"Portals synced"`, 1, 20*time.Second)

	// The same, unprivileged: no iptables, no address changes, so none;
	// node ports are then served by listening on them (above 1024 here).
	args := []string{"netns", "exec", string(w.node), "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		proxyBin, "--manifests", file, "--hostname-override=node", "--portal=auto"}
	nobody := startCommand(t, "ip", args...)
	nobody.waitLog(0, `"Portal chosen" portal="none"`, 1, 20*time.Second)
	nobody.waitLog(0, `"Serving".*:30053.*node-port`, 1, 20*time.Second)

	nobody.terminate(10 * time.Second) // it holds the node ports

	// Root without CAP_NET_ADMIN, as in a container that was not granted
	// it: iptables is out, and so is bind, which would fail on every sync.
	args = []string{"netns", "exec", string(w.node), "setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin",
		proxyBin, "--manifests", file, "--hostname-override=node", "--portal=auto"}
	capless := startCommand(t, "ip", args...)
	capless.waitLog(0, `"Portal chosen" portal="none"`, 1, 20*time.Second)
	capless.waitLog(0, `bindError=".*CAP_NET_ADMIN`, 1, time.Second) // a later line of the same entry
	capless.waitLog(0, `"Serving".*:30053.*node-port`, 1, 20*time.Second)
}

// TestBinaryNodePortAddressesFollowTheHost: without kernel portals the
// proxy listens on each node address --nodeport-addresses selects, and
// serves one added after it started, and stops serving one removed, at
// once rather than at the next resync (30 s).
func TestBinaryNodePortAddressesFollowTheHost(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=none", "--nodeport-addresses=198.18.77.0/24")
	px.waitLog(0, `"Serving"`, 1, 30*time.Second)
	if strings.Contains(px.log(), ":30080") {
		t.Fatalf("a node port is served before any address in 198.18.77.0/24 exists:\n%s", px.log())
	}
	px.waitLog(0, `"No address of this host is in --nodeport-addresses`, 1, 5*time.Second)
	from := px.lineCount()
	start := time.Now()
	w.node.mustRun(t, "ip", "addr", "add", "198.18.77.1/32", "dev", "lo")
	px.waitLog(from, `"Serving".*198.18.77.1:30080`, 1, 5*time.Second)
	px.waitLog(from, `"An address of this host is in --nodeport-addresses again`, 1, 5*time.Second)
	t.Logf("served %v after the address came", time.Since(start).Round(time.Millisecond))
	expectReply(t, w.node, "tcp", "198.18.77.1:30080", "be1:")

	from = px.lineCount()
	w.node.mustRun(t, "ip", "addr", "del", "198.18.77.1/32", "dev", "lo")
	px.waitLog(from, `"Stopped serving".*198.18.77.1:30080`, 1, 5*time.Second)
}

// TestBinaryIPTablesPortalDNATsToTheBindAddress: with the iptables portal a
// --bind-address (a kube-proxy ConfigMap's bindAddress, often the node's
// IP) is where the portal DNATs, as the legacy proxier did, while the
// proxy ports listen on every address. (Listening on that address alone,
// behind REDIRECT, which delivers to the address of the interface a packet
// came in on, served nothing else, IPv6 least of all.)
func TestBinaryIPTablesPortalDNATsToTheBindAddress(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables", "--bind-address="+nodeBackSide)
	px.waitLog(0, `"Portals DNAT to a node address instead of REDIRECT" IPv4="`+nodeBackSide+`" why="the bind address"`, 1, 30*time.Second)
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	if rules := w.node.mustRun(t, "iptables", "-t", "nat", "-S", "KUBE-PORTALS-CONTAINER"); !strings.Contains(rules, "-j DNAT --to-destination "+nodeBackSide+":") {
		t.Fatalf("the portal rules do not DNAT to the bind address:\n%s", rules)
	}
	checkServed(t, w, true)
}

// TestBinaryIPTablesPortalServesPodsBehindAddresslessInterfaces: Calico's
// pods reach the node through a veth whose node side has no IPv4 address
// (proxy ARP answers for their gateway, 169.254.1.1). REDIRECT sends a
// packet to the first address of the interface it came in on, and drops
// it when there is none, so every Service was black-holed for those pods.
// The portal now DNATs to a node address while such interfaces carry IPv4
// routes, and REDIRECTs again once they are gone.
func TestBinaryIPTablesPortalServesPodsBehindAddresslessInterfaces(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	if strings.Contains(px.log(), `"Portals DNAT to a node address`) {
		t.Fatalf("the portal DNATs before any interface needs it:\n%s", px.log())
	}

	// A pod the Calico way: a veth without an IPv4 address on the node,
	// a /32 route to the pod, proxy ARP for its gateway.
	cali := newNetns(t, "cali")
	const caliPod = "198.18.20.2"
	from := px.lineCount()
	w.node.mustRun(t, "ip", "link", "add", "cali0", "type", "veth", "peer", "name", "eth0", "netns", string(cali))
	w.node.mustRun(t, "sysctl", "-qw", "net.ipv4.conf.cali0.proxy_arp=1", "net.ipv4.ip_forward=1")
	w.node.mustRun(t, "ip", "link", "set", "cali0", "up")
	w.node.mustRun(t, "ip", "route", "add", caliPod+"/32", "dev", "cali0")
	cali.mustRun(t, "ip", "addr", "add", caliPod+"/32", "dev", "eth0")
	cali.mustRun(t, "ip", "link", "set", "eth0", "up")
	cali.mustRun(t, "ip", "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
	cali.mustRun(t, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
	px.waitLog(from, `"Portals DNAT to a node address instead of REDIRECT" IPv4="[0-9.]+".*interfaces cali0 carry IPv4 routes but have no IPv4 address`, 1, 10*time.Second)
	px.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
	expectReply(t, cali, "tcp", "198.18.0.10:80", "be1:ping")
	expectReply(t, cali, "udp", "198.18.0.53:53", "be1:ping")
	if view := w.node.mustRun(t, "curl", "-s", "http://127.0.0.1:10249/debug/services"); !regexp.MustCompile(`198\.18\.0\.10:80/TCP -> [0-9.]+:[0-9]+ \(DNAT\)`).MatchString(view) {
		t.Errorf("/debug/services does not show the DNAT:\n%s", view)
	}
	// Everyone else is still served, the node's own traffic too.
	checkServed(t, w, true)

	from = px.lineCount()
	w.node.mustRun(t, "ip", "link", "del", "cali0")
	px.waitLog(from, `"Portals REDIRECT to the proxy ports"`, 1, 10*time.Second)
	px.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
	if rules := w.node.mustRun(t, "iptables", "-t", "nat", "-S", "KUBE-PORTALS-CONTAINER"); strings.Contains(rules, "DNAT") {
		t.Fatalf("the portal still DNATs once no interface needs it:\n%s", rules)
	}
	checkServed(t, w, true)
}

// TestBinaryIPTablesPortalRewrittenByAnotherProxy: a second proxy on the
// node (a debugging run, a systemd unit beside the DaemonSet) rewrites the
// portal's rules to its own proxy ports. At its next resync the first
// proxy says so, writes its rules again, and clears the UDP conntrack
// entries the other's rules made: a client that keeps its source port,
// whose flow the other proxy took before it died, is served again (it
// was black-holed for good, its entry pointing at a dead port).
func TestBinaryIPTablesPortalRewrittenByAnotherProxy(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	// IPv4 Services only, as most clusters have: the IPv6 chains hold no
	// rule, which must not stop the check (it did).
	writeFile(t, file, netnsManifest[:strings.Index(netnsManifest, "---\napiVersion: v1\nkind: Service\nmetadata: {name: web6")])
	a := startNodeProxy(t, w, file, "--portal=iptables", "--proxy-port-range=40000-40099", "--iptables-sync-period=5s")
	a.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	expectReply(t, w.pod, "udp", "198.18.0.53:53", "be1:ping")

	b := startNodeProxy(t, w, file, "--portal=iptables", "--proxy-port-range=41000-41099",
		"--healthz-bind-address=127.0.0.1:20256", "--metrics-bind-address=127.0.0.1:20249")
	b.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	from := a.lineCount()
	// A flow from a fixed port, made while the other proxy's rules are in
	// place, goes to it; then it dies, its rules left behind.
	const srcPort = 40555
	if r := dial(t, w.pod, "udp", "198.18.0.53:53", "ping", srcPort); !strings.HasPrefix(r.Reply, "be1:") {
		t.Fatalf("through the second proxy: reply %q, err %q", r.Reply, r.Err)
	}
	if _, ok := b.stop(syscall.SIGKILL, 5*time.Second); !ok {
		t.Fatal("the second proxy did not die")
	}
	a.waitLog(from, `"The portal's rules were rewritten by something else since the last sync`, 1, 15*time.Second)
	a.waitLog(from, `"Deleted stale UDP conntrack entries"`, 1, 5*time.Second)
	if rules := w.node.mustRun(t, "iptables", "-t", "nat", "-S", "KUBE-PORTALS-CONTAINER"); strings.Contains(rules, "--to-ports 410") {
		t.Fatalf("the second proxy's rules are still there:\n%s", rules)
	}
	if r := dial(t, w.pod, "udp", "198.18.0.53:53", "ping", srcPort); !strings.HasPrefix(r.Reply, "be1:") {
		t.Fatalf("the fixed-port client after the first proxy took its rules back: reply %q, err %q", r.Reply, r.Err)
	}
	// The next resync finds its own rules, writes nothing and says
	// nothing.
	a.waitLog(a.lineCount(), `"Portals in place; nothing written"`, 1, 15*time.Second)
	if n := strings.Count(a.log(), "rewritten by something else"); n != 1 {
		t.Errorf("said %d times that the rules were rewritten, want once (they are its own again)", n)
	}
}

// TestBinaryIPTablesPortalBindAddressLeavesTheHost: a --bind-address that
// leaves the host (a DHCP change, a VIP moved) is no longer a DNAT target,
// which would send Service traffic nowhere; the proxy says so, and DNATs
// to it again once it is back.
func TestBinaryIPTablesPortalBindAddressLeavesTheHost(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	const vip = "198.18.10.9"
	w.node.mustRun(t, "ip", "addr", "add", vip+"/24", "dev", "to-pod")
	px := startNodeProxy(t, w, file, "--portal=iptables", "--bind-address="+vip)
	px.waitLog(0, `"Portals DNAT to a node address instead of REDIRECT" IPv4="`+vip+`"`, 1, 30*time.Second)
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")

	from := px.lineCount()
	w.node.mustRun(t, "ip", "addr", "del", vip+"/24", "dev", "to-pod")
	px.waitLog(from, `"The bind address is no longer one of this host's`, 1, 10*time.Second)
	px.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	expectReply(t, w.pod, "udp", "198.18.0.53:53", "be1:ping")

	from = px.lineCount()
	w.node.mustRun(t, "ip", "addr", "add", vip+"/24", "dev", "to-pod")
	px.waitLog(from, `"Portals DNAT to a node address instead of REDIRECT" IPv4="`+vip+`"`, 1, 10*time.Second)
}

// TestBinaryCaptureCheckFollowsHostAddresses: an endpoint at an address
// this host gains later, with a Service's node port, is ignored once the
// address comes (a connection to it would loop through the proxy's node
// port), and served again once it goes; it was checked only when the
// manifests changed.
func TestBinaryCaptureCheckFollowsHostAddresses(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	const later = "198.18.77.7"
	writeFile(t, file, netnsManifest+`---
apiVersion: v1
kind: Service
metadata: {name: loopy, namespace: e2e}
spec:
  clusterIP: 198.18.0.77
  ports: [{name: http, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: loopy-1, namespace: e2e, labels: {kubernetes.io/service-name: loopy}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 30080}]
endpoints: [{addresses: ["`+later+`"]}, {addresses: ["198.18.12.2"]}]
`)
	px := startNodeProxy(t, w, file, "--portal=none", "--healthz-bind-address=", "--metrics-bind-address=")
	px.waitLog(0, `"Serving"`, 1, 30*time.Second)
	if strings.Contains(px.log(), later+":30080 is an address of this host") {
		t.Fatalf("ignored before the address is the host's:\n%s", px.log())
	}
	from := px.lineCount()
	w.node.mustRun(t, "ip", "addr", "add", later+"/32", "dev", "lo")
	px.waitLog(from, later+`:30080 is an address of this host with Service e2e/web:http/TCP's node port`, 1, 10*time.Second)
	px.waitLog(from, `"Applying the manifests again: this host's addresses changed what they serve"`, 1, 5*time.Second)
	from = px.lineCount()
	w.node.mustRun(t, "ip", "addr", "del", later+"/32", "dev", "lo")
	px.waitLog(from, `"Applying the manifests again: this host's addresses changed what they serve"`, 1, 10*time.Second)
}

// TestBinaryIPTablesPortalTargetRewritten: a hand edit that changes only
// where a rule sends traffic (REDIRECT to a DNAT elsewhere, same proxy
// port) is noticed at the next full resync and undone, as a rewrite of
// the ports is; it went unseen and unsaid.
func TestBinaryIPTablesPortalTargetRewritten(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables", "--iptables-sync-period=3s")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	var first string
	for _, l := range strings.Split(w.node.mustRun(t, "iptables", "-t", "nat", "-S", "KUBE-PORTALS-CONTAINER"), "\n") {
		if strings.HasPrefix(l, "-A ") && strings.Contains(l, "-j REDIRECT") {
			first = l
			break
		}
	}
	if first == "" {
		t.Fatal("no REDIRECT rule to edit")
	}
	edited := regexp.MustCompile(`-j REDIRECT --to-ports (\d+)`).ReplaceAllString(first, "-j DNAT --to-destination 198.18.3.1:$1")
	from := px.lineCount()
	w.node.mustRun(t, "sh", "-c", "iptables -t nat -R KUBE-PORTALS-CONTAINER 1 "+strings.TrimPrefix(edited, "-A KUBE-PORTALS-CONTAINER "))
	if rules := w.node.mustRun(t, "iptables", "-t", "nat", "-S", "KUBE-PORTALS-CONTAINER"); !strings.Contains(rules, "198.18.3.1") {
		t.Fatalf("the edit did not take:\n%s", rules)
	}
	px.waitLog(from, `"The portal's rules were rewritten by something else since the last sync`, 1, 10*time.Second)
	px.waitLog(from, `"Synced iptables portals"`, 1, 5*time.Second)
	if rules := w.node.mustRun(t, "iptables", "-t", "nat", "-S", "KUBE-PORTALS-CONTAINER"); strings.Contains(rules, "198.18.3.1") {
		t.Fatalf("the edit is still there:\n%s", rules)
	}
}

// TestBinaryIPTablesPortalRestartFromDNATToRedirect: a proxy that DNATed
// to a node address (an address-less interface carried a route) stops;
// meanwhile the interface goes and the node address changes, so the next
// run REDIRECTs with the same proxy ports. Its first sync compares where
// the previous run's rules sent traffic with where its own do, and clears
// the UDP entries DNATed to the address the host no longer has: a client
// that keeps its source port was black-holed for ever.
func TestBinaryIPTablesPortalRestartFromDNATToRedirect(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	// As any real node has (a CNI's MASQUERADE): with no nat rule at all
	// the kernel would not apply an old entry's NAT.
	w.node.mustRun(t, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "198.18.200.0/24", "-j", "MASQUERADE")
	cali := newNetns(t, "cali")
	w.node.mustRun(t, "ip", "link", "add", "cali0", "type", "veth", "peer", "name", "eth0", "netns", string(cali))
	w.node.mustRun(t, "ip", "link", "set", "cali0", "up")
	w.node.mustRun(t, "ip", "route", "add", "198.18.20.2/32", "dev", "cali0")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals DNAT to a node address instead of REDIRECT" IPv4="`+nodeOutSide+`"`, 1, 30*time.Second)
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	const srcPort = 45455 // the same 5-tuple every time
	if r := dial(t, w.pod, "udp", "198.18.0.53:53", "ping", srcPort); !strings.HasPrefix(r.Reply, "be1:") {
		t.Fatalf("through the DNAT: reply %q, err %q", r.Reply, r.Err)
	}
	if _, ok := px.terminate(10 * time.Second); !ok {
		t.Fatal("the proxy did not stop on SIGTERM")
	}
	w.node.mustRun(t, "ip", "link", "del", "cali0")
	w.node.mustRun(t, "ip", "addr", "del", nodeOutSide+"/24", "dev", "to-out")
	w.node.mustRun(t, "ip", "addr", "add", "198.18.11.3/24", "dev", "to-out")
	w.node.mustRun(t, "ip", "route", "replace", "default", "via", outsideAddr)

	px = startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	if rules := w.node.mustRun(t, "iptables", "-t", "nat", "-S", "KUBE-PORTALS-CONTAINER"); strings.Contains(rules, "DNAT") {
		t.Fatalf("the restarted proxy still DNATs:\n%s", rules)
	}
	if r := dial(t, w.pod, "udp", "198.18.0.53:53", "ping", srcPort); !strings.HasPrefix(r.Reply, "be1:") || r.From != "198.18.0.53:53" {
		t.Errorf("the same client after the restart: reply %q from %q, err %q; conntrack holds:\n%s",
			r.Reply, r.From, r.Err, w.node.mustRun(t, "conntrack", "-L", "-p", "udp"))
	}
}

// TestBinaryRestartKeepsSplitProxyPorts: a Service whose
// externalTrafficPolicy: Local gives its external traffic a proxy port of
// its own keeps both ports through a restart, also when its load-balancer
// IP sorts before its cluster IP. The rules read back do not say which
// address was which; the restarted proxy swapped the two ports, and until
// its first sync the old rules sent external clients to the port that now
// took them to every endpoint (xa52).
func TestBinaryRestartKeepsSplitProxyPorts(t *testing.T) {
	const manifest = `apiVersion: v1
kind: Service
metadata: {name: split, namespace: e2e}
spec:
  type: LoadBalancer
  clusterIP: 198.18.0.70
  externalTrafficPolicy: Local
  allocateLoadBalancerNodePorts: false
  ports: [{name: http, protocol: TCP, port: 80}]
status:
  loadBalancer:
    ingress: [{ip: 198.18.0.7}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: split-1, namespace: e2e, labels: {kubernetes.io/service-name: split}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: node}]
`
	w, px, file := serveManifest(t, "iptables", manifest, "", "8080=be1")
	rules := func() string {
		return w.node.mustRun(t, "iptables", "-t", "nat", "-S", "KUBE-PORTALS-CONTAINER")
	}
	before := rules()
	ports := regexp.MustCompile(`--to-ports (\d+)`).FindAllStringSubmatch(before, -1)
	if len(ports) != 2 || ports[0][1] == ports[1][1] {
		t.Fatalf("want two rules to two proxy ports (cluster IP and load-balancer IP):\n%s", before)
	}
	if _, ok := px.terminate(10 * time.Second); !ok {
		t.Fatal("the proxy did not stop on SIGTERM")
	}
	px = startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	if after := rules(); after != before {
		t.Errorf("the restarted proxy redirects otherwise:\nbefore\n%s\nafter\n%s", before, after)
	}
	expectReply(t, w.outside, "tcp", "198.18.0.7:80", "be1:ping")
	expectReply(t, w.pod, "tcp", "198.18.0.70:80", "be1:ping")
}
