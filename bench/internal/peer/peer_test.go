package peer

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var (
	testFront = Addrs{Echo: "127.0.0.1:30001", Bulk: "127.0.0.1:30002", UDP: "127.0.0.1:30003"}
	testBack  = Addrs{Echo: "127.0.0.1:31001", Bulk: "127.0.0.1:31002", UDP: "127.0.0.1:31003"}
)

func TestManifests(t *testing.T) {
	got, err := manifests(testFront, testBack)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"kind: Service",
		"type: NodePort",
		"- {name: echo, port: 7, protocol: TCP, nodePort: 30001}",
		"- {name: bulk, port: 9, protocol: TCP, nodePort: 30002}",
		"- {name: udp, port: 7, protocol: UDP, nodePort: 30003}",
		"kind: EndpointSlice",
		"labels: {kubernetes.io/service-name: bench}",
		"- {name: echo, port: 31001, protocol: TCP}",
		"- {name: udp, port: 31003, protocol: UDP}",
		`- addresses: ["127.0.0.1"]`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("manifests lack %q:\n%s", want, got)
		}
	}
}

func TestHAProxyConfig(t *testing.T) {
	got := haproxyConfig(testFront, testBack)
	for _, want := range []string{
		"mode tcp",
		"option splice-auto",
		"bind 127.0.0.1:30001",
		"server echo 127.0.0.1:31001",
		"bind 127.0.0.1:30002",
		"server bulk 127.0.0.1:31002",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("haproxy config lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "30003") {
		t.Errorf("haproxy config proxies UDP:\n%s", got)
	}
}

func TestNginxConfig(t *testing.T) {
	got := nginxConfig(testFront, testBack, "/tmp/x", "load_module /m.so;", false)
	for _, want := range []string{
		"load_module /m.so;",
		"daemon off;",
		"pid /tmp/x/nginx.pid;",
		"listen 127.0.0.1:30001 backlog=4096;",
		"proxy_pass 127.0.0.1:31001;",
		"listen 127.0.0.1:30003 udp;",
		"proxy_pass 127.0.0.1:31003;",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("nginx config lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "proxy_half_close") {
		t.Errorf("plain nginx config passes half-closes on:\n%s", got)
	}
	if got := nginxConfig(testFront, testBack, "/tmp/x", "", true); !strings.Contains(got, "\tproxy_half_close on;\n") {
		t.Errorf("nginx-halfclose config lacks proxy_half_close on:\n%s", got)
	}
}

func TestSocatArgs(t *testing.T) {
	got, err := socatArgs(testFront.Echo, testBack.Echo)
	if err != nil {
		t.Fatal(err)
	}
	want := "socat TCP4-LISTEN:30001,bind=127.0.0.1,reuseaddr,fork,backlog=4096 TCP4:127.0.0.1:31001"
	if strings.Join(got, " ") != want {
		t.Fatalf("socatArgs = %q, want %q", strings.Join(got, " "), want)
	}
}

// TestVersionOfOurBuilds: each of our two peers reports the version of
// its own program, as `--version` prints it.
func TestVersionOfOurBuilds(t *testing.T) {
	dir := t.TempDir()
	prog := func(name, version string) string {
		path := filepath.Join(dir, name)
		script := "#!/bin/sh\necho 'kube-userspace-proxy " + version + " commit 0123456789ab go1.26 linux/amd64, event loops'\n"
		if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return path
	}
	env := Env{ProxyBin: prog("tree", "ce92303-dirty"), BaseProxyBin: prog("base", "c3d5c44")}
	for name, want := range map[string]string{Ours: "ce92303-dirty", OursBase: "c3d5c44"} {
		if got := Version(context.Background(), name, env); got != want {
			t.Errorf("Version(%s) = %q, want %q", name, got, want)
		}
	}
	if got := Version(context.Background(), OursBase, Env{ProxyBin: env.ProxyBin}); got != "" {
		t.Errorf("Version(%s) without its program = %q, want none", OursBase, got)
	}
}
