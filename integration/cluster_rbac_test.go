//go:build integration && linux

package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"
)

// createNode creates node in the API server, deleted when the test ends.
func createNode(t *testing.T, c kubernetes.Interface, node *corev1.Node) {
	t.Helper()
	if _, err := c.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
}

// bindClusterRole creates a ClusterRole name with rules, bound to
// limitedUser, both deleted when the test ends.
func bindClusterRole(t *testing.T, c kubernetes.Interface, name string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	bindClusterRoleTo(t, c, limitedUser, name, rules...)
}

// bindClusterRoleTo is bindClusterRole for user.
func bindClusterRoleTo(t *testing.T, c kubernetes.Interface, user, name string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		c.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// TestBinaryForbiddenNodeSaysSo: when RBAC lets the proxy read Services
// and EndpointSlices but not its Node, the proxy says once, plainly, what
// is forbidden and what that means, serves the Services meanwhile (as
// kube-proxy does: the Node only gives topology labels), and reads the
// Node's labels as soon as a grant allows it, without a restart.
func TestBinaryForbiddenNodeSaysSo(t *testing.T) {
	t.Parallel() // it mostly waits on client-go (see doc.go)
	api := requireAPIServer(t)
	c := api.Client
	name := fmt.Sprintf("kup-rbac-%d", time.Now().UnixNano())
	grant := func(suffix string, rules ...rbacv1.PolicyRule) {
		t.Helper()
		bindClusterRole(t, c, name+suffix, rules...)
	}
	read := []string{"get", "list", "watch"}
	grant("-services",
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: read},
		rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read})

	kubeconfig := filepath.Join(t.TempDir(), "limited.kubeconfig")
	if err := api.kubeconfigFor(limitedToken, kubeconfig); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: "zone-rbac"}}}
	createNode(t, c, node)
	px := startProxy(t, "--kubeconfig", kubeconfig, "--portal=none", "--bind-address=127.0.0.1",
		noNodePorts, "--hostname-override="+name, "-v=2")
	// Reported once refused for refusalPersists (10 s): some 12-25 s.
	px.waitLog(0, `forbids reading what the proxy needs; meanwhile the Node's labels are not known, so topology hints are ignored, until RBAC allows it.*resource="nodes".*verbs="get,list,watch"`, 1, 60*time.Second)
	px.waitLog(0, `"This node's Node cannot be read yet; serving without its labels`, 1, 30*time.Second)
	px.waitLog(0, `"Synced"`, 1, 10*time.Second)

	grant("-nodes", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: read})
	// client-go retries a failed list with a backoff of up to 30 s.
	px.waitLog(0, fmt.Sprintf(`"Node labels changed" node="%s" zone="zone-rbac"`, name), 1, 60*time.Second)
	px.waitLog(0, `"The API server lets the proxy read again what it forbade" resource="nodes"`, 1, 10*time.Second)
	if n := strings.Count(px.log(), "forbids reading"); n != 1 {
		t.Errorf("said %d times that reading is forbidden, want once", n)
	}
}

// TestBinaryListWithoutWatchSaysSo: RBAC that lets the proxy list
// EndpointSlices but not watch them still serves them, from lists client-go
// repeats; the proxy says that once it persists, where it said nothing was
// served, naming the verbs the deploy ClusterRole grants. Once RBAC allows
// watch it says so.
func TestBinaryListWithoutWatchSaysSo(t *testing.T) {
	t.Parallel() // it mostly waits on client-go (see doc.go)
	api := requireAPIServer(t)
	c := api.Client
	name := fmt.Sprintf("kup-rbac-list-%d", time.Now().UnixNano())
	read := []string{"get", "list", "watch"}
	// Its own user: TestBinaryForbiddenNodeSaysSo, run alongside, lets
	// limitedUser watch EndpointSlices.
	bindClusterRoleTo(t, c, listOnlyUser, name,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: read},
		rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list"}})
	kubeconfig := filepath.Join(t.TempDir(), "limited.kubeconfig")
	if err := api.kubeconfigFor(listOnlyToken, kubeconfig); err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, "--kubeconfig", kubeconfig, "--portal=none", "--bind-address=127.0.0.1",
		noNodePorts, "--hostname-override="+name, "-v=2", "--healthz-bind-address=", "--metrics-bind-address=")
	const refusal = `"The API server lets the proxy list but not watch.*resource="endpointslices" apiGroup="discovery.k8s.io" verbs="list,watch"`
	px.waitLog(0, `"Synced"`, 1, 30*time.Second)
	// Reported once refused for refusalPersists (10 s): some 12-25 s.
	px.waitLog(0, refusal, 1, 60*time.Second)
	if strings.Contains(px.log(), "forbids reading") {
		t.Errorf("the proxy says reading is forbidden though it lists:\n%s", px.log())
	}

	bindClusterRoleTo(t, c, listOnlyUser, name+"-watch",
		rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"watch"}})
	// client-go retries with a back-off of up to a minute.
	px.waitLog(0, `"The API server lets the proxy watch again; changes are served as they come" resource="endpointslices"`, 1, 90*time.Second)
	if n := len(regexp.MustCompile(`lets the proxy list but not watch[^\n]*resource="services"`).FindAllString(px.log(), -1)); n != 0 {
		t.Errorf("reported %d times that Services cannot be watched, which RBAC allows:\n%s", n, px.log())
	}
	// That a watch refused again later is reported again is
	// TestClusterReportsOnlyPersistingWatchRefusals's (source/forbidden_test.go): here it
	// would take restarting the shared API server, since RBAC is checked
	// when a watch starts and the open one lasts 5-10 minutes.
}

// TestBinaryBriefWatchRefusalIsNoRBACProblem: a watch refused for a moment
// only (as a restarted API server refuses everything until it has loaded
// RBAC; here RBAC allows it right after the first refusal) is not
// reported as an RBAC problem: the proxy says it passed.
func TestBinaryBriefWatchRefusalIsNoRBACProblem(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	name := fmt.Sprintf("kup-rbac-brief-%d", time.Now().UnixNano())
	bindClusterRole(t, c, name,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: []string{"get", "list", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}})
	kubeconfig := filepath.Join(t.TempDir(), "limited.kubeconfig")
	if err := api.kubeconfigFor(limitedToken, kubeconfig); err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, "--kubeconfig", kubeconfig, "--portal=none", "--bind-address=127.0.0.1",
		noNodePorts, "--hostname-override="+name, "-v=2", "--healthz-bind-address=", "--metrics-bind-address=")
	px.waitLog(0, `"Failed to watch" err="endpointslices.* cannot watch resource`, 1, 30*time.Second)
	if strings.Contains(px.log(), "lets the proxy list but not watch") {
		t.Errorf("the first refusal of a watch was reported as an RBAC problem:\n%s", px.log())
	}
	bindClusterRole(t, c, name+"-watch",
		rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"watch"}})
	px.waitLog(0, `"The API server refused for a moment what it allows now.*resource="endpointslices".*verb="watch"`, 1, 30*time.Second)
	px.waitLog(0, `"Synced"`, 1, 30*time.Second)
	if strings.Contains(px.log(), "lets the proxy list but not watch") {
		t.Errorf("a watch refused for a moment was reported as an RBAC problem:\n%s", px.log())
	}
}

// TestBinaryNamesMissingNode: a --hostname-override (or host name) that no
// Node carries leaves the proxy with no local endpoints, without a word
// from the API server. The proxy says so once its caches have synced, and
// says nothing of the kind when the Node exists.
func TestBinaryNamesMissingNode(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	const report = "The API server has no Node of this name"
	base := []string{"--kubeconfig", api.Kubeconfig, "--portal=none", "--bind-address=127.0.0.1", noNodePorts}

	missing := fmt.Sprintf("kup-missing-%d", time.Now().UnixNano())
	px := startProxy(t, append(base, "--hostname-override="+missing)...)
	px.waitLog(0, `"Informer caches synced"`, 1, 60*time.Second)
	px.waitLog(0, report+`.*node="`+missing+`"`, 1, 10*time.Second)

	present := fmt.Sprintf("kup-present-%d", time.Now().UnixNano())
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: present}}
	createNode(t, c, node)
	px2 := startProxy(t, append(base, "--hostname-override="+present)...)
	px2.waitLog(0, `"Informer caches synced"`, 1, 60*time.Second)
	// The report would follow the sync line at once, written by the same
	// goroutine; half a second is plenty.
	time.Sleep(500 * time.Millisecond)
	if strings.Contains(px2.log(), report) {
		t.Errorf("reported a missing Node while %s exists:\n%s", present, px2.log())
	}
}

// TestBinarySaysCredentialsAreRefused: a token the API server does not
// know gets 401 on every request; the proxy says so once, plainly, with
// what to check, rather than only client-go's repeated errors.
func TestBinarySaysCredentialsAreRefused(t *testing.T) {
	api := requireAPIServer(t)
	kubeconfig := filepath.Join(t.TempDir(), "bad.kubeconfig")
	if err := api.kubeconfigFor("not-a-token-the-server-knows", kubeconfig); err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, "--kubeconfig", kubeconfig, "--portal=none", "--bind-address=127.0.0.1", noNodePorts)
	px.waitLog(0, `"The API server does not accept the proxy's credentials \(401 Unauthorized\)`, 1, 30*time.Second)
	// client-go retries the first lists within a second or two.
	px.waitLog(0, `Unauthorized`, 4, 30*time.Second)
	if n := strings.Count(px.log(), "does not accept the proxy's credentials"); n != 1 {
		t.Errorf("said %d times that the credentials are refused, want once", n)
	}
}

// TestBinaryHealthzFollowsNode: /healthz fails while this node's Node is
// going away (tainted ToBeDeletedByClusterAutoscaler, deleted), so load
// balancers drain it, as kube-proxy's does; /livez, a liveness probe's,
// stays 200 meanwhile.
func TestBinaryHealthzFollowsNode(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	ctx := context.Background()
	name := fmt.Sprintf("kup-healthz-%d", time.Now().UnixNano())
	createNode(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	hz := freePort(t)
	px := startProxy(t, "--kubeconfig", api.Kubeconfig, "--portal=none", "--bind-address=127.0.0.1", noNodePorts,
		"--hostname-override="+name, fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz))
	px.waitLog(0, `"Informer caches synced"`, 1, 60*time.Second)
	healthz, livez := fmt.Sprintf("http://127.0.0.1:%d/healthz", hz), fmt.Sprintf("http://127.0.0.1:%d/livez", hz)
	expect := func(url, code, inBody string) {
		t.Helper()
		var got, body string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if got, body = curlCode(t, url); got == code && strings.Contains(body, inBody) {
				return
			}
		}
		t.Fatalf("%s answered %s %q; want %s with %q within 10s", url, got, body, code, inBody)
	}
	expect(healthz, "200", `"nodeEligible":true`)

	setTaint := func(taints []corev1.Taint) {
		t.Helper()
		node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Spec.Taints = taints
		if _, err := c.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setTaint([]corev1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Value: "1700000000", Effect: corev1.TaintEffectNoSchedule}})
	expect(healthz, "503", `"nodeEligible":false`)
	expect(livez, "200", `"healthy":true`)
	px.waitLog(0, `"This node should take no load-balancer traffic now: /healthz answers 503" reason="its Node has the taint ToBeDeletedByClusterAutoscaler`, 1, 5*time.Second)

	setTaint(nil)
	expect(healthz, "200", `"nodeEligible":true`)

	if err := c.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(healthz, "503", `"reason":"its Node was deleted"`)
	expect(livez, "200", `"healthy":true`)
}

// TestBinaryKubeProxyConfigFile: the binary follows a cluster from a
// KubeProxyConfiguration file, as a kube-proxy DaemonSet's ConfigMap holds
// one, with mode: userspace: its clientConnection, hostnameOverride,
// healthz and metrics addresses, sync periods and portRange apply, and
// a flag the file stands for is ignored and said to be.
func TestBinaryKubeProxyConfigFile(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	ns := testNamespace(t, c)
	node := fmt.Sprintf("kup-config-%d", time.Now().UnixNano())
	createNode(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	createService(t, c, newService(ns, "web"))
	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.19.3.1")))
	hz, mp := freePort(t), freePort(t)
	base := freePort(t) / 10 * 10
	file := filepath.Join(t.TempDir(), "kube-proxy.yaml")
	writeFile(t, file, fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: userspace
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
nodePortAddresses: ["%s"]
portRange: "%d+99"
iptables: {syncPeriod: 20s, minSyncPeriod: 500ms}
clusterCIDR: 10.244.0.0/16
ipvs: {strictARP: true}
`, api.Kubeconfig, node, hz, mp, strings.Join(noNodePortCIDRs, `", "`), base))
	px := startProxy(t, "--config", file, "--portal=none", "--kubeconfig=/nonexistent")
	px.waitLog(0, `"Flags ignored: the --config file sets these instead, as in kube-proxy" flags=\[[^]]*"--kubeconfig"`, 1, 10*time.Second) // the harness adds its own
	px.waitLog(0, `"Settings of the --config file that a userspace proxy has no use for are ignored" fields=\["ipvs"\]`, 1, 10*time.Second)
	px.waitLog(0, `"Starting kube-userspace-proxy" node="`+node+`"`, 1, 10*time.Second)
	px.waitLog(0, `"Serving" service="`+ns+`/web:http/TCP"`, 1, 60*time.Second)
	m := regexp.MustCompile(`"Serving" service="` + ns + `/web:http/TCP" addr="127.0.0.1:(\d+)"`).FindStringSubmatch(px.log())
	if pp, _ := strconv.Atoi(m[1]); pp < base || pp > base+99 {
		t.Errorf("proxy port %d, want one of portRange %d+99", pp, base)
	}
	if code, body := curlCode(t, fmt.Sprintf("http://127.0.0.1:%d/healthz", hz)); code != "200" || !strings.Contains(body, `"healthy":true`) {
		t.Errorf("/healthz on the file's address: %s %s", code, body)
	}
	if code, body := curlCode(t, fmt.Sprintf("http://127.0.0.1:%d/proxyMode", mp)); code != "200" || body != "userspace" {
		t.Errorf("/proxyMode on the file's metrics address: %s %q", code, body)
	}
}

// TestDeployRoleSuffices: the ClusterRole that deploy/kube-userspace-proxy.yaml
// ships, given to a user of its own, lets the proxy do all it does against
// a real API server: follow Services, EndpointSlices and its Node, and read
// the Node's primary IPs for --nodeport-addresses=primary, without a
// forbidden request. It grants reading only: list and watch, and get on
// Nodes alone, as kube-proxy's system:node-proxier role does (get on
// Services and EndpointSlices was granted and never used).
func TestDeployRoleSuffices(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	role := deployClusterRole(t)
	for _, r := range role.Rules {
		for _, v := range r.Verbs {
			if v != "list" && v != "watch" && (v != "get" || !slices.Equal(r.Resources, []string{"nodes"})) {
				t.Errorf("the deploy ClusterRole grants %q on %v; the proxy only lists and watches, and gets its Node", v, r.Resources)
			}
		}
	}
	name := fmt.Sprintf("kup-deploy-role-%d", time.Now().UnixNano())
	bindClusterRole(t, c, name, role.Rules...)
	createNode(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: "zone-deploy"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.18.10.1"}}}})
	ns := testNamespace(t, c)
	createService(t, c, newService(ns, "web"))
	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.18.12.2")))

	kubeconfig := filepath.Join(t.TempDir(), "limited.kubeconfig")
	if err := api.kubeconfigFor(limitedToken, kubeconfig); err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, "--kubeconfig", kubeconfig, "--portal=none", "--bind-address=127.0.0.1",
		"--nodeport-addresses=primary", "--hostname-override="+name, "-v=2")
	px.waitLog(0, `"Node ports are served on this node's primary IPs.*from="Node `+name+`"`, 1, 60*time.Second)
	px.waitLog(0, `"Serving" service="`+ns+`/web:http/TCP"`, 1, 60*time.Second)
	px.waitLog(0, `"Node labels changed" node="`+name+`" zone="zone-deploy"`, 1, 30*time.Second)
	if log := px.log(); strings.Contains(log, "forbid") || strings.Contains(log, "Forbidden") {
		t.Errorf("the proxy was forbidden something under the deploy ClusterRole:\n%s", log)
	}
}

// deployClusterRole reads the ClusterRole of deploy/kube-userspace-proxy.yaml.
func deployClusterRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	data, err := os.ReadFile("../deploy/kube-userspace-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if err != nil {
			t.Fatalf("no ClusterRole in deploy/kube-userspace-proxy.yaml: %v", err)
		}
		var role rbacv1.ClusterRole
		if err := sigsyaml.Unmarshal(doc, &role); err == nil && role.Kind == "ClusterRole" {
			return &role
		}
	}
}
