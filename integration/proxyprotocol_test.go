//go:build integration && linux

package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The PROXY protocol header, checked by a real parser: nginx's stream
// module, whose proxy_protocol listener takes a v1 or v2 header and says
// what it read. Clients in the world's namespaces reach it through the
// real binary, redirected by the iptables portal or straight to a node
// port with --portal=none.

// nginxStreamModule is where Debian's libnginx-mod-stream puts the module
// (hack/deps.sh installs it).
const nginxStreamModule = "/usr/lib/nginx/modules/ngx_stream_module.so"

// proxyProtocolManifest: pp1 asks for v1 and pp2 (IPv4 and IPv6) for v2,
// both to nginx on port 8090; plain, without the annotation, and live,
// with it, go to the echo backend on 8080, which answers the first line
// it gets, so it shows a header as it came. dns is UDP, which gets none.
const proxyProtocolManifest = `apiVersion: v1
kind: Service
metadata:
  name: pp1
  namespace: e2e
  annotations: {kube-userspace-proxy.io/proxy-protocol: v1}
spec:
  type: NodePort
  clusterIP: 198.18.0.20
  ports: [{name: tcp, protocol: TCP, port: 80, nodePort: 30090}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: pp1-1, namespace: e2e, labels: {kubernetes.io/service-name: pp1}}
addressType: IPv4
ports: [{name: tcp, protocol: TCP, port: 8090}]
endpoints: [{addresses: ["198.18.12.2"]}]
---
apiVersion: v1
kind: Service
metadata:
  name: pp2
  namespace: e2e
  annotations: {kube-userspace-proxy.io/proxy-protocol: v2}
spec:
  clusterIPs: [198.18.0.21, "fd5e:b1b5::21"]
  ipFamilies: [IPv4, IPv6]
  ports: [{name: tcp, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: pp2-4, namespace: e2e, labels: {kubernetes.io/service-name: pp2}}
addressType: IPv4
ports: [{name: tcp, protocol: TCP, port: 8090}]
endpoints: [{addresses: ["198.18.12.2"]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: pp2-6, namespace: e2e, labels: {kubernetes.io/service-name: pp2}}
addressType: IPv6
ports: [{name: tcp, protocol: TCP, port: 8090}]
endpoints: [{addresses: ["fd5e:b1b5:12::2"]}]
---
apiVersion: v1
kind: Service
metadata: {name: plain, namespace: e2e}
spec:
  clusterIP: 198.18.0.22
  ports: [{name: tcp, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: plain-1, namespace: e2e, labels: {kubernetes.io/service-name: plain}}
addressType: IPv4
ports: [{name: tcp, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"]}]
---
apiVersion: v1
kind: Service
metadata:
  name: live
  namespace: e2e
  annotations: {kube-userspace-proxy.io/proxy-protocol: v1}
spec:
  clusterIP: 198.18.0.23
  ports: [{name: tcp, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: live-1, namespace: e2e, labels: {kubernetes.io/service-name: live}}
addressType: IPv4
ports: [{name: tcp, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"]}]
---
apiVersion: v1
kind: Service
metadata:
  name: dns
  namespace: e2e
  annotations: {kube-userspace-proxy.io/proxy-protocol: v1}
spec:
  clusterIP: 198.18.0.24
  ports: [{name: dns, protocol: UDP, port: 53}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: e2e, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, protocol: UDP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"]}]
`

// startProxyProtocolNginx runs nginx in ns with a stream server on port
// 8090 of addrs that takes a PROXY protocol header (v1 or v2) and answers
// "client-addr:port server-addr:port" as the header gave them. It is
// stopped, by its pid, when the test ends.
func startProxyProtocolNginx(t *testing.T, ns netns, addrs ...string) {
	t.Helper()
	nginx := requireTool(t, "nginx")
	if _, err := os.Stat(nginxStreamModule); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("nginx's stream module is missing (hack/deps.sh installs libnginx-mod-stream as root): %v", err)
		}
		t.Skipf("nginx's stream module is missing; run `make deps` as root: %v", err)
	}
	dir := t.TempDir()
	var listen strings.Builder
	for _, a := range addrs {
		fmt.Fprintf(&listen, "\t\tlisten %s proxy_protocol;\n", net.JoinHostPort(a, "8090"))
	}
	// One process (master_process off), so the pid we start is all there
	// is to stop.
	conf := fmt.Sprintf(`load_module %s;
daemon off;
master_process off;
pid %s;
error_log %s info;
events { worker_connections 64; }
stream {
	server {
%s		proxy_protocol_timeout 5s;
		return "$proxy_protocol_addr:$proxy_protocol_port $proxy_protocol_server_addr:$proxy_protocol_server_port\n";
	}
}
`, nginxStreamModule, filepath.Join(dir, "nginx.pid"), filepath.Join(dir, "error.log"), listen.String())
	file := filepath.Join(dir, "nginx.conf")
	writeFile(t, file, conf)
	cmd := exec.Command("ip", "netns", "exec", string(ns), nginx, "-p", dir+"/", "-c", file, "-e", filepath.Join(dir, "error.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx error log:\n%s", log)
		}
	})
	// nginx writes its pid file once its sockets listen.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(filepath.Join(dir, "nginx.pid")); err == nil {
			return
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited: %v\n%s", cmd.ProcessState, log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("nginx did not start within 10s")
		}
	}
}

// expectSeen checks that nginx, reached at addr from ns, read a header
// naming the client as it connected (its own address and port) and dst as
// the address the client addressed.
func expectSeen(t *testing.T, ns netns, addr, dst string) {
	t.Helper()
	r := dial(t, ns, "tcp", addr, "", 0)
	if r.Err != "" {
		t.Errorf("%s from %s: %s", addr, ns, r.Err)
		return
	}
	client, err := net.ResolveTCPAddr("tcp", r.Local)
	if err != nil {
		t.Fatalf("client address %q: %v", r.Local, err)
	}
	dstHost, dstPort, _ := net.SplitHostPort(dst)
	if want := fmt.Sprintf("%s:%d %s:%s", client.IP, client.Port, dstHost, dstPort); r.Reply != want {
		t.Errorf("%s from %s: nginx read %q from the header, want %q", addr, ns, r.Reply, want)
	}
}

// TestBinaryProxyProtocol: through the iptables portal, in both builds,
// the endpoint's PROXY protocol parser reads the client's real address and
// the service address it used; a Service without the annotation sends no
// header, and one whose annotation is removed stops sending it.
func TestBinaryProxyProtocol(t *testing.T) {
	for _, b := range bothBuilds(t) {
		t.Run(b.name, func(t *testing.T) {
			w := newWorld(t)
			startBackend(t, w.backend, "8080=be1")
			startProxyProtocolNginx(t, w.backend, backendAddr, backendAddr6)
			file := filepath.Join(t.TempDir(), "services.yaml")
			writeFile(t, file, proxyProtocolManifest)
			px := startCommand(t, "ip", "netns", "exec", string(w.node), b.bin, "--manifests", file,
				"--hostname-override=node", "--portal=iptables", "-v=2")
			px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)

			t.Run("v1 to a ClusterIP from a pod", func(t *testing.T) { expectSeen(t, w.pod, "198.18.0.20:80", "198.18.0.20:80") })
			t.Run("v1 to a NodePort from outside", func(t *testing.T) {
				expectSeen(t, w.outside, nodeOutSide+":30090", nodeOutSide+":30090")
			})
			t.Run("v2 to a ClusterIP from a pod", func(t *testing.T) { expectSeen(t, w.pod, "198.18.0.21:80", "198.18.0.21:80") })
			t.Run("v2 to an IPv6 ClusterIP from a pod", func(t *testing.T) {
				expectSeen(t, w.pod, "[fd5e:b1b5::21]:80", "[fd5e:b1b5::21]:80")
			})
			t.Run("no annotation, no header", func(t *testing.T) { expectReply(t, w.pod, "tcp", "198.18.0.22:80", "be1:ping") })
			t.Run("UDP is served without one, and says so", func(t *testing.T) {
				expectReply(t, w.pod, "udp", "198.18.0.24:53", "be1:ping")
				px.waitLog(0, `Manifest warning.*spec.ports\[0\].protocol.*sent on TCP ports only`, 1, time.Second)
				px.waitLog(0, `"The PROXY protocol is sent on TCP ports only; this port is served without it" service="e2e/dns:dns/UDP"`, 1, time.Second)
			})
			t.Run("/debug/services shows it", func(t *testing.T) {
				view := w.node.mustRun(t, "curl", "-s", "http://127.0.0.1:10249/debug/services")
				for name, want := range map[string]string{
					"e2e/pp1:tcp/TCP":   "proxy header: PROXY protocol v1: each connection to an endpoint starts with one",
					"e2e/pp2:tcp/TCP":   "proxy header: PROXY protocol v2: ",
					"e2e/dns:dns/UDP":   "proxy header: PROXY protocol v1 asked for, not sent: it is sent on TCP ports only",
					"e2e/plain:tcp/TCP": "",
				} {
					block := debugBlock(view, name)
					if block == "" || want != "" && !strings.Contains(block, want) || want == "" && strings.Contains(block, "proxy header") {
						t.Errorf("/debug/services for %s:\n%s\nwant %q", name, block, want)
					}
				}
			})
			t.Run("removing the annotation stops the header", func(t *testing.T) {
				r := dial(t, w.pod, "tcp", "198.18.0.23:80", "ping", 0)
				host, port, _ := net.SplitHostPort(r.Local)
				// The echo endpoint answers the first line, the header, and
				// closes with "ping" unread, which resets the connection:
				// the reply is what counts, a reset after it may come.
				if want := fmt.Sprintf("be1:PROXY TCP4 %s 198.18.0.23 %s 80", host, port); r.Reply != want {
					t.Fatalf("with the annotation the echo endpoint read %q (%s), want %q", r.Reply, r.Err, want)
				}
				from := px.lineCount()
				writeFile(t, file, strings.Replace(proxyProtocolManifest,
					"  name: live\n  namespace: e2e\n  annotations: {kube-userspace-proxy.io/proxy-protocol: v1}\n",
					"  name: live\n  namespace: e2e\n", 1))
				px.waitLog(from, `"Applying edited manifests"`, 1, 10*time.Second)
				px.waitLog(from, `"PROXY protocol header for new connections changed" service="e2e/live:tcp/TCP" proxyProtocol="none"`, 1, 10*time.Second)
				expectReply(t, w.pod, "tcp", "198.18.0.23:80", "be1:ping")
				for _, l := range strings.Split(px.log(), "\n")[from:] {
					if strings.Contains(l, `"Closing listener"`) {
						t.Errorf("a listener was replaced for the change: %s", l)
					}
				}
			})
		})
	}
}

// TestBinaryProxyProtocolPortalNone: with --portal=none a client uses the
// node port itself, and the header names the node address it connected
// to.
func TestBinaryProxyProtocolPortalNone(t *testing.T) {
	w := newWorld(t)
	startProxyProtocolNginx(t, w.backend, backendAddr)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, proxyProtocolManifest)
	px := startNodeProxy(t, w, file, "--portal=none", "--healthz-bind-address=", "--metrics-bind-address=")
	px.waitLog(0, `"Serving".*30090`, 1, 30*time.Second)
	expectSeen(t, w.outside, nodeOutSide+":30090", nodeOutSide+":30090")
	expectSeen(t, w.pod, nodePodSide+":30090", nodePodSide+":30090")
}

// debugBlock returns the lines /debug/services shows for one service port.
func debugBlock(view, name string) string {
	for _, b := range strings.Split(view, "\n\n") {
		if strings.HasPrefix(b, name+"\n") {
			return b
		}
	}
	return ""
}
