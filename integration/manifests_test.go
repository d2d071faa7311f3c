//go:build integration

package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// manifest renders a Service with a TCP and a UDP port on nodePort and one
// EndpointSlice with the given endpoint ports on 127.0.0.1.
func manifest(nodePort int, affinity string, tcpPorts, udpPorts []int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata: {name: app, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.20
  sessionAffinity: %s
  ports:
  - {name: http, protocol: TCP, port: 80, nodePort: %d}
  - {name: dns, protocol: UDP, port: 53, nodePort: %d}
`, affinity, nodePort, nodePort)
	for i, p := range tcpPorts {
		fmt.Fprintf(&b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: app-tcp-%d
  namespace: e2e
  labels: {kubernetes.io/service-name: app}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: %d}]
endpoints: [{addresses: ["127.0.0.1"], conditions: {ready: true}}]
`, i, p)
	}
	for i, p := range udpPorts {
		fmt.Fprintf(&b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: app-udp-%d
  namespace: e2e
  labels: {kubernetes.io/service-name: app}
addressType: IPv4
ports: [{name: dns, protocol: UDP, port: %d}]
endpoints: [{addresses: ["127.0.0.1"], conditions: {ready: true}}]
`, i, p)
	}
	return b.String()
}

func proxyArgs(file string) []string {
	return []string{"--manifests", file, "--portal=none", "--bind-address=127.0.0.1", "--nodeport-addresses=127.0.0.1/32", "--healthz-bind-address=", "--metrics-bind-address="}
}

// TestManifestEndToEnd runs the real binary on a manifest file and drives it
// with curl and nc: round robin, UDP, a live edit, a broken edit that keeps
// the last good state, a fix, and a clean SIGTERM.
func TestManifestEndToEnd(t *testing.T) {
	a, b, c := httpBackend(t, "a"), httpBackend(t, "b"), httpBackend(t, "c")
	ua, ub := udpBackend(t, "ua"), udpBackend(t, "ub")
	np := freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest(np, "None", []int{a, b}, []int{ua, ub}))

	mp := freePort(t)
	p := startProxy(t, append(proxyArgs(file), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))...)
	p.waitLog(0, `"Serving".*via="node-port"`, 2, 20*time.Second)
	url := fmt.Sprintf("http://127.0.0.1:%d/", np)
	// debugView returns /debug/services, which says what came of the last
	// read of the manifest file.
	debugView := func(t *testing.T) string {
		t.Helper()
		view, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/debug/services", mp))
		if err != nil {
			t.Fatalf("/debug/services: %v: %s", err, view)
		}
		return view
	}

	t.Run("round robin with curl", func(t *testing.T) {
		seen := map[string]int{}
		for range 6 {
			body, err := curl(t, url)
			if err != nil {
				t.Fatalf("curl %s: %v (%s)", url, err, body)
			}
			seen[body]++
		}
		if seen["a"] != 3 || seen["b"] != 3 {
			t.Fatalf("6 requests served %v, want 3 each by a and b", seen)
		}
	})

	t.Run("UDP with nc", func(t *testing.T) {
		seen := map[string]bool{}
		for i := range 4 {
			reply, err := ncUDP(t, "127.0.0.1", np, fmt.Sprintf("q%d", i))
			if err != nil || !strings.HasSuffix(reply, fmt.Sprintf(":q%d", i)) {
				t.Fatalf("nc -u: %q, %v", reply, err)
			}
			seen[strings.Split(reply, ":")[0]] = true
		}
		if !seen["ua"] || !seen["ub"] {
			t.Fatalf("4 UDP clients reached only %v", seen)
		}
	})

	t.Run("edit applies within a second", func(t *testing.T) {
		from := p.lineCount()
		start := time.Now()
		replaceFile(t, file, manifest(np, "None", []int{c}, []int{ua, ub}))
		p.waitLog(from, `"Applying edited manifests"`, 1, 5*time.Second)
		if d := time.Since(start); d > time.Second {
			t.Fatalf("edit took %v to apply", d)
		}
		for range 3 {
			if body, err := curl(t, url); err != nil || body != "c" {
				t.Fatalf("after the edit curl got %q, %v; want c", body, err)
			}
		}
	})

	t.Run("broken edit keeps the last good state", func(t *testing.T) {
		from := p.lineCount()
		broken := strings.Replace(manifest(np, "None", []int{a}, []int{ua}), fmt.Sprintf("nodePort: %d}\n  - {name: dns", np), "nodePort: 70000}\n  - {name: dns", 1)
		writeFile(t, file, broken)
		p.waitLog(from, `Manifest edit rejected.*services\.yaml`, 1, 5*time.Second)
		line := p.log()[len(strings.Join(p.lines[:from], "\n")):]
		for _, want := range []string{"document", "spec.ports[0].nodePort", "70000"} {
			if !strings.Contains(line, want) {
				t.Errorf("rejection log does not name %q:\n%s", want, line)
			}
		}
		if body, err := curl(t, url); err != nil || body != "c" {
			t.Fatalf("after a broken edit curl got %q, %v; want the last good state (c)", body, err)
		}
		if view := debugView(t); !strings.Contains(view, "The manifest file's last edit was rejected (") ||
			!strings.Contains(view, "spec.ports[0].nodePort") || !strings.Contains(view, fmt.Sprintf("  endpoints:    127.0.0.1:%d\n", c)) {
			t.Errorf("/debug/services after a broken edit:\n%s", view)
		}
	})

	t.Run("ClientIP affinity after a fix", func(t *testing.T) {
		from := p.lineCount()
		// With a slice of a family the Service does not have, and a
		// ConfigMap: taken, and those two ignored.
		writeFile(t, file, manifest(np, "ClientIP", []int{a, b, c}, []int{ua})+`---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: app-six, namespace: e2e, labels: {kubernetes.io/service-name: app}}
addressType: IPv6
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["::1"]}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: e2e}
`)
		p.waitLog(from, `"Manifest file is valid again"|"Applying edited manifests"`, 1, 5*time.Second)
		if view := debugView(t); strings.Contains(view, "rejected") || !strings.Contains(view, "Parts of the manifest file are ignored:\n") ||
			!strings.Contains(view, "IPv6 is not an IP family of Service e2e/app") || !strings.Contains(view, `kind "ConfigMap" is not a Service or EndpointSlice; skipped`) {
			t.Errorf("/debug/services after the fix:\n%s", view)
		}
		first, err := curl(t, url)
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if body, _ := curl(t, url); body != first {
				t.Fatalf("ClientIP affinity: %s then %s", first, body)
			}
		}
	})

	t.Run("SIGTERM stops cleanly", func(t *testing.T) {
		if _, ok := p.terminate(10 * time.Second); !ok {
			t.Fatal("the proxy did not exit within 10s of SIGTERM")
		}
		if p.err != nil {
			t.Fatalf("exit after SIGTERM: %v", p.err)
		}
		if _, err := curl(t, url); err == nil {
			t.Fatal("node port still answers after the proxy exited")
		}
	})
}

// TestBinaryUDPSessionCapSaysSo: clients that --udp-max-sessions turns away
// get no answer, and the log says why, once, not per datagram.
func TestBinaryUDPSessionCapSaysSo(t *testing.T) {
	a, ua := httpBackend(t, "a"), udpBackend(t, "ua")
	np := freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest(np, "None", []int{a}, []int{ua}))
	p := startProxy(t, append(proxyArgs(file), "--udp-max-sessions=1", "--udp-timeout=1m")...)
	p.waitLog(0, `"Serving".*via="node-port"`, 2, 20*time.Second)
	if reply, err := ncUDP(t, "127.0.0.1", np, "first"); err != nil || reply != "ua:first" {
		t.Fatalf("the first client: %q, %v", reply, err)
	}
	const capLine = `"UDP session cap reached.*service="e2e/app:dns/UDP" maxSessions=1`
	for i := range 2 {
		if reply, _ := ncUDP(t, "127.0.0.1", np, "over"); reply != "" {
			t.Fatalf("client %d past the cap got %q", i+2, reply)
		}
		p.waitLog(0, capLine, 1, 5*time.Second)
	}
	if n := len(regexp.MustCompile(capLine).FindAllString(p.log(), -1)); n != 1 {
		t.Fatalf("the cap was logged %d times for two clients; want once a minute at most:\n%s", n, p.log())
	}
}

// TestBinaryHelpVersionAndHangUp: --help and --version print to standard
// output (so `| less` and scripts read them) and exit 0; SIGHUP ends the
// proxy as cleanly as SIGTERM, saying so, where it used to die silently.
func TestBinaryHelpVersionAndHangUp(t *testing.T) {
	for flag, want := range map[string]string{"--help": "--manifests string", "--version": "kube-userspace-proxy "} {
		var stdout, stderr strings.Builder
		cmd := exec.Command(proxyBin, flag)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s", flag, err, stderr.String())
		}
		if !strings.Contains(stdout.String(), want) || stderr.Len() != 0 {
			short := func(s string) string { return s[:min(len(s), 200)] }
			t.Fatalf("%s: stdout %q, stderr %q; want %q on stdout only", flag, short(stdout.String()), short(stderr.String()), want)
		}
		if flag != "--help" {
			continue
		}
		// Of klog's flags, --help shows the two a user needs; the others
		// are hidden but still work.
		for _, shown := range []string{"-v, --v Level", "--vmodule"} {
			if !strings.Contains(stdout.String(), shown) {
				t.Errorf("--help does not show %s", shown)
			}
		}
		for _, hidden := range []string{"--log_dir", "--alsologtostderr", "--skip_headers"} {
			if strings.Contains(stdout.String(), hidden) {
				t.Errorf("--help shows klog's %s", hidden)
			}
		}
	}
	if out, err := exec.Command(proxyBin, "--logtostderr=true", "--version").CombinedOutput(); err != nil {
		t.Errorf("a hidden klog flag is refused: %v\n%s", err, out)
	}
	// Words are separated by - or _, as kube-proxy takes them.
	for _, args := range [][]string{{"--skip-headers", "--log_file_max_size=10"}, {"--kube_api_qps=3", "--healthz_bind_address="}} {
		if out, err := exec.Command(proxyBin, append(args, "--version")...).CombinedOutput(); err != nil {
			t.Errorf("%v refused: %v\n%s", args, err, out)
		}
	}

	a, ua := httpBackend(t, "a"), udpBackend(t, "ua")
	np := freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest(np, "None", []int{a}, []int{ua}))
	p := startProxy(t, proxyArgs(file)...)
	p.waitLog(0, `"Serving".*via="node-port"`, 2, 20*time.Second)
	if _, ok := p.stop(syscall.SIGHUP, 10*time.Second); !ok {
		t.Fatal("the proxy did not exit within 10s of SIGHUP")
	}
	if p.err != nil || !strings.Contains(p.log(), `"Shutting down; open connections and sessions are closed"`) {
		t.Fatalf("exit after SIGHUP: %v; want a clean exit that logs it", p.err)
	}
}

// exitCode is the exit code of a command that ended with err: 0 for nil,
// -1 if it did not exit.
func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestBinaryVersionRaw: --version=raw prints the build field by field, as
// kube-proxy's does; a version to report instead is refused, not taken as
// a bool.
func TestBinaryVersionRaw(t *testing.T) {
	out, err := exec.Command(proxyBin, "--version=raw").Output()
	if err != nil || !strings.HasPrefix(string(out), "version.Info{") || !strings.Contains(string(out), `Compiler:"gc"`) {
		t.Fatalf("--version=raw: %v, %q; want version.Info{...} and exit 0", err, out)
	}
	out, err = exec.Command(proxyBin, "--version=v1.31.0").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--version=v1.31.0: want true, false or raw") {
		t.Fatalf("--version=v1.31.0: exit %d, %q; want exit 2 and the reason", code, out)
	}
}

// TestBinaryWriteConfigTo: --write-config-to writes the KubeProxyConfiguration
// that stands for a command line and names the flags it cannot hold; the
// proxy run with --config and those flags serves as the command line did.
func TestBinaryWriteConfigTo(t *testing.T) {
	a := httpBackend(t, "a")
	np, hp, mp := freePort(t), freePort(t), freePort(t)
	dir := t.TempDir()
	services := filepath.Join(dir, "services.yaml")
	writeFile(t, services, manifest(np, "None", []int{a}, nil))
	config := filepath.Join(dir, "config.yaml")
	out, err := exec.Command(proxyBin, "--write-config-to", config, "--manifests", services, "--portal=none",
		"--bind-address=127.0.0.1", "--nodeport-addresses=127.0.0.1/32", fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hp),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp), "--udp-timeout=2s", "-v=2").CombinedOutput()
	if err != nil {
		t.Fatalf("--write-config-to: %v\n%s", err, out)
	}
	_, keep, ok := strings.Cut(strings.TrimSpace(string(out)), "the options it cannot hold: ")
	if !ok || keep != "--manifests="+services+" --portal=none" {
		t.Fatalf("--write-config-to said %q; want it to name --manifests and --portal, the flags the file cannot hold", out)
	}
	p := startProxy(t, append([]string{"--config", config}, strings.Fields(keep)...)...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
	if body, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/", np)); err != nil || body != "a" {
		t.Fatalf("the node port: %v, %q; want backend a", err, body)
	}
	for _, url := range []string{fmt.Sprintf("http://127.0.0.1:%d/healthz", hp), fmt.Sprintf("http://127.0.0.1:%d/metrics", mp)} {
		if code, body := curlCode(t, url); code != "200" {
			t.Fatalf("%s, the written address: %s %s", url, code, body)
		}
	}
	if !strings.Contains(p.log(), `"Synced"`) { // logged at -v=2, which the file carries
		t.Errorf("no -v=2 line: the file's logging.verbosity was not applied:\n%s", p.log())
	}

	// An option the file would read back as something else is refused.
	out, err = exec.Command(proxyBin, "--write-config-to", filepath.Join(dir, "bad.yaml"), "--manifests", services, "--metrics-bind-address=").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), `--metrics-bind-address="" cannot be written`) {
		t.Fatalf("--metrics-bind-address= with --write-config-to: exit %d, %q; want exit 2 and the reason", code, out)
	}
}

// TestBinaryCapsRepeatedMessages: a file with many problems logs the first
// twenty of its warnings, and of a rejected edit's errors, and then how
// many more there are, not hundreds of lines on every edit.
func TestBinaryCapsRepeatedMessages(t *testing.T) {
	services := func(port string) string {
		var b strings.Builder
		for i := range 25 {
			fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: s%d}\nspec: {selector: {app: x}, ports: [{port: %s}]}\n", i, port)
		}
		return b.String()
	}
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, services("80"))
	p := startProxy(t, proxyArgs(file)...)
	p.waitLog(0, `"More manifest warnings not shown".* count=5`, 1, 20*time.Second)
	if n := strings.Count(p.log(), `"Manifest warning"`); n != 20 {
		t.Fatalf("%d warnings logged for 25 Services without slices; want 20 and a count", n)
	}
	from := p.lineCount()
	writeFile(t, file, services("0"))
	p.waitLog(from, `"More problems in the manifest file not shown".* count=5`, 1, 5*time.Second)
	if n := strings.Count(strings.Join(strings.Split(p.log(), "\n")[from:], "\n"), `"Manifest edit rejected`); n != 20 {
		t.Fatalf("%d errors logged for 25 bad Services; want 20 and a count", n)
	}
}

// TestBinaryBusyNodePortRecovers: a node port another program holds is
// reported once, with how the retries go, and served as soon as a retry
// finds it free.
func TestBinaryBusyNodePortRecovers(t *testing.T) {
	a, ua := httpBackend(t, "a"), udpBackend(t, "ua")
	np := freePort(t)
	holder, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", np))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest(np, "None", []int{a}, []int{ua}))
	p := startProxy(t, proxyArgs(file)...)
	// One line: the error, then how the retries go.
	p.waitLog(0, fmt.Sprintf(`"Sync failed; will retry, less often each time, until it succeeds" err="userspace: service e2e/app:http/TCP: listen on 127.0.0.1:%d \(node-port\): bind: address already in use" retryIn="1s" maxRetryInterval="30s"`, np), 1, 20*time.Second)
	holder.Close()
	p.waitLog(0, `"Sync recovered"`, 1, 10*time.Second)
	if body, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/", np)); err != nil || body != "a" {
		t.Fatalf("node port after recovery: %q, %v", body, err)
	}
}

// TestBinaryHealthCheckNodePort: a LoadBalancer Service with
// externalTrafficPolicy: Local has its healthCheckNodePort answered as
// kube-proxy answers it, so a cloud load balancer sends traffic only to
// nodes with an endpoint: 200 while this node has a ready one, 503 when it
// has none, and nothing once the Service no longer asks for the port.
func TestBinaryHealthCheckNodePort(t *testing.T) {
	a := httpBackend(t, "a")
	np, hc := freePort(t), freePort(t)
	lb := func(node string, withHealthCheck bool) string {
		typ, extra := "NodePort", ""
		if withHealthCheck {
			typ, extra = "LoadBalancer", fmt.Sprintf("\n  healthCheckNodePort: %d", hc)
		}
		return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lb, namespace: e2e}
spec:
  type: %s
  clusterIP: 198.18.0.30
  externalTrafficPolicy: Local%s
  ports: [{name: http, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: e2e, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, port: %d}]
endpoints:
- {addresses: [127.0.0.1], nodeName: %s}
`, typ, extra, np, a, node)
	}
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, lb("node", true))
	p := startProxy(t, append(proxyArgs(file), "--hostname-override=node")...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)

	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", hc)
	check := func(wantCode, wantBody string) { // wantBody "*": any
		t.Helper()
		var code, body string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			code, body = curlCode(t, url)
			if code == wantCode && (body == wantBody || wantBody == "*") || time.Now().After(deadline) {
				break
			}
		}
		if code != wantCode || body != wantBody && wantBody != "*" {
			t.Fatalf("curl %s: %s %q; want %s %q", url, code, body, wantCode, wantBody)
		}
	}
	check("200", `{"service":{"namespace":"e2e","name":"lb"},"localEndpoints":1,"serviceProxyHealthy":true}`)
	replaceFile(t, file, lb("other", true))
	check("503", `{"service":{"namespace":"e2e","name":"lb"},"localEndpoints":0,"serviceProxyHealthy":true}`)
	// A LoadBalancer without node ports and with no ingress yet still
	// has its health check, as kube-proxy's NeedsHealthCheck says: the
	// cloud may probe before it sets the status.
	noNodePorts := strings.Replace(lb("node", true), fmt.Sprintf(", nodePort: %d}", np), "}", 1)
	noNodePorts = strings.Replace(noNodePorts, "  type: LoadBalancer\n", "  type: LoadBalancer\n  allocateLoadBalancerNodePorts: false\n", 1)
	replaceFile(t, file, noNodePorts)
	check("200", `{"service":{"namespace":"e2e","name":"lb"},"localEndpoints":1,"serviceProxyHealthy":true}`)
	replaceFile(t, file, lb("node", false))
	check("000", "*") // curl's code when nothing answers
}

// sharedHealthCheckManifest is two LoadBalancer Services with
// externalTrafficPolicy: Local, e2e/lb (documents 1 and 2) and e2e/lb2
// (3 and 4), both with health-check node port hc; lb's endpoint is on
// another node, lb2's on "node". Without lb2 it is lb alone.
func sharedHealthCheckManifest(hc, np, np2, backend int, withLB2 bool) string {
	lb := func(name string, np int, node string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: e2e}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: %[2]d
  ports: [{name: http, port: 80, nodePort: %[3]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: e2e, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{name: http, port: %[4]d}]
endpoints: [{addresses: [127.0.0.1], nodeName: %[5]s}]
`, name, hc, np, backend, node)
	}
	if !withLB2 {
		return lb("lb", np, "other")
	}
	return lb("lb", np, "other") + "---\n" + lb("lb2", np2, "node")
}

// TestBinaryHealthCheckNodePortShared: two Services given one
// health-check node port, which a cluster's allocator never does, are
// refused as two Services on one node port are: at start-up, with the
// file's line, and in an edit, which keeps the last good state. The port
// went on answering for the first Service with the second's endpoints
// counted, so a load balancer sent its traffic to a node without any.
func TestBinaryHealthCheckNodePortShared(t *testing.T) {
	a := httpBackend(t, "a")
	hc, np, np2 := freePort(t), freePort(t), freePort(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "services.yaml")
	shared := sharedHealthCheckManifest(hc, np, np2, a, true)
	want := fmt.Sprintf("document 3 (Service e2e/lb2): spec.healthCheckNodePort: health check node port %d is also the health check node port of Service e2e/lb (document 1)", hc)

	t.Run("refused at start-up", func(t *testing.T) {
		bad := filepath.Join(dir, "shared.yaml")
		writeFile(t, bad, shared)
		line := strings.Count(shared[:strings.LastIndex(shared, "healthCheckNodePort:")], "\n") + 1
		cmd := exec.Command(proxyBin, append(proxyArgs(bad), "--hostname-override=node")...)
		out, err := combinedOutputWithin(t, cmd, 20*time.Second)
		if code := exitCode(err); code != 1 {
			t.Fatalf("exit code %d, want 1; output:\n%s", code, out)
		}
		if w := fmt.Sprintf("shared.yaml:%d: %s", line, want); !strings.Contains(string(out), w) {
			t.Errorf("output does not say %q:\n%s", w, out)
		}
	})

	t.Run("an edit is refused and the port answers for its Service", func(t *testing.T) {
		writeFile(t, file, sharedHealthCheckManifest(hc, np, np2, a, false))
		p := startProxy(t, append(proxyArgs(file), "--hostname-override=node")...)
		p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
		url := fmt.Sprintf("http://127.0.0.1:%d/healthz", hc)
		lbAlone := `{"service":{"namespace":"e2e","name":"lb"},"localEndpoints":0,"serviceProxyHealthy":true}`
		healthzAnswers(t, func(u string) (string, string) { return curlCode(t, u) }, url, "503", lbAlone)

		from := p.lineCount()
		replaceFile(t, file, shared)
		p.waitLog(from, `"Manifest edit rejected|"Applying edited manifests"`, 1, 5*time.Second)
		if log := p.log()[len(strings.Join(p.lines[:from], "\n")):]; !strings.Contains(log, want) {
			t.Errorf("the edit's log does not say %q:\n%s", want, log)
		}
		if code, body := curlCode(t, url); code != "503" || body != lbAlone {
			t.Errorf("after the edit curl %s: %s %q; want 503 %q (lb's state, lb2 not counted)", url, code, body, lbAlone)
		}
	})
}

// curlCode fetches url with the real curl and returns the status (000
// when nothing answered) and the body.
func curlCode(t *testing.T, url string) (code, body string) {
	t.Helper()
	return curlCodeIn(t, "", url)
}

// curlCodeIn is curlCode run in network namespace ns ("" for this one).
func curlCodeIn(t *testing.T, ns netns, url string) (code, body string) {
	t.Helper()
	args := []string{requireTool(t, "curl"), "-s", "--max-time", "2", "-w", "\n%{http_code}", url}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", string(ns)}, args...)
	}
	// Standard output is the body, a newline and the status.
	out, _ := exec.Command(args[0], args[1:]...).Output()
	i := strings.LastIndexByte(string(out), '\n')
	return string(out[i+1:]), string(out[:max(i, 0)])
}

// healthzManifest is a LoadBalancer Service with externalTrafficPolicy:
// Local, whose health-check node port is hc, with an endpoint at
// 127.0.0.1:backend on node "node", and a NodePort Service on busy.
func healthzManifest(hc, np, busy, backend int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lb, namespace: e2e}
spec:
  type: LoadBalancer
  clusterIP: 198.18.0.30
  externalTrafficPolicy: Local
  healthCheckNodePort: %d
  ports: [{name: http, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: e2e, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, port: %d}]
endpoints: [{addresses: [127.0.0.1], nodeName: node}]
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.31
  ports: [{name: http, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other-1, namespace: e2e, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
ports: [{name: http, port: %d}]
endpoints: [{addresses: [127.0.0.1]}]
`, hc, np, backend, busy, backend)
}

// healthzAnswers polls url with curl (run by run) until it answers code
// with inBody in its body, bounded.
func healthzAnswers(t *testing.T, run func(url string) (code, body string), url, code, inBody string) {
	t.Helper()
	var got, body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got, body = run(url); got == code && strings.Contains(body, inBody) {
			return
		}
	}
	t.Fatalf("%s answered %s %q; want %s with %q within 10s", url, got, body, code, inBody)
}

// TestBinaryHealthz: /healthz, /livez and a health-check node port answer
// with kube-proxy's JSON, and a Service the proxy cannot serve (its node
// port held by another program, so every sync reports it) does not make
// the proxy unhealthy: a restart would not help it, and a 503 would drain
// every Service from the node. (TestBinaryHealthzWhenPortalsFail makes
// the proxy itself fail.)
func TestBinaryHealthz(t *testing.T) {
	a := httpBackend(t, "a")
	np, busy, hc, hz, mp := freePort(t), freePort(t), freePort(t), freePort(t), freePort(t)
	holder, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", busy))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, healthzManifest(hc, np, busy, a))
	px := startProxy(t, append(proxyArgs(file), "--hostname-override=node", "--iptables-sync-period=1s", "-v=2",
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))...)
	px.waitLog(0, `"Serving /healthz and /livez" addr="127.0.0.1:`+strconv.Itoa(hz), 1, 20*time.Second)
	px.waitLog(0, `"Sync failed; will retry`, 1, 20*time.Second)
	run := func(url string) (string, string) { return curlCode(t, url) }
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", hz)
	healthzAnswers(t, run, healthz, "200", `"nodeEligible":true,"healthy":true`)
	// Twice the 2 s health timeout of retries later, still healthy.
	px.waitLog(0, `"Sync failed again"`, 4, 20*time.Second)
	for _, url := range []string{healthz, fmt.Sprintf("http://127.0.0.1:%d/livez", hz)} {
		if code, body := curlCode(t, url); code != "200" || !strings.Contains(body, `"healthy":true`) {
			t.Errorf("%s while one Service cannot be served: %s %s", url, code, body)
		}
	}
	healthzAnswers(t, run, fmt.Sprintf("http://127.0.0.1:%d/", hc), "200", `"localEndpoints":1,"serviceProxyHealthy":true`)
	if code, _ := curlCode(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", hz)); code != "404" {
		t.Errorf("/metrics on the health server: %s, want 404", code)
	}
	// The metrics server counts the failed syncs, not as the portal's.
	if code, body := curlCode(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", mp)); code != "200" ||
		!regexp.MustCompile(`\nkube_userspace_proxy_sync_failures_total\{cause="services"\} [1-9]`).MatchString(body) ||
		!strings.Contains(body, "\n"+`kube_userspace_proxy_sync_failures_total{cause="portal"} 0`+"\n") {
		t.Errorf("/metrics: %s, sync failures: %q", code, regexp.MustCompile(`(?m)^kube_userspace_proxy_sync_failures.*$`).FindAllString(body, -1))
	}
	// The debug view says what fails, and shows the health-check port.
	view, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/debug/services", mp))
	if err != nil || !strings.Contains(view, fmt.Sprintf("The last sync failed, and is retried: userspace: service e2e/other:http/TCP: listen on 127.0.0.1:%d (node-port)", busy)) ||
		!strings.Contains(view, fmt.Sprintf("  health check: node port %d\n", hc)) ||
		!strings.Contains(view, "  node & pods:  external traffic from this node goes to every endpoint (from pods too, given --cluster-cidr)") {
		t.Errorf("/debug/services: %v\n%s", err, view)
	}
}

// TestBinaryMetrics: /metrics on --metrics-bind-address, scraped with
// curl, has kube-proxy's sync metrics and the data plane's counters, which
// follow real traffic; /proxyMode and the plain /healthz answer as
// kube-proxy's metrics server does.
func TestBinaryMetrics(t *testing.T) {
	a, ua := httpBackend(t, "a"), udpBackend(t, "ua")
	np, mp := freePort(t), freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest(np, "None", []int{a}, []int{ua}))
	px := startProxy(t, append(proxyArgs(file), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))...)
	px.waitLog(0, `"Serving /metrics" addr="127.0.0.1:`+strconv.Itoa(mp), 1, 20*time.Second)
	px.waitLog(0, `"Serving".*via="node-port"`, 2, 20*time.Second)
	for range 5 {
		if body, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/", np)); err != nil || body != "a" {
			t.Fatalf("node port: %q, %v", body, err)
		}
	}
	for range 3 {
		if got, err := ncUDP(t, "127.0.0.1", np, "hi"); err != nil || !strings.HasPrefix(got, "ua") {
			t.Fatalf("UDP node port: %q, %v", got, err)
		}
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", mp)
	// Traffic may flow a moment before the sync that opened it is
	// recorded: wait (bounded) for its changes to be applied.
	var metrics string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if metrics, err = curl(t, base+"/metrics"); err != nil {
			t.Fatalf("/metrics: %v: %s", err, metrics)
		}
		if strings.Contains(metrics, "\nkubeproxy_sync_proxy_rules_service_changes_pending 0\n") &&
			strings.Contains(metrics, "\nkubeproxy_sync_proxy_rules_endpoint_changes_pending 0\n") || time.Now().After(deadline) {
			break
		}
	}
	values := map[string]float64{}
	for _, line := range strings.Split(metrics, "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && !strings.HasPrefix(line, "#") {
			f, _ := strconv.ParseFloat(v, 64)
			values[name] = f
		}
	}
	for name, want := range map[string]float64{
		"kube_userspace_proxy_tcp_connections_accepted_total":               5,
		"kube_userspace_proxy_udp_sessions_opened_total":                    3,
		`kube_userspace_proxy_udp_datagrams_total{direction="to_endpoint"}`: 3,
		`kube_userspace_proxy_udp_datagrams_total{direction="to_client"}`:   3,
		// Each datagram is "hi"; the backend answers "ua:hi".
		`kube_userspace_proxy_bytes_total{direction="to_endpoint",protocol="udp"}`:  3 * 2,
		`kube_userspace_proxy_bytes_total{direction="to_client",protocol="udp"}`:    3 * 5,
		`kube_userspace_proxy_bytes_total{direction="to_endpoint",protocol="sctp"}`: 0,
		"kube_userspace_proxy_tcp_no_endpoints_total":                               0,
		// The file's one Service, with endpoints, is a Service change
		// and an endpoint change, which the first sync applied.
		"kubeproxy_sync_proxy_rules_service_changes_total":    1,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":   1,
		"kubeproxy_sync_proxy_rules_service_changes_pending":  0,
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending": 0,
	} {
		if got, ok := values[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	// kube-proxy's sync metrics carry ip_family, as they do since 1.33;
	// IPv4 is always served.
	for _, name := range []string{
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`,
		`kube_userspace_proxy_bytes_total{direction="to_client",protocol="tcp"}`,
		"process_open_fds",
	} {
		if values[name] <= 0 {
			t.Errorf("%s = %v, want it above 0", name, values[name])
		}
	}
	if _, ok := values[`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"}`]; !ok {
		t.Errorf("/metrics lacks no_local_endpoints_total by ip_family")
	}
	if body, err := curl(t, base+"/proxyMode"); err != nil || body != "userspace" {
		t.Errorf("/proxyMode: %q, %v", body, err)
	}
	if body, err := curl(t, base+"/healthz"); err != nil || body != "ok" {
		t.Errorf("/healthz of the metrics server: %q, %v", body, err)
	}
	// The teaching view: what each service port serves, and where.
	view, err := curl(t, base+"/debug/services")
	if err != nil {
		t.Fatalf("/debug/services: %v: %s", err, view)
	}
	for _, want := range []string{
		"2 service ports, portal none, applied ",
		"\ne2e/app:http/TCP\n",
		fmt.Sprintf("  frontends:    198.18.0.20:80, node port %d\n", np),
		"  affinity:     none: round robin\n",
		fmt.Sprintf("  endpoints:    127.0.0.1:%d\n", a),
		fmt.Sprintf("127.0.0.1:%d (node-port)", np),
		"\ne2e/app:dns/UDP\n",
		fmt.Sprintf("  endpoints:    127.0.0.1:%d\n", ua),
		"  carried:      5 connections, ",
		"  carried:      3 UDP sessions, ",
	} {
		if !strings.Contains(view, want) {
			t.Errorf("/debug/services lacks %q:\n%s", want, view)
		}
	}
}

func TestBadInputFailsClearly(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, manifest(freePort(t), "None", nil, nil))
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, strings.Replace(manifest(30000, "None", nil, nil), "protocol: UDP", "protocol: QUIC", 1))

	tests := []struct {
		name     string
		nobody   bool // run as nobody, without capabilities
		args     []string
		wantCode int
		want     []string
	}{
		{name: "no source", args: nil, wantCode: 1, want: []string{"no source of services", "--manifests"}},
		{name: "two sources", args: []string{"--manifests", good, "--kubeconfig", good}, wantCode: 2, want: []string{"give one"}},
		{name: "bad bind address", args: []string{"--manifests", good, "--bind-address", "localhost:80"}, wantCode: 2, want: []string{"--bind-address", "localhost:80"}},
		{name: "bind address not on this host", args: []string{"--manifests", good, "--bind-address", "192.0.2.77"}, wantCode: 1, want: []string{"--bind-address 192.0.2.77 is not an address of this host"}},
		{name: "bad port range", args: []string{"--manifests", good, "--proxy-port-range", "9-1"}, wantCode: 2, want: []string{"--proxy-port-range", "end is before begin"}},
		{name: "bad nodeport CIDR", args: []string{"--manifests", good, "--nodeport-addresses", "127.0.0.1"}, wantCode: 2, want: []string{"--nodeport-addresses", "not a CIDR"}},
		{name: "bad portal", args: []string{"--manifests", good, "--portal=ipvs"}, wantCode: 2, want: []string{"--portal", "ipvs"}},
		{name: "kube-proxy's mode", args: []string{"--manifests", good, "--proxy-mode=ipvs", "--conntrack-max-per-core=0"}, wantCode: 2,
			want: []string{`--proxy-mode: "ipvs" is one of kube-proxy's own modes`, "--proxy-mode=userspace"}},
		{name: "bad content type", args: []string{"--manifests", good, "--kube-api-content-type", "yaml"}, wantCode: 2, want: []string{"--kube-api-content-type"}},
		{name: "bad udp timeout", args: []string{"--manifests", good, "--udp-timeout", "0s"}, wantCode: 2, want: []string{"--udp-timeout"}},
		{name: "unknown flag", args: []string{"--manifests", good, "--no-such-flag"}, wantCode: 2, want: []string{"no-such-flag"}},
		{name: "missing file", args: []string{"--manifests", filepath.Join(dir, "absent.yaml")}, wantCode: 1, want: []string{"manifests: open ", "absent.yaml", "no such file"}},
		{name: "bad manifest", args: []string{"--manifests", bad}, wantCode: 1, want: []string{"bad.yaml:10: document 1 (Service e2e/app): spec.ports[1].protocol", "QUIC"}},
		{name: "bind portal without CAP_NET_ADMIN", nobody: true, args: []string{"--manifests", good, "--portal=bind"}, wantCode: 1, want: []string{"--portal=bind", "CAP_NET_ADMIN"}},
		{name: "iptables portal without CAP_NET_ADMIN", nobody: true, args: []string{"--manifests", good, "--portal=iptables"}, wantCode: 1, want: []string{"--portal=iptables: "}},
		{name: "cleanup without CAP_NET_ADMIN", nobody: true, args: []string{"--cleanup"}, wantCode: 1, want: []string{"cleanup", "CAP_NET_ADMIN"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Never let a failing case program the host: no portal, or no
			// capabilities.
			args := append([]string{"--portal=none"}, tc.args...)
			cmd := exec.Command(proxyBin, args...)
			if tc.nobody && os.Geteuid() == 0 { // as anyone else, already without
				requireTool(t, "setpriv")
				cmd = exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", proxyBin}, args...)...)
			}
			out, err := combinedOutputWithin(t, cmd, 20*time.Second)
			if code := exitCode(err); code != tc.wantCode {
				t.Fatalf("exit code %d, want %d; output:\n%s", code, tc.wantCode, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output does not mention %q:\n%s", w, out)
				}
			}
			// Each layer names itself once: no "manifests: manifests:".
			for _, word := range []string{"manifests: ", "kube-userspace-proxy: ", "bind: ", "iptables: "} {
				if n := strings.Count(string(out), word); n > 1 {
					t.Errorf("output says %q %d times:\n%s", word, n, out)
				}
			}
		})
	}
}

// TestManifestNotesInDebugView: /debug/services lists the manifest's
// warnings under a heading of their own, in the order of the file, and
// under "Parts of the manifest file are ignored" only what is: a cluster
// IP two Services share (on different ports: both are served) is a
// warning, not an ignored part. The log says the same warnings in the
// same order, and names a cluster-scoped kind without a namespace.
func TestManifestNotesInDebugView(t *testing.T) {
	a := httpBackend(t, "a")
	np := freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	// Documents 1 and 2: app and its slice. 3: a Service on app's cluster
	// IP that selects pods (two warnings the checks across objects find
	// last). 4: a Namespace (skipped). 5: a slice of a family app lacks
	// (ignored).
	content := manifest(np, "None", []int{a}, nil) + `---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: e2e}
spec:
  clusterIP: 198.18.0.20
  selector: {app: other}
  ports: [{port: 81}]
---
apiVersion: v1
kind: Namespace
metadata: {name: e2e}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: app-six, namespace: e2e, labels: {kubernetes.io/service-name: app}}
addressType: IPv6
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["::1"]}]
`
	writeFile(t, file, content)
	lineOf := func(text string) int { return strings.Count(content[:strings.Index(content, text)], "\n") + 1 }
	mp := freePort(t)
	p := startProxy(t, append(proxyArgs(file), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))...)
	p.waitLog(0, `"Loaded manifests"`, 1, 20*time.Second)

	var warnings, wantLogged []string
	if np < 30000 || np > 32767 { // outside the default node port range
		warnings = []string{"document 1 (Service e2e/app): spec.ports[0].nodePort: ", "document 1 (Service e2e/app): spec.ports[1].nodePort: "}
		wantLogged = []string{
			fmt.Sprintf(`document=1 line=%d object="Service e2e/app" field="spec.ports[0].nodePort"`, lineOf("- {name: http")),
			fmt.Sprintf(`document=1 line=%d object="Service e2e/app" field="spec.ports[1].nodePort"`, lineOf("- {name: dns")),
		}
	}
	warnings = append(warnings,
		"document 3 (Service e2e/other): spec.clusterIP: 198.18.0.20 is also the cluster IP of Service e2e/app",
		"document 3 (Service e2e/other): spec.selector: selects pods",
		`document 4 (Namespace e2e): apiVersion "v1" kind "Namespace" is not a Service or EndpointSlice; skipped`,
	)
	ignored := []string{"document 5 (EndpointSlice e2e/app-six): "}
	// section returns the lines under heading in view, up to the next line
	// that is not indented.
	section := func(view, heading string) []string {
		_, rest, ok := strings.Cut(view, "\n"+heading+"\n")
		if !ok {
			return nil
		}
		var lines []string
		for line := range strings.SplitSeq(rest, "\n") {
			if !strings.HasPrefix(line, "  ") {
				break
			}
			lines = append(lines, line)
		}
		return lines
	}
	// matches reports whether lines hold, one each and in order, the
	// texts of want.
	matches := func(lines, want []string) bool {
		if len(lines) != len(want) {
			return false
		}
		for i := range want {
			if !strings.Contains(lines[i], want[i]) {
				return false
			}
		}
		return true
	}
	var view string
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/debug/services", mp))
		if err == nil && !strings.HasPrefix(v, "Nothing applied yet") {
			view = v
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/debug/services: %v: %s", err, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := section(view, "Warnings about the manifest file:"); !matches(got, warnings) {
		t.Errorf("warnings:\n%s\nwant, in this order, lines with\n%s\nin /debug/services:\n%s", strings.Join(got, "\n"), strings.Join(warnings, "\n"), view)
	}
	if got := section(view, "Parts of the manifest file are ignored:"); !matches(got, ignored) {
		t.Errorf("ignored:\n%s\nwant lines with\n%s\nin /debug/services:\n%s", strings.Join(got, "\n"), strings.Join(ignored, "\n"), view)
	}

	var logged []string
	for line := range strings.SplitSeq(p.log(), "\n") {
		if strings.Contains(line, `"Manifest warning"`) {
			logged = append(logged, line)
		}
	}
	wantLogged = append(wantLogged,
		fmt.Sprintf(`document=3 line=%d object="Service e2e/other" field="spec.clusterIP"`, lineOf("  clusterIP: 198.18.0.20\n  selector")),
		fmt.Sprintf(`document=3 line=%d object="Service e2e/other" field="spec.selector"`, lineOf("  selector: {app: other}")),
		fmt.Sprintf(`document=4 line=%d object="Namespace e2e" reason=`, lineOf("apiVersion: v1\nkind: Namespace")),
	)
	if !matches(logged, wantLogged) {
		t.Errorf("logged warnings:\n%s\nwant, in this order, lines with\n%s", strings.Join(logged, "\n"), strings.Join(wantLogged, "\n"))
	}
}

// combinedOutputWithin runs cmd, which should exit by itself, and returns
// its output; still running after d, it is killed and the test fails.
func combinedOutputWithin(t *testing.T, cmd *exec.Cmd, d time.Duration) ([]byte, error) {
	t.Helper()
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		t.Fatalf("still running after %v; output:\n%s", d, out)
	}
	return out, err
}
