//go:build integration && linux

package integration

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"
)

// TestBinaryAcceptContentTypes: as kube-proxy's, the API client sends the
// --config file's clientConnection.acceptContentTypes as its Accept
// header.
func TestBinaryAcceptContentTypes(t *testing.T) {
	accepts := make(chan string, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case accepts <- r.Header.Get("Accept"):
		default:
		}
		http.Error(w, "not a real API server", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	writeFile(t, kubeconfig, "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: "+srv.URL+"\n"+
		"contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n")
	config := filepath.Join(dir, "config.yaml")
	writeFile(t, config, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n"+
		"hostnameOverride: node\nhealthzBindAddress: 127.0.0.1:0\nmetricsBindAddress: 127.0.0.2:0\n"+
		"clientConnection:\n  kubeconfig: "+kubeconfig+"\n  contentType: application/json\n  acceptContentTypes: application/json;q=0.9\n")
	startProxy(t, "--config", config, "--portal=none")
	select {
	case a := <-accepts:
		if a != "application/json;q=0.9" {
			t.Errorf("Accept %q, want the file's application/json;q=0.9", a)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the proxy sent no request to the API server")
	}
}
