package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"

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
	var config, kubeconfig string // the ConfigMap's config.conf and kubeconfig.conf
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
			config, kubeconfig = cm.Data["config.conf"], cm.Data["kubeconfig.conf"]
		}
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			c := ds.Spec.Template.Spec.Containers[0]
			if !ds.Spec.Template.Spec.HostNetwork {
				t.Error("the DaemonSet must use the host network: portals live there")
			}
			if ds.Spec.Template.Spec.ServiceAccountName != "kube-userspace-proxy" {
				t.Errorf("service account %q", ds.Spec.Template.Spec.ServiceAccountName)
			}
			if os := ds.Spec.Template.Spec.NodeSelector["kubernetes.io/os"]; os != "linux" {
				t.Errorf("node selector kubernetes.io/os=%q, want linux: the image is a Linux build", os)
			}
			if len(c.Command) == 0 || c.Command[0] != "/kube-userspace-proxy" {
				t.Fatalf("command %v", c.Command)
			}
			command = c.Command
			if sc := c.SecurityContext; sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
				!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN", "NET_RAW", "NET_BIND_SERVICE"}) {
				t.Errorf("security context %+v: want every capability dropped but NET_ADMIN, NET_RAW and NET_BIND_SERVICE", sc)
			}
			// Added capabilities reach a non-root user's process only as
			// inheritable ones: an image with a non-root USER would run
			// without NET_ADMIN.
			if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
				t.Errorf("security context %+v: want runAsUser: 0, or the added capabilities are lost to a non-root image user", sc)
			}
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
	} else if cfg.Kubeconfig != "/var/lib/kube-userspace-proxy/kubeconfig.conf" {
		// The in-cluster configuration would reach the API server through
		// the kubernetes Service, which only this proxy serves.
		t.Errorf("clientConnection.kubeconfig %q, want the ConfigMap's kubeconfig.conf where the DaemonSet mounts it", cfg.Kubeconfig)
	}
	kc, err := clientcmd.Load([]byte(kubeconfig))
	if err != nil {
		t.Fatalf("the ConfigMap's kubeconfig.conf: %v", err)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	if ctx == nil || kc.Clusters[ctx.Cluster] == nil || kc.AuthInfos[ctx.AuthInfo] == nil {
		t.Fatalf("kubeconfig.conf: current context %q does not name a cluster and a user", kc.CurrentContext)
	}
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
	if cl, user := kc.Clusters[ctx.Cluster], kc.AuthInfos[ctx.AuthInfo]; cl.CertificateAuthority != sa+"ca.crt" || user.TokenFile != sa+"token" ||
		!strings.HasPrefix(cl.Server, "https://") {
		t.Errorf("kubeconfig.conf: server %q, CA %q, token %q; want an https server and the ServiceAccount's CA and token", cl.Server, cl.CertificateAuthority, user.TokenFile)
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s documents, want 1 (all: %v)", kinds[k], k, kinds)
		}
	}
}
