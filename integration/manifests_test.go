//go:build integration && linux

package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// TestBinarySIGTERMDuringStartupParse: SIGTERM while the proxy parses a
// large manifest file at start ends it then, with status 0, and nothing
// of the file is served; before, the whole file was parsed (seconds for
// tens of megabytes) and served first.
func TestBinarySIGTERMDuringStartupParse(t *testing.T) {
	var b strings.Builder
	for i := range 20000 {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {name: s%[1]d, namespace: big}
spec:
  clusterIP: 198.18.%[2]d.%[3]d
  ports: [{name: tcp, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s%[1]d-1, namespace: big, labels: {kubernetes.io/service-name: s%[1]d}}
addressType: IPv4
ports: [{name: tcp, port: 8080}]
endpoints: [{addresses: ["198.19.%[2]d.%[3]d"]}, {addresses: ["198.19.%[2]d.%[4]d"]}]
`, i, i/250, i%250+1, (i+1)%250+1)
	}
	file := filepath.Join(t.TempDir(), "big.yaml")
	writeFile(t, file, b.String())
	px := startProxy(t, "--manifests", file, "--portal=none", "--bind-address=127.0.0.1", "--nodeport-addresses=127.0.0.1/32")
	px.waitLog(0, `"Starting kube-userspace-proxy"`, 1, 20*time.Second)
	took, ok := px.terminate(10 * time.Second)
	if !ok {
		t.Fatalf("still running %v after SIGTERM", took.Round(time.Millisecond))
	}
	t.Logf("exited %v after SIGTERM, from a %d-byte file", took.Round(time.Millisecond), b.Len())
	if px.err != nil {
		t.Errorf("exit status: %v", px.err)
	}
	if strings.Contains(px.log(), `"Loaded manifests"`) {
		t.Errorf("the file was parsed to its end after SIGTERM:\n%s", px.log())
	}
}
