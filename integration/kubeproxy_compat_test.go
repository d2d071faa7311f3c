//go:build integration

package integration

import (
	"path/filepath"
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
	config := filepath.Join(dir, "config.yaml")
	writeFile(t, config, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\nclientConnection:\n  kubeconfig: /nonexistent/kubeconfig\n")
	// No API server, no kubeconfig: nothing may be reached for.
	px := startProxy(t, "--init-only", "--config", config, "--portal=none")
	if err := px.waitExit(10 * time.Second); err != nil {
		t.Fatalf("--init-only: exit status %v, want 0\n%s", err, px.log())
	}
	if !strings.Contains(px.log(), "--init-only: nothing needs privileged set-up") {
		t.Errorf("no line saying why it exits:\n%s", px.log())
	}
	if strings.Contains(px.log(), "Starting kube-userspace-proxy") {
		t.Errorf("--init-only started the proxy:\n%s", px.log())
	}

	bad := startProxy(t, "--init-only", "--config", config, "--portal=nowhere")
	if err := bad.waitExit(10 * time.Second); err == nil {
		t.Fatalf("--init-only with a bad --portal exited 0:\n%s", bad.log())
	}
}
