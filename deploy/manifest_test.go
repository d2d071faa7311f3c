package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/proxyserver"
)

// TestManifestsDecodeStrictly catches typos and misplaced fields: every
// document must decode, with unknown fields rejected, as a known type.
func TestManifestsDecodeStrictly(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	dec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	data, err := os.ReadFile("kube-userspace-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	kinds := map[string]int{}
	var config string // the ConfigMap's config.conf
	var command []string
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		kinds[gvk.Kind]++
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			config = cm.Data["config.conf"]
		}
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			c := ds.Spec.Template.Spec.Containers[0]
			if !ds.Spec.Template.Spec.HostNetwork {
				t.Error("the DaemonSet must use the host network: portals live there")
			}
			if ds.Spec.Template.Spec.ServiceAccountName != "kube-userspace-proxy" {
				t.Errorf("service account %q", ds.Spec.Template.Spec.ServiceAccountName)
			}
			if len(c.Command) == 0 || c.Command[0] != "/kube-userspace-proxy" {
				t.Fatalf("command %v", c.Command)
			}
			command = c.Command
		}
	}
	// Every flag the DaemonSet passes must exist, and with the ConfigMap's
	// file, validate.
	file := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := proxyserver.NewConfig()
	fs := pflag.NewFlagSet("daemonset", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	fs.IntP("v", "v", 0, "klog verbosity, registered by main")
	if err := fs.Parse(append(command[1:], "--config="+file)); err != nil {
		t.Errorf("DaemonSet flags: %v", err)
	} else if err := cfg.LoadConfigFile(fs); err != nil {
		t.Errorf("the ConfigMap's file: %v", err)
	} else if err := cfg.Validate(); err != nil {
		t.Errorf("DaemonSet flags and file do not validate: %v", err)
	} else if cfg.ProxyPortRange != "36000-37999" {
		t.Errorf("proxy port range %q, want the file's", cfg.ProxyPortRange)
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s documents, want 1 (all: %v)", kinds[k], k, kinds)
		}
	}
}
