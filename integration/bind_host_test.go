//go:build integration && linux

package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinaryBindPortalServesNodeAddressFrontends: with the bind portal, a
// Service whose external IP is one of the node's own addresses (a common
// bare-metal pattern) is served there, and node ports on that address
// still are: the address was counted as a service address the portal put
// on the host, and node ports refused it, for every Service. The portal
// neither adds the node's address to its interface nor removes it.
func TestBinaryBindPortalServesNodeAddressFrontends(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	onNode := fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: onnode, namespace: e2e}
spec:
  clusterIP: 198.18.0.11
  externalIPs: [%s]
  ports: [{name: http, protocol: TCP, port: 8082}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: onnode-1, namespace: e2e, labels: {kubernetes.io/service-name: onnode}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"]}]
`, nodeOutSide)
	writeFile(t, file, netnsManifest+onNode)
	px := startNodeProxy(t, w, file, "--portal=bind")
	px.waitLog(0, `"Serving".*`+nodeOutSide+`:8082`, 1, 30*time.Second)
	expectReply(t, w.outside, "tcp", nodeOutSide+":8082", "be1:ping")
	expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")
	expectReply(t, w.outside, "udp", nodeOutSide+":30053", "be1:ping")
	if on := serviceAddrsOn(t, w.node, bindDevice(t, w.node)); slices.Contains(on, nodeOutSide) {
		t.Errorf("the node's own address was added to the bind interface: %v", on)
	}

	// The Service goes: the node keeps its address, and its node ports.
	from := px.lineCount()
	writeFile(t, file, netnsManifest)
	px.waitLog(from, `"Stopped serving".*`+nodeOutSide+`:8082`, 1, 10*time.Second)
	if out := w.node.mustRun(t, "ip", "-4", "addr", "show", "to", nodeOutSide+"/32"); !strings.Contains(out, nodeOutSide) {
		t.Fatalf("the node's address is gone with the Service that used it")
	}
	expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")
}

// TestBinaryAutoPortalInAUserNamespace: a proxy run in a user namespace
// that does not own the network namespace (rootless) holds CAP_NET_ADMIN
// only in its own namespace: auto picks none, and --portal=bind fails at
// once, where auto picked bind and every sync failed until /healthz said
// 503 and drained the node.
func TestBinaryAutoPortalInAUserNamespace(t *testing.T) {
	requireTool(t, "unshare")
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startCommand(t, "ip", "netns", "exec", string(w.node), "unshare", "-U", "-r", proxyBin, "--manifests", file,
		"--hostname-override=node", "-v=2", "--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=")
	px.waitLog(0, `"Portal chosen" portal="none"`, 1, 30*time.Second)
	px.waitLog(0, `user namespace`, 1, time.Second)
	px.waitLog(0, `"Synced"`, 1, 30*time.Second)
	if code, body := curlCodeIn(t, w.node, "http://127.0.0.1:10256/healthz"); code != "200" {
		t.Fatalf("/healthz: %s %s", code, body)
	}
	out, err := w.node.run("unshare", "-U", "-r", proxyBin, "--manifests", file, "--portal=bind", "--healthz-bind-address=", "--metrics-bind-address=")
	if err == nil || !strings.Contains(out, "--portal=bind: ") || !strings.Contains(out, "user namespace") {
		t.Fatalf("--portal=bind in a user namespace: %v\n%s\nwant a failure at start that says why", err, out)
	}
}

// TestBinaryBindPortalWithIPv6Off: on a host with IPv6 turned off, a
// dual-stack Service is served in IPv4 and the proxy stays healthy, as
// kube-proxy runs no IPv6 proxier there; every sync failed adding the
// IPv6 address, and /healthz said 503. Then the data plane still listened
// on the IPv6 address the portal skipped, and every sync failed.
func TestBinaryBindPortalWithIPv6Off(t *testing.T) {
	requireRoot(t)
	node := newNetns(t, "v4only")
	node.mustRun(t, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1", "net.ipv6.conf.lo.disable_ipv6=1")
	startBackend(t, node, "8080=be1")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, `apiVersion: v1
kind: Service
metadata: {name: ds, namespace: e2e}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 198.18.0.20
  clusterIPs: [198.18.0.20, "fd5e:b1b5::20"]
  ports: [{name: http, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ds-1, namespace: e2e, labels: {kubernetes.io/service-name: ds}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["127.0.0.1"]}]
`)
	px := startCommand(t, "ip", "netns", "exec", string(node), proxyBin, "--manifests", file, "--portal=bind", "-v=2",
		"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=", "--iptables-sync-period=2s")
	px.waitLog(0, `"IPv6 is turned off on the bind interface: IPv6 service addresses are not served"`, 1, 30*time.Second)
	expectReply(t, node, "tcp", "198.18.0.20:80", "be1:ping")
	// Twice the sync period without a portal failure: still healthy.
	time.Sleep(5 * time.Second)
	if code, body := curlCodeIn(t, node, "http://127.0.0.1:10256/healthz"); code != "200" {
		t.Fatalf("/healthz with IPv6 off: %s %s\n%s", code, body, px.log())
	}
	if n := strings.Count(px.log(), "IPv6 is turned off on the bind interface"); n != 1 {
		t.Errorf("said %d times that IPv6 is off, want once", n)
	}
	if strings.Contains(px.log(), "Sync failed") || !strings.Contains(px.log(), `"Synced"`) {
		t.Errorf("with IPv6 off, syncs failed (or none worked):\n%s", px.log())
	}
}

// TestBinaryBindPortalIPv6TurnedBackOn: IPv6 turned back on (or off) on a
// host serving with the bind portal is followed at once, not at the next
// resync (30 s here): the IPv6 service addresses the portal skipped are
// added and served, then taken away again.
func TestBinaryBindPortalIPv6TurnedBackOn(t *testing.T) {
	requireRoot(t)
	node := newNetns(t, "v6back")
	v6 := func(off string) {
		node.mustRun(t, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6="+off, "net.ipv6.conf.default.disable_ipv6="+off, "net.ipv6.conf.lo.disable_ipv6="+off)
	}
	v6("1")
	startBackend(t, node, "8080=be1")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, `apiVersion: v1
kind: Service
metadata: {name: ds, namespace: e2e}
spec:
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIPs: [198.18.0.20, "fd5e:b1b5::20"]
  ports: [{name: http, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ds-4, namespace: e2e, labels: {kubernetes.io/service-name: ds}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["127.0.0.1"]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ds-6, namespace: e2e, labels: {kubernetes.io/service-name: ds}}
addressType: IPv6
ports: [{name: http, protocol: TCP, port: 8081}]
endpoints: [{addresses: ["::1"]}]
`)
	px := startCommand(t, "ip", "netns", "exec", string(node), proxyBin, "--manifests", file, "--portal=bind", "-v=2",
		"--healthz-bind-address=", "--metrics-bind-address=", "--iptables-sync-period=30s")
	px.waitLog(0, `"IPv6 is turned off on the bind interface: IPv6 service addresses are not served"`, 1, 30*time.Second)
	px.waitLog(0, `"Synced"`, 1, 10*time.Second)
	expectReply(t, node, "tcp", "198.18.0.20:80", "be1:ping")

	from := px.lineCount()
	v6("0")
	px.waitLog(from, `"Serving".*\[fd5e:b1b5::20\]:80`, 1, 5*time.Second)
	startBackend(t, node, "8081=be6") // it listens on IPv6 too now
	expectReply(t, node, "tcp", "[fd5e:b1b5::20]:80", "be6:ping")

	from = px.lineCount()
	v6("1")
	px.waitLog(from, `"Stopped serving".*\[fd5e:b1b5::20\]:80`, 1, 5*time.Second)
	expectReply(t, node, "tcp", "198.18.0.20:80", "be1:ping")
	if strings.Contains(px.log(), "Sync failed") {
		t.Errorf("syncs failed:\n%s", px.log())
	}
}

// TestBinaryBindPortalResetsConnectionsToRemovedAddresses: a Service that
// goes takes its addresses off the host; a client connected to one is
// reset before they go, where it was left hanging (the proxy kept its
// socket, but nothing could reach or leave an address no longer local).
func TestBinaryBindPortalResetsConnectionsToRemovedAddresses(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=bind")
	px.waitLog(0, `"Serving".*198.18.0.10:80`, 1, 30*time.Second)
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	hold := exec.Command("ip", "netns", "exec", string(w.pod), self)
	hold.Env = append(os.Environ(), helperEnv+"=hold", "KUPT_ADDR=198.18.0.10:80")
	stdin, err := hold.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := hold.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	defer hold.Wait()
	defer stdin.Close()
	out := bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); err != nil || line != "connected\n" {
		t.Fatalf("the client did not connect: %q, %v", line, err)
	}
	// The web Service goes, and its addresses with it.
	from := px.lineCount()
	writeFile(t, file, netnsManifest[strings.Index(netnsManifest, "apiVersion: v1\nkind: Service\nmetadata: {name: dns"):])
	px.waitLog(from, `"Stopped serving".*198.18.0.10:80`, 1, 10*time.Second)
	fmt.Fprintln(stdin, "read")
	if line, err := out.ReadString('\n'); err != nil || line != "reset\n" {
		t.Fatalf("the client connected to the removed address read %q (%v), want a reset", strings.TrimSpace(line), err)
	}
}

// TestBinaryUnprivilegedProxyNamesBindLeftovers: a proxy that may not
// change addresses leaves a bind portal's addresses where a killed run
// left them, and says so, where it said nothing while their clients were
// refused.
func TestBinaryUnprivilegedProxyNamesBindLeftovers(t *testing.T) {
	requireTool(t, "setpriv")
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=bind")
	px.waitLog(0, `"Serving".*198.18.0.10:80`, 1, 30*time.Second)
	if _, ok := px.stop(syscall.SIGKILL, 5*time.Second); !ok {
		t.Fatal("the bind proxy did not die")
	}
	nobody := startCommand(t, "ip", "netns", "exec", string(w.node), "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		proxyBin, "--manifests", file, "--healthz-bind-address=", "--metrics-bind-address=", "--bind-address=127.0.0.1")
	nobody.waitLog(0, `"Service addresses a bind portal left on this host stay, as this proxy may not remove them.*198.18.0.10`, 1, 30*time.Second)
}

// TestBinaryBindPortalMovesInterfaces: a run with another --bind-interface
// removes, at its first sync, the service addresses a previous run put on
// the one it used, where they stayed for ever (a deleted Service's address
// kept answering, refusing its clients, and the node kept claiming a
// load-balancer IP).
func TestBinaryBindPortalMovesInterfaces(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=bind")
	px.waitLog(0, `"Serving".*198.18.0.10:80`, 1, 30*time.Second)
	first := bindDevice(t, w.node)
	if !slices.Contains(serviceAddrsOn(t, w.node, first), "198.19.1.1/32") {
		t.Fatalf("the first run put no load-balancer IP on %s: the test proves nothing", first)
	}
	if _, ok := px.stop(syscall.SIGKILL, 5*time.Second); !ok {
		t.Fatal("the first run did not die")
	}
	w.node.mustRun(t, "ip", "link", "add", "kup-alt", "type", "veth", "peer", "name", "kup-alt-peer")
	w.node.mustRun(t, "ip", "link", "set", "kup-alt", "up")
	// The web Service, with its load-balancer IP, is gone meanwhile.
	writeFile(t, file, netnsManifest[strings.Index(netnsManifest, "apiVersion: v1\nkind: Service\nmetadata: {name: dns"):])
	px = startNodeProxy(t, w, file, "--portal=bind", "--bind-interface=kup-alt")
	px.waitLog(0, `"Removed the service addresses a previous run's bind portal left on another interface" interface="`+first+`"`, 1, 30*time.Second)
	if left := serviceAddrsOn(t, w.node, first); len(left) > 0 {
		t.Fatalf("service addresses left on %s: %v", first, left)
	}
	expectReply(t, w.outside, "udp", "198.18.0.53:53", "be1:ping")
}
