package proxyserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadKubeconfig: what the API client would refuse at once is found
// before the proxy starts (and by --init-only), a server URL that does not
// parse among it, without contacting the server.
func TestLoadKubeconfig(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := func(server string) string {
		path := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_", " ", "_").Replace(server))
		data := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \"" + server + "\"\n" +
			"contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n"
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := kubeconfig("http://127.0.0.1:9") // nobody listens: it must not be reached for
	bad := kubeconfig("ht tp://x")
	for _, tc := range []struct {
		name, kubeconfig, master string
		want                     string // in the error; "" for none
	}{
		{"good", good, "", ""},
		{"good, with --master", good, "https://192.0.2.1:6443", ""},
		{"--master alone", "", "https://192.0.2.1:6443", ""},
		{"server URL that does not parse", bad, "", "--kubeconfig " + bad + ": "},
		{"--master that does not parse", good, "ht tp://x", "--kubeconfig " + good + " with --master ht tp://x: "},
		{"--master alone that does not parse", "", "ht tp://x", "--master ht tp://x: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewConfig()
			c.Kubeconfig, c.Master = tc.kubeconfig, tc.master
			err := c.LoadKubeconfig()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one with %q", err, tc.want)
			}
			if err == nil && (tc.kubeconfig != "") != (c.kubeconfigData != nil) {
				t.Errorf("kubeconfig read: %v, want %v", c.kubeconfigData != nil, tc.kubeconfig != "")
			}
		})
	}
}
