//go:build integration && linux

package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBinaryProxyPortRangeSpacesRefused: a port range with spaces around
// its dash or plus, which kube-proxy's ParsePortRange refuses, is an error
// of the options (exit 2) naming the flag, or the --config file's
// portRange, and the value; it was taken as the range without them.
func TestBinaryProxyPortRangeSpacesRefused(t *testing.T) {
	dir := t.TempDir()
	manifests := filepath.Join(dir, "services.yaml")
	writeFile(t, manifests, "apiVersion: v1\nkind: List\nitems: []\n")
	config := filepath.Join(dir, "config.yaml")
	writeFile(t, config, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\nportRange: 30000 - 30100\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"flag", []string{"--proxy-port-range=30000 - 30100"}, `--proxy-port-range: invalid port range "30000 - 30100"`},
		{"flag, plus", []string{"--proxy-port-range=30000 +100"}, `--proxy-port-range: invalid port range "30000 +100"`},
		{"config file", []string{"--config", config}, "--config " + config + `: portRange: invalid port range "30000 - 30100"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, initOnly := range []bool{false, true} {
				args := append([]string{"--manifests", manifests, "--portal=none", "--bind-address=127.0.0.1"}, tc.args...)
				if initOnly {
					args = append(args, "--init-only")
				}
				px := startProxy(t, args...)
				if code := exitCode(px.waitExit(10 * time.Second)); code != 2 {
					t.Fatalf("--init-only=%v: exit status %d, want 2:\n%s", initOnly, code, px.log())
				}
				if !strings.Contains(px.log(), tc.want) {
					t.Errorf("--init-only=%v: the error does not say %s:\n%s", initOnly, tc.want, px.log())
				}
			}
		})
	}
}

// TestBinaryInitOnlyWithoutSource: --init-only with no source of services
// (no --manifests, kubeconfig or --master, and not in a cluster) fails as
// a start does, with its exit status (1) and its error, as kube-proxy's
// --init-only, which builds its API client first; it said the options
// were valid and exited 0.
func TestBinaryInitOnlyWithoutSource(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	const want = "kube-userspace-proxy: no source of services: give --manifests FILE or --kubeconfig/--master, or run inside a cluster (api client: unable to load in-cluster configuration"
	args := []string{"--portal=none", "--hostname-override=node", "--healthz-bind-address=", "--metrics-bind-address="}
	px := startProxy(t, append([]string{"--init-only"}, args...)...)
	if code := exitCode(px.waitExit(10 * time.Second)); code != 1 {
		t.Fatalf("--init-only: exit status %d, want 1:\n%s", code, px.log())
	}
	if !strings.Contains(px.log(), want) {
		t.Errorf("--init-only: the error does not say %s:\n%s", want, px.log())
	}
	if strings.Contains(px.log(), "Options are valid") {
		t.Errorf("--init-only says the options are valid:\n%s", px.log())
	}
	// A start, in a namespace of its own (--portal=none still removes
	// what an earlier proxy left): the same status and error.
	t.Run("start", func(t *testing.T) {
		requireRoot(t)
		ns := newNetns(t, "nosource")
		start := startCommand(t, "ip", append([]string{"netns", "exec", string(ns), proxyBin}, args...)...)
		if code := exitCode(start.waitExit(20 * time.Second)); code != 1 {
			t.Fatalf("start: exit status %d, want 1:\n%s", code, start.log())
		}
		if !strings.Contains(start.log(), want) {
			t.Errorf("start: the error does not say %s:\n%s", want, start.log())
		}
	})
}

// TestBinaryDeprecatedPortFlags: --healthz-port and --metrics-port are
// applied where kube-proxy applies them: a start serves /healthz on the
// port joined to an IP-only --healthz-bind-address, and /metrics not at
// all for --metrics-port=0; --write-config-to writes the address flags as
// given, without the ports, as kube-proxy's does, and says so. It wrote
// the addresses the ports led to.
func TestBinaryDeprecatedPortFlags(t *testing.T) {
	dir := t.TempDir()
	manifests := filepath.Join(dir, "services.yaml")
	writeFile(t, manifests, "apiVersion: v1\nkind: List\nitems: []\n")
	hp := freePort(t)
	args := []string{"--manifests", manifests, "--portal=none", "--bind-address=127.0.0.1",
		"--healthz-bind-address=127.0.0.1", fmt.Sprintf("--healthz-port=%d", hp), "--metrics-bind-address=127.0.0.1:1", "--metrics-port=0"}

	written := filepath.Join(dir, "written.yaml")
	w := startProxy(t, append(args, "--write-config-to", written)...)
	if code := exitCode(w.waitExit(10 * time.Second)); code != 0 {
		t.Fatalf("--write-config-to: exit status %d:\n%s", code, w.log())
	}
	data, err := os.ReadFile(written)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"healthzBindAddress: 127.0.0.1\n", "metricsBindAddress: 127.0.0.1:1\n"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the file does not hold %s:\n%s", strings.TrimSpace(want), data)
		}
	}
	if !strings.Contains(w.log(), "--write-config-to does not write it") {
		t.Errorf("the log does not say the port flags are not written:\n%s", w.log())
	}

	px := startProxy(t, args...)
	px.waitLog(0, fmt.Sprintf(`"Serving /healthz and /livez" addr="127.0.0.1:%d"`, hp), 1, 20*time.Second)
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", hp))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if strings.Contains(px.log(), "Serving /metrics") {
		t.Errorf("/metrics is served despite --metrics-port=0:\n%s", px.log())
	}
}
