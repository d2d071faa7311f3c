//go:build integration

package integration

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// configMapVolume lays out a ConfigMap volume in dir as the kubelet does
// (name -> ..data/name, ..data -> ..version) and, on later calls, swaps
// ..data to a new version atomically, as the kubelet's update does.
func configMapVolume(t *testing.T, dir, version string, files map[string]string) {
	t.Helper()
	v := filepath.Join(dir, ".."+version)
	if err := os.Mkdir(v, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		writeFile(t, filepath.Join(v, name), content)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(".."+version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		_ = os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)) // exists after the first
	}
}

// TestBinaryExitsWhenKubeconfigChanges: the kubeconfig the --config file
// names (clientConnection.kubeconfig), in the same ConfigMap as kube-proxy's
// DaemonSet ships it, is watched as the file is: a ConfigMap update that
// changes only it (a fixed server address) ends the proxy with an error
// that says why, so that its DaemonSet restarts it with the new content.
// (client-go reads the kubeconfig once: otherwise the proxy stays with the
// old server, never ready.)
func TestBinaryExitsWhenKubeconfigChanges(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not a real API server", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	kubeconfig := func(server string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: %s\n"+
			"contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n", server)
	}
	dir := t.TempDir()
	config := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n" +
		"healthzBindAddress: \"\"\nmetricsBindAddress: \"\"\nclientConnection:\n  kubeconfig: " + filepath.Join(dir, "kubeconfig.conf") + "\n"
	configMapVolume(t, dir, "v1", map[string]string{"config.conf": config, "kubeconfig.conf": kubeconfig("http://127.0.0.1:9")})
	px := startProxy(t, "--config", filepath.Join(dir, "config.conf"), "--portal=none", "--hostname-override=node")
	px.waitLog(0, `"Starting kube-userspace-proxy"`, 1, 20*time.Second)
	// An update that leaves both as they were changes nothing.
	configMapVolume(t, dir, "v2", map[string]string{"config.conf": config, "kubeconfig.conf": kubeconfig("http://127.0.0.1:9")})
	select {
	case <-px.done:
		t.Fatalf("exited (%v) after an update that changed nothing:\n%s", px.err, px.log())
	case <-time.After(2 * time.Second):
	}
	configMapVolume(t, dir, "v3", map[string]string{"config.conf": config, "kubeconfig.conf": kubeconfig(srv.URL)})
	err := px.waitExit(10 * time.Second)
	if err == nil {
		t.Fatalf("exit 0 after the kubeconfig changed; want an error, for the DaemonSet to restart it:\n%s", px.log())
	}
	if !regexp.MustCompile(`"Stopping: the kubeconfig the --config file names changed".*kubeconfig.conf has new content`).MatchString(px.log()) {
		t.Errorf("the log does not say why it stopped:\n%s", px.log())
	}
}

// TestBinaryConfigWatchRewriteAndReplacedDir: a slow rewrite of the same
// content (truncated, then written 0.3 s later) changes nothing; after
// the file's directory is replaced (mv dir dir.old; mv dir.new dir), an
// edit of the file there is still seen at once, not at the minute's
// resync.
func TestBinaryConfigWatchRewriteAndReplacedDir(t *testing.T) {
	dir := t.TempDir()
	manifests := filepath.Join(dir, "services.yaml")
	writeFile(t, manifests, "# no Services\n")
	confDir := filepath.Join(dir, "conf")
	if err := os.Mkdir(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(confDir, "config.yaml")
	content := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\nhealthzBindAddress: \"\"\nmetricsBindAddress: \"\"\n"
	writeFile(t, config, content)
	px := startProxy(t, "--config", config, "--manifests", manifests, "--portal=none", "-v=2")
	px.waitLog(0, `"Synced"`, 1, 20*time.Second)

	f, err := os.OpenFile(config, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	f.Close()
	select {
	case <-px.done:
		t.Fatalf("exited (%v) after a slow rewrite of the same content:\n%s", px.err, px.log())
	case <-time.After(2 * time.Second):
	}

	if err := os.Mkdir(confDir+".new", 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(confDir+".new", "config.yaml"), content)
	if err := os.Rename(confDir, confDir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(confDir+".new", confDir); err != nil {
		t.Fatal(err)
	}
	select {
	case <-px.done:
		t.Fatalf("exited (%v) after its directory was replaced with the same content:\n%s", px.err, px.log())
	case <-time.After(2 * time.Second):
	}
	writeFile(t, config, content+"portRange: 40000-40100\n")
	if err := px.waitExit(10 * time.Second); err == nil {
		t.Fatalf("exit 0 after the --config file changed:\n%s", px.log())
	}
	if !regexp.MustCompile(`"Stopping: the --config file changed".*has new content`).MatchString(px.log()) {
		t.Errorf("the log does not say why it stopped:\n%s", px.log())
	}
}
