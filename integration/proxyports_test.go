//go:build integration && linux

package integration

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proxyPortService is Service name at clusterIP, with one endpoint at
// endpoint:port.
func proxyPortService(name, clusterIP, endpoint, port string) string {
	return `---
apiVersion: v1
kind: Service
metadata: {name: ` + name + `, namespace: e2e}
spec:
  clusterIP: ` + clusterIP + `
  ports: [{name: http, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ` + name + `, namespace: e2e, labels: {kubernetes.io/service-name: ` + name + `}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: ` + port + `}]
endpoints: [{addresses: ["` + endpoint + `"]}]
`
}

// TestBinaryProxyPortChangesHandsWithoutCrossTalk: a proxy port that one
// Service gives up goes to another only once the iptables portal no longer
// redirects the first one's traffic to it, after a live edit and across a
// restart whose previous run's rules still point there. Before, the new
// Service's listener opened first, and for a moment clients of the old
// Service reached the new one's endpoints. With a one-port range the two
// Services must take turns on the same port.
func TestBinaryProxyPortChangesHandsWithoutCrossTalk(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=A", "8081=B")
	a := proxyPortService("a", "198.18.0.60", backendAddr, "8080")
	b := proxyPortService("b", "198.18.0.61", backendAddr, "8081")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, a)
	const portRange = "--proxy-port-range=40400"
	px := startNodeProxy(t, w, file, "--portal=iptables", portRange)
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	expectReply(t, w.pod, "tcp", "198.18.0.60:80", "A:ping")

	// Clients of both Services keep asking throughout; neither may ever
	// hear the other's endpoint.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	crossed := map[string]int{}
	for _, c := range []struct{ addr, other string }{{"198.18.0.60:80", "B:"}, {"198.18.0.61:80", "A:"}} {
		wg.Go(func() {
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
				select {
				case <-stop:
					return
				default:
				}
				if r := dial(t, w.pod, "tcp", c.addr, "ping", 0); strings.HasPrefix(r.Reply, c.other) {
					mu.Lock()
					crossed[c.addr]++
					mu.Unlock()
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
		if len(crossed) > 0 {
			t.Errorf("clients reached another Service's endpoint: %v", crossed)
		}
	}()

	// servedAfterSync checks that service took the port only after a
	// portal sync that followed line from, and says it waited for it.
	servedAfterSync := func(px *proxyProc, from int, service string) {
		t.Helper()
		served := px.waitLog(from, `"Serving service port" service="e2e/`+service+`[^ ]*" proxyPort=40400`, 1, 20*time.Second)
		synced := px.waitLog(from, `"Portals synced"`, 1, time.Second)
		if synced > served {
			t.Errorf("Service %s listened on the proxy port (line %d) before the portal stopped redirecting the other Service there (line %d):\n%s", service, served, synced, px.log())
		}
		px.waitLog(from, `"Waiting for the portal to stop redirecting a proxy port to another service port before taking it"`, 1, time.Second)
	}

	// A live edit: a goes, b comes, in one sync.
	from := px.lineCount()
	writeFile(t, file, b)
	servedAfterSync(px, from, "b")
	eventually(t, w.pod, "tcp", "198.18.0.61:80", "B:ping")

	// A restart: the rules of the killed run send b's traffic to the
	// port, which a now asks for.
	if _, ok := px.stop(syscall.SIGKILL, 5*time.Second); !ok {
		t.Fatal("the proxy did not die")
	}
	writeFile(t, file, a)
	px = startNodeProxy(t, w, file, "--portal=iptables", portRange)
	servedAfterSync(px, 0, "a")
	eventually(t, w.pod, "tcp", "198.18.0.60:80", "A:ping")
}

// TestBinaryEndpointsTheProxyWouldCaptureAreIgnored: an endpoint at an
// address of this node with a Service's node port, or at another Service's
// cluster IP, would have the proxy's own connection to it captured by its
// portal and come back, each connection opening another until descriptors
// ran out (kube-proxy translates a connection once). Such endpoints are
// ignored and reported: the Services have no endpoint, and refuse.
func TestBinaryEndpointsTheProxyWouldCaptureAreIgnored(t *testing.T) {
	w := newWorld(t)
	manifest := `apiVersion: v1
kind: Service
metadata: {name: loop, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.62
  ports: [{name: l, protocol: TCP, port: 80, nodePort: 31888}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: loop, namespace: e2e, labels: {kubernetes.io/service-name: loop}}
addressType: IPv4
ports: [{name: l, protocol: TCP, port: 31888}]
endpoints: [{addresses: ["` + nodeBackSide + `"]}]
` + proxyPortService("ca", "198.18.0.63", "198.18.0.64", "80") + proxyPortService("cb", "198.18.0.64", "198.18.0.63", "80")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest)
	px := startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)

	for _, addr := range []string{"198.18.0.62 80", nodePodSide + " 31888", "198.18.0.63 80", "198.18.0.64 80"} {
		host, port, _ := strings.Cut(addr, " ")
		start := time.Now()
		out, err := w.pod.run("nc", "-z", "-v", "-w2", host, port)
		if err == nil || !strings.Contains(out, "refused") || time.Since(start) > time.Second {
			t.Errorf("nc -z %s from the pod: %v after %v: %q; want a quick refusal (no endpoints)", addr, err, time.Since(start).Round(time.Millisecond), out)
		}
	}
	code, body := curlCodeIn(t, w.node, "http://127.0.0.1:10249/metrics")
	if code != "200" || !strings.Contains(body, "\nkube_userspace_proxy_tcp_connections_accepted_total 0\n") {
		t.Errorf("/metrics (%s): the proxy accepted connections: %q", code, regexp.MustCompile(`(?m)^kube_userspace_proxy_tcp_connections_accepted_total.*$`).FindString(body))
	}
	code, view := curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services")
	for _, want := range []string{
		nodeBackSide + ":31888 is an address of this host with Service e2e/loop:l/TCP's node port; the proxy would capture its own connection to it; ignored",
		"198.18.0.64:80 is Service e2e/cb:http/TCP's frontend",
		"198.18.0.63:80 is Service e2e/ca:http/TCP's frontend",
	} {
		if code != "200" || !strings.Contains(view, want) {
			t.Errorf("/debug/services (%s) lacks %q:\n%s", code, want, view)
		}
	}
}

// TestBinaryNonePortalKeepsAGivenUpProxyPortFromOthers: with --portal=none
// clients address proxy ports themselves, so a port a deleted Service gave
// up must not go to the next Service at once while another port is free:
// its old clients would reach the new Service's endpoints. Before, a
// Service added in the same edit took it whenever its scan of the range
// met it first. The new Service's name is chosen so that its scan does.
func TestBinaryNonePortalKeepsAGivenUpProxyPortFromOthers(t *testing.T) {
	requireTool(t, "curl")
	base := freePortRun(t, 3)
	a, b, c := httpBackend(t, "A"), httpBackend(t, "B"), httpBackend(t, "C")
	svc := func(name string, port int) string {
		ip := map[string]string{"a": "198.18.0.70", "b": "198.18.0.71"}[name]
		if ip == "" {
			ip = "198.18.0.72"
		}
		return proxyPortService(name, ip, "127.0.0.1", strconv.Itoa(port))
	}
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, svc("a", a)+svc("b", b))
	p := startProxy(t, "--manifests", file, "--portal=none", "--bind-address=127.0.0.1",
		fmt.Sprintf("--proxy-port-range=%d-%d", base, base+2), "--nodeport-addresses=127.0.0.1/32")
	portOf := func(from int, service string) int {
		t.Helper()
		re := `"Serving" service="e2e/` + service + `:http/TCP" addr="127\.0\.0\.1:(\d+)" via="proxy-port"`
		after := p.waitLog(from, re, 1, 20*time.Second)
		lines := strings.Split(p.log(), "\n")
		m := regexp.MustCompile(re).FindStringSubmatch(lines[after-1])
		port, _ := strconv.Atoi(m[1])
		return port
	}
	pa, pb := portOf(0, "a"), portOf(0, "b")
	free := 3*base + 3 - pa - pb // the range's third port
	if body, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/", pa)); err != nil || body != "A" {
		t.Fatalf("Service a on its proxy port %d: %q, %v", pa, body, err)
	}

	// A name whose scan of the range, from where its key's hash puts it,
	// meets a's port before the free one.
	var name string
	for i := range 1000 {
		n := fmt.Sprintf("c%d", i)
		h := fnv.New32a()
		h.Write([]byte("e2e/" + n + ":http/TCP/proxy-port"))
		start := int(h.Sum32() % 3)
		if (pa-base-start+3)%3 < (free-base-start+3)%3 {
			name = n
			break
		}
	}
	from := p.lineCount()
	writeFile(t, file, svc("b", b)+svc(name, c))
	if got := portOf(from, name); got != free {
		t.Fatalf("Service %s got proxy port %d, which a gave up in the same edit; want %d, the free one", name, got, free)
	}
	if body, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/", pa)); err == nil {
		t.Fatalf("a client of the deleted Service a on its old proxy port %d reached %q", pa, body)
	}
}

// freePortRun returns the first of n consecutive ports free for TCP on
// 127.0.0.1, below the ephemeral range.
func freePortRun(t *testing.T, n int) int {
	t.Helper()
	for range 200 {
		base := 20000 + rand.IntN(12000)
		ok := true
		for i := range n {
			ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				ok = false
				break
			}
			ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no run of free ports")
	return 0
}

// TestBinaryBindAddressWaitsForDAD: an IPv6 --bind-address still in
// duplicate address detection (tentative, as at boot or right after it
// was configured) is waited for, and its proxy ports served once DAD
// succeeds; one whose DAD fails is refused, saying so. Both stopped the
// proxy at start, saying the address "is not an address of this host".
func TestBinaryBindAddressWaitsForDAD(t *testing.T) {
	requireRoot(t)
	node, peer := newNetns(t, "dadnode"), newNetns(t, "dadpeer")
	node.mustRun(t, "ip", "link", "add", "to-peer", "type", "veth", "peer", "name", "eth0", "netns", string(peer))
	node.mustRun(t, "sysctl", "-qw", "net.ipv6.conf.to-peer.accept_dad=1", "net.ipv6.conf.to-peer.dad_transmits=2")
	node.mustRun(t, "ip", "link", "set", "to-peer", "up")
	peer.mustRun(t, "ip", "link", "set", "eth0", "up")
	// A duplicate: the peer holds ::77 already.
	peer.mustRun(t, "ip", "-6", "addr", "add", "fd5e:b1b5:21::77/64", "dev", "eth0", "nodad")
	node.mustRun(t, "ip", "-6", "addr", "add", "fd5e:b1b5:21::1/64", "dev", "to-peer")
	node.mustRun(t, "ip", "-6", "addr", "add", "fd5e:b1b5:21::77/64", "dev", "to-peer")
	if out := node.mustRun(t, "ip", "-6", "addr", "show", "to", "fd5e:b1b5:21::1/128"); !strings.Contains(out, "tentative") {
		t.Fatalf("the bind address is not tentative: the test proves nothing\n%s", out)
	}
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, proxyPortService("a", "198.18.0.70", "127.0.0.1", "8080"))
	px := startCommand(t, "ip", "netns", "exec", string(node), proxyBin, "--manifests", file, "--portal=none",
		"--bind-address=fd5e:b1b5:21::1", "--hostname-override=node", "--healthz-bind-address=", "--metrics-bind-address=")
	px.waitLog(0, `"The bind address is tentative`, 1, 10*time.Second)
	px.waitLog(0, `"Serving" service="e2e/a:http/TCP" addr="\[fd5e:b1b5:21::1\]:\d+" via="proxy-port"`, 1, 15*time.Second)

	out, err := node.run(proxyBin, "--manifests", file, "--portal=none", "--bind-address=fd5e:b1b5:21::77",
		"--hostname-override=node", "--healthz-bind-address=", "--metrics-bind-address=")
	if err == nil || !strings.Contains(out, "--bind-address fd5e:b1b5:21::77 failed IPv6 duplicate address detection") {
		t.Fatalf("a bind address whose DAD failed: %v\n%s\nwant a failure at start that says so", err, out)
	}
}
