//go:build integration && linux

package integration

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
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

// TestBinaryRefusesUnusableConfigFiles: a --config file or kubeconfig that
// is a named pipe (whose read waited for a writer for ever, silent), a
// device (/dev/zero was read until Go ran out of memory) or a file over
// 4 MiB (read whole) is refused at start-up: the proxy exits 2 at once,
// naming the file and why (xa59).
func TestBinaryRefusesUnusableConfigFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n"
	big := filepath.Join(dir, "big.conf")
	writeFile(t, big, head+"#"+strings.Repeat("x", 4<<20)+"\n")
	namesFIFO := filepath.Join(dir, "names-fifo.conf")
	writeFile(t, namesFIFO, head+"clientConnection:\n  kubeconfig: "+fifo+"\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"--config a named pipe", []string{"--config", fifo}, "--config: " + fifo + ": not a regular file (a named pipe)"},
		{"--config the zero device", []string{"--config", "/dev/zero"}, "--config: /dev/zero: not a regular file (a character device)"},
		{"--config over 4 MiB", []string{"--config", big}, "--config: " + big + ": larger than 4 MiB"},
		{"--kubeconfig a named pipe", []string{"--kubeconfig", fifo}, "--kubeconfig: " + fifo + ": not a regular file (a named pipe)"},
		{"--config naming a named pipe as kubeconfig", []string{"--config", namesFIFO},
			"--config " + namesFIFO + ": clientConnection.kubeconfig: " + fifo + ": not a regular file (a named pipe)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := startProxy(t, append(tc.args, "--portal=none", "--hostname-override=node")...)
			err := px.waitExit(5 * time.Second)
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
				t.Errorf("exit %v, want status 2", err)
			}
			if !strings.Contains(px.log(), tc.want) {
				t.Errorf("the log does not say %q:\n%s", tc.want, px.log())
			}
		})
	}
}

// TestBinaryConfigWatchUnusableFile: the --config file replaced, while the
// proxy runs, by a named pipe left the watch waiting on it for ever: a
// usable new file later did not restart the proxy, and SIGTERM did not end
// it (xa59). Now that is said once, the proxy goes on with the options it
// has, and a new file later ends it as any change does, as SIGTERM does at
// once.
func TestBinaryConfigWatchUnusableFile(t *testing.T) {
	for _, then := range []string{"new content", "SIGTERM"} {
		t.Run("then "+then, func(t *testing.T) {
			dir := t.TempDir()
			manifests := filepath.Join(dir, "services.yaml")
			writeFile(t, manifests, "# no Services\n")
			config := filepath.Join(dir, "config.yaml")
			// Empty addresses in the file are kube-proxy's defaults: ports
			// of their own keep tests side by side apart.
			content := fmt.Sprintf("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n"+
				"healthzBindAddress: 127.0.0.1:%d\nmetricsBindAddress: 127.0.0.1:%d\n", freePort(t), freePort(t))
			writeFile(t, config, content)
			px := startProxy(t, "--config", config, "--manifests", manifests, "--portal=none", "-v=2")
			px.waitLog(0, `"Synced"`, 1, 20*time.Second)

			fifo := filepath.Join(dir, "fifo")
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				// Lets go of a reader left waiting on it, as one was.
				if f, err := os.OpenFile(config, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
			})
			if err := os.Rename(fifo, config); err != nil {
				t.Fatal(err)
			}
			refused := regexp.QuoteMeta(config + `: not a regular file (a named pipe)`)
			if !px.logged(refused, 10*time.Second) {
				t.Errorf("no log line matching %q within 10s", refused)
			}

			if then == "SIGTERM" {
				// Even when that was not said: the watch has read the
				// file by now, and once waited in that read for ever.
				if took, ok := px.terminate(5 * time.Second); !ok {
					t.Fatalf("still running %v after SIGTERM", took)
				}
				if px.err != nil {
					t.Errorf("exit %v after SIGTERM, want 0", px.err)
				}
				return
			}
			replaceFile(t, config, content+"portRange: 40000-40100\n")
			if err := px.waitExit(10 * time.Second); err == nil {
				t.Fatalf("exit 0 after the --config file changed:\n%s", px.log())
			}
			if !regexp.MustCompile(`"Stopping: the --config file changed".*has new content`).MatchString(px.log()) {
				t.Errorf("the log does not say why it stopped:\n%s", px.log())
			}
			if n := len(regexp.MustCompile(refused).FindAllString(px.log(), -1)); n != 1 {
				t.Errorf("said %d times that the file cannot be used, want once:\n%s", n, px.log())
			}
		})
	}
}

// logged waits up to timeout for a log line that matches re, and reports
// whether one came; unlike waitLog it lets the test go on without it.
func (p *proxyProc) logged(re string, timeout time.Duration) bool {
	rx := regexp.MustCompile(re)
	deadline := time.After(timeout)
	for {
		p.mu.Lock()
		found := slices.ContainsFunc(p.lines, rx.MatchString)
		ch := p.notify
		p.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-ch:
		case <-p.done:
			return false
		case <-deadline:
			return false
		}
	}
}
