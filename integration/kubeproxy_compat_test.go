//go:build integration && linux

package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// waitExit waits up to within for p to exit and returns its exit status
// (nil for 0); the test fails if it is still running.
func (p *proxyProc) waitExit(within time.Duration) error {
	p.t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(within):
		p.t.Fatalf("still running after %v", within)
		return nil
	}
}

// TestBinaryInitOnly: --init-only, as an initContainer of a hardened
// DaemonSet runs it, checks the options and exits 0 at once, saying so,
// without serving anything; bad options still fail it.
func TestBinaryInitOnly(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// Nobody listens at its server: nothing may be reached for.
	writeFile(t, kubeconfig, "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\n"+
		"contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n")
	config := filepath.Join(dir, "config.yaml")
	configWith := func(kubeconfig string) string {
		return "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\nclientConnection:\n  kubeconfig: " + kubeconfig + "\n"
	}
	writeFile(t, config, configWith(kubeconfig))
	px := startProxy(t, "--init-only", "--config", config, "--portal=none", "--kubeconfig=/ignored/with/config")
	if err := px.waitExit(10 * time.Second); err != nil {
		t.Fatalf("--init-only: exit status %v, want 0\n%s", err, px.log())
	}
	if !strings.Contains(px.log(), "--init-only: nothing needs privileged set-up") {
		t.Errorf("no line saying why it exits:\n%s", px.log())
	}
	if strings.Contains(px.log(), "Starting kube-userspace-proxy") {
		t.Errorf("--init-only started the proxy:\n%s", px.log())
	}
	// As kube-proxy's, the first line says which build runs, before
	// what reading the --config file logs.
	if first, _, _ := strings.Cut(px.log(), "\n"); !strings.Contains(first, `"Version info"`) {
		t.Errorf("the first line is not Version info:\n%s", px.log())
	}

	bad := startProxy(t, "--init-only", "--config", config, "--portal=nowhere")
	if err := bad.waitExit(10 * time.Second); err == nil {
		t.Fatalf("--init-only with a bad --portal exited 0:\n%s", bad.log())
	}

	// A kubeconfig that does not exist, or does not parse, is an error
	// of the options (exit 2), as the API client would find it.
	garbage := filepath.Join(dir, "garbage")
	writeFile(t, garbage, "clusters: [\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing, by flag", []string{"--kubeconfig", "/nonexistent"}, "--kubeconfig: open /nonexistent"},
		{"unparsable, by flag", []string{"--kubeconfig", garbage}, "--kubeconfig " + garbage},
		{"missing, by file", []string{"--config", filepath.Join(dir, "missing.yaml")}, "clientConnection.kubeconfig: open /nonexistent/kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeFile(t, filepath.Join(dir, "missing.yaml"), configWith("/nonexistent/kubeconfig"))
			px := startProxy(t, append([]string{"--init-only", "--portal=none"}, tc.args...)...)
			err := px.waitExit(10 * time.Second)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit %v, want status 2:\n%s", err, px.log())
			}
			if !strings.Contains(px.log(), tc.want) {
				t.Errorf("the error does not say %q:\n%s", tc.want, px.log())
			}
		})
	}

	// A --manifests file is read as a start reads it: one a start would
	// refuse fails --init-only as it fails the start (exit 1, naming the
	// file, the line and the field); a good one passes, and nothing is
	// served.
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, loopbackNodePortManifest("init", freePort(t), 9))
	broken := filepath.Join(dir, "broken.yaml")
	writeFile(t, broken, "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\nspec:\n  ports: [{port: 99999}]\n")
	missing := filepath.Join(dir, "none.yaml")
	for _, tc := range []struct {
		name, file, want string
		code             int
	}{
		{"good manifests", good, "--init-only: nothing needs privileged set-up", 0},
		{"a bad field in the manifests", broken, broken + ":5: document 1 (Service x/a): spec.ports[0].port: 99999 is out of range 1-65535", 1},
		{"no manifest file", missing, "manifests: open " + missing + ": no such file or directory", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := startProxy(t, "--init-only", "--portal=none", "--manifests", tc.file)
			err := px.waitExit(10 * time.Second)
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Fatalf("exit status %d, want %d:\n%s", code, tc.code, px.log())
			}
			if !strings.Contains(px.log(), tc.want) {
				t.Errorf("the log does not say %q:\n%s", tc.want, px.log())
			}
			if strings.Contains(px.log(), "Starting kube-userspace-proxy") || strings.Contains(px.log(), `"Serving"`) {
				t.Errorf("--init-only started the proxy:\n%s", px.log())
			}
		})
	}
}

// TestBinaryAutoPortalInCluster: following a cluster, --portal=auto
// never falls back to none, which would capture no Service IP and still
// answer /healthz with 200: without CAP_NET_ADMIN it refuses to start and
// says what is missing and how to ask for none. --portal=none, asked for,
// starts. (Manifest mode's fallback to none is TestBinaryAutoPortal's.)
func TestBinaryAutoPortalInCluster(t *testing.T) {
	requireRoot(t)
	requireTool(t, "setpriv")
	node := newNetns(t, "node")
	// Nobody listens here: the portal is chosen before the API server is
	// reached for.
	const master = "http://127.0.0.1:9"
	for _, tc := range []struct {
		name string
		priv []string
	}{
		{"unprivileged", []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}},
		{"root without CAP_NET_ADMIN", []string{"setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"netns", "exec", string(node)}, tc.priv...)
			args = append(args, proxyBin, "--master", master, "--hostname-override=node", "--portal=auto",
				"--healthz-bind-address=", "--metrics-bind-address=")
			px := startCommand(t, "ip", args...)
			err := px.waitExit(20 * time.Second)
			if err == nil {
				t.Fatalf("exit 0, want an error:\n%s", px.log())
			}
			log := px.log()
			for _, want := range []string{"CAP_NET_ADMIN", "--portal=none", "iptables"} {
				if !strings.Contains(log, want) {
					t.Errorf("the error does not name %s:\n%s", want, log)
				}
			}
			if strings.Contains(log, `"Portal chosen" portal="none"`) {
				t.Errorf("auto chose none in cluster mode:\n%s", log)
			}
			if strings.Contains(log, "\n) nor") {
				t.Errorf("iptables' error is not on one line:\n%s", log)
			}
			// Root without the capability (a container dropping ALL) is
			// told what it lacks, not to run as root.
			if root := tc.name != "unprivileged"; root && (strings.Contains(log, "run as root") || strings.Contains(log, "run with CAP_NET_ADMIN (as root")) {
				t.Errorf("a root process is told to run as root:\n%s", log)
			}

			args = append([]string{"netns", "exec", string(node)}, tc.priv...)
			args = append(args, proxyBin, "--master", master, "--hostname-override=node", "--portal=none",
				"--healthz-bind-address=", "--metrics-bind-address=")
			explicit := startCommand(t, "ip", args...)
			explicit.waitLog(0, `"Starting kube-userspace-proxy".*portal="none"`, 1, 20*time.Second)
		})
	}
}

// TestBinaryBusyServerPortNamesConfigField: with --config, a health or
// metrics port another program holds is reported naming the file's field
// that set it, not the flag the file overrides.
func TestBinaryBusyServerPortNamesConfigField(t *testing.T) {
	dir := t.TempDir()
	hz, mp := freePort(t), freePort(t)
	for _, port := range []int{hz, mp} {
		holder, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
	}
	manifests := filepath.Join(dir, "services.yaml")
	writeFile(t, manifests, "# no Services\n")
	config := filepath.Join(dir, "config.yaml")
	writeFile(t, config, fmt.Sprintf("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"healthzBindAddress: 127.0.0.1:%d\nmetricsBindAddress: 127.0.0.1:%d\n", hz, mp))
	px := startProxy(t, "--config", config, "--manifests", manifests, "--portal=none")
	px.waitLog(0, `Cannot serve /healthz and /livez \(set --config \S+: healthzBindAddress to a free address`, 1, 10*time.Second)
	px.waitLog(0, `Cannot serve /metrics \(set --config \S+: metricsBindAddress to a free address`, 1, 10*time.Second)
	if strings.Contains(px.log(), "bind-address to a free address") {
		t.Errorf("the flag the file overrides is named:\n%s", px.log())
	}
}

// TestBinaryVersionInLogAndUserAgent: as kube-proxy, the start-up log says
// which build runs (at -v=0), and the API client names the proxy and its
// version in its User-Agent, not client-go's v0.0.0 and $Format.
func TestBinaryVersionInLogAndUserAgent(t *testing.T) {
	agents := make(chan string, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case agents <- r.UserAgent():
		default:
		}
		http.Error(w, "not a real API server", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	px := startProxy(t, "--master", srv.URL, "--portal=none", "--hostname-override=node")
	px.waitLog(0, `"Version info" version="[^"]+".*goVersion="go1\.[^"]*" platform="[^"]+" dataPlane="(event loops|goroutines)"`, 1, 10*time.Second)
	select {
	case ua := <-agents:
		if !regexp.MustCompile(`^kube-userspace-proxy/[^ ]+ \(\w+/\w+\) kubernetes/\S+$`).MatchString(ua) ||
			strings.Contains(ua, "v0.0.0") || strings.Contains(ua, "$Format") {
			t.Errorf("User-Agent %q: want kube-userspace-proxy/<version> (os/arch) kubernetes/<commit>", ua)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the proxy sent no request to the API server")
	}
}

// TestBinaryExitsWhenConfigChanges: as kube-proxy, the proxy exits with
// an error when its --config file changes, saying why, so that its
// DaemonSet starts it again with the new content; a write that leaves the
// content as it was changes nothing.
func TestBinaryExitsWhenConfigChanges(t *testing.T) {
	dir := t.TempDir()
	manifests := filepath.Join(dir, "services.yaml")
	writeFile(t, manifests, "# no Services\n")
	config := filepath.Join(dir, "config.yaml")
	content := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\nhealthzBindAddress: \"\"\nmetricsBindAddress: \"\"\n"
	writeFile(t, config, content)
	px := startProxy(t, "--config", config, "--manifests", manifests, "--portal=none", "-v=2")
	px.waitLog(0, `"Synced"`, 1, 20*time.Second)
	replaceFile(t, config, content) // the same: no change
	select {
	case <-px.done:
		t.Fatalf("exited (%v) after a write that changed nothing:\n%s", px.err, px.log())
	case <-time.After(2 * time.Second):
	}
	replaceFile(t, config, content+"portRange: 40000-40100\n")
	err := px.waitExit(10 * time.Second)
	if err == nil {
		t.Fatalf("exit 0 after the --config file changed; want an error, for the DaemonSet to restart it:\n%s", px.log())
	}
	if !regexp.MustCompile(`"Stopping: the --config file changed".*has new content`).MatchString(px.log()) {
		t.Errorf("the log does not say why it stopped:\n%s", px.log())
	}
}

// TestBinaryClientMetricsAndConfigz: following a real API server, the
// metrics port serves client-go's request metrics as kube-proxy's does
// (rest_client_requests_total and rest_client_request_duration_seconds,
// which the kubernetes-mixin proxy dashboard plots), counting the proxy's
// requests, kubernetes_build_info, and /configz with the effective
// configuration as JSON.
func TestBinaryClientMetricsAndConfigz(t *testing.T) {
	api := requireAPIServer(t)
	mp := freePort(t)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d", mp)
	px := startProxy(t, "--kubeconfig", api.Kubeconfig, "--portal=none", "--bind-address=127.0.0.1", noNodePorts,
		"--hostname-override=node", "--metrics-bind-address="+metricsURL[len("http://"):])
	px.waitLog(0, `"Serving /metrics"`, 1, 20*time.Second)
	host := regexp.QuoteMeta(strings.TrimPrefix(api.URL, "https://"))
	// The informers list and watch with streaming watches (client-go's
	// WatchListClient), which client-go counts in requests_total but times
	// in no request_duration_seconds, as in kube-proxy; the unit tests see
	// that one served.
	requests := regexp.MustCompile(`(?m)^rest_client_requests_total\{code="200",host="` + host + `",method="GET"\} ([1-9][0-9]*)$`)
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		body, _ = curl(t, metricsURL+"/metrics")
		if requests.MatchString(body) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no rest_client_requests_total for GETs to %s:\n%s", api.URL, grepLines(body, "rest_client"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !regexp.MustCompile(`(?m)^kubernetes_build_info\{.*go_version="go1\.[^"]*".*\} 1$`).MatchString(body) {
		t.Errorf("no kubernetes_build_info:\n%s", grepLines(body, "build_info"))
	}
	// Built by the Makefile from a git checkout: the commit and its date.
	if regexp.MustCompile(`git_commit="[0-9a-f]{40}"`).MatchString(body) && !regexp.MustCompile(`build_date="20\d\d-\d\d-\d\dT[^"]+"`).MatchString(body) {
		t.Errorf("kubernetes_build_info names the commit but not its date:\n%s", grepLines(body, "build_info"))
	}

	configz, err := curl(t, metricsURL+"/configz")
	if err != nil {
		t.Fatalf("/configz: %v", err)
	}
	var got map[string]struct {
		Mode             string `json:"mode"`
		ClientConnection struct {
			Kubeconfig string `json:"kubeconfig"`
		} `json:"clientConnection"`
		MetricsBindAddress string `json:"metricsBindAddress"`
	}
	if err := json.Unmarshal([]byte(configz), &got); err != nil {
		t.Fatalf("/configz is not JSON: %v\n%s", err, configz)
	}
	kp, ok := got["kubeproxy.config.k8s.io"]
	if !ok || kp.Mode != "userspace" || kp.ClientConnection.Kubeconfig != api.Kubeconfig || kp.MetricsBindAddress != metricsURL[len("http://"):] {
		t.Errorf("/configz = %s; want the effective configuration under kubeproxy.config.k8s.io", configz)
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
