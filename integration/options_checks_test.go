//go:build integration

package integration

import (
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
