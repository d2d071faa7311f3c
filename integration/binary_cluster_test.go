//go:build integration && linux

package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/source"
)

// The real binary following the real API server, in the node namespace of
// a test world, with the iptables portal, reached by real clients from the
// pod namespace; backends in the backend namespace at 198.18.12.2.
//
// The API server listens on the host's loopback, which a network namespace
// cannot reach. A relay carries the connections: the node namespace's
// 127.0.0.1:6443 to a Unix socket (Unix sockets live in the file system,
// not in a network namespace) to the API server's port. TLS passes through
// untouched, and the serving certificate is for 127.0.0.1 either way.

// runRelay is the node side: 127.0.0.1:port in this namespace to a Unix
// socket.
func runRelay(listen, unixPath string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			u, err := net.Dial("unix", unixPath)
			if err != nil {
				c.Close()
				return
			}
			splice(c, u)
		}()
	}
}

// splice copies both ways and closes both when either side ends.
func splice(a, b net.Conn) {
	var once sync.Once
	done := func() { once.Do(func() { a.Close(); b.Close() }) }
	go func() { io.Copy(a, b); done() }()
	io.Copy(b, a)
	done()
}

// relayAPIServer makes the API server reachable at 127.0.0.1:6443 inside
// ns and returns a kubeconfig that points there.
func relayAPIServer(t *testing.T, api *apiServer, ns netns) string {
	t.Helper()
	u, err := url.Parse(api.URL)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "api.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ul.Close() })
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			go func() {
				s, err := net.Dial("tcp", u.Host)
				if err != nil {
					c.Close()
					return
				}
				splice(c, s)
			}()
		}
	}()
	h := startHelper(t, ns, "relay", "KUPT_LISTEN=127.0.0.1:6443", "KUPT_UNIX="+sock)
	if l := h.line(10 * time.Second); l != "ready" {
		t.Fatalf("relay said %q", l)
	}
	cfg, err := clientcmd.LoadFromFile(api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://127.0.0.1:6443"
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// eventually retries a client exchange until it gives a reply with prefix
// (changes reach the proxy asynchronously), bounded.
func eventually(t *testing.T, ns netns, proto, addr, prefix string) {
	t.Helper()
	var r clientResult
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r = dial(t, ns, proto, addr, "ping", 0); r.Err == "" && strings.HasPrefix(r.Reply, prefix) {
			return
		}
	}
	t.Fatalf("%s %s from %s: %+v, want a reply starting %q within 15s", proto, addr, ns, r, prefix)
}

// eventuallyNot retries until the address stops answering, bounded.
func eventuallyNot(t *testing.T, ns netns, proto, addr string) {
	t.Helper()
	var r clientResult
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r = dial(t, ns, proto, addr, "ping", 0); r.Err != "" {
			return
		}
	}
	t.Fatalf("%s %s from %s still answers %q after 15s", proto, addr, ns, r.Reply)
}

// changeCounts are kube-proxy's change totals as /metrics shows them.
type changeCounts struct{ services, endpoints int }

// waitChangesSynced waits, bounded, until the proxy's /metrics in ns
// counts at least least changes and none pending, and returns the totals.
func waitChangesSynced(t *testing.T, ns netns, least changeCounts) changeCounts {
	t.Helper()
	value := func(body, name string) int {
		m := regexp.MustCompile(`\nkubeproxy_sync_proxy_rules_` + name + ` (\d+)\n`).FindStringSubmatch(body)
		if m == nil {
			return -1
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	var body string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, body = curlCodeIn(t, ns, "http://127.0.0.1:10249/metrics")
		got := changeCounts{value(body, "service_changes_total"), value(body, "endpoint_changes_total")}
		if got.services >= least.services && got.endpoints >= least.endpoints &&
			value(body, "service_changes_pending") == 0 && value(body, "endpoint_changes_pending") == 0 {
			return got
		}
	}
	t.Fatalf("/metrics: want at least %d Service and %d endpoint changes and none pending within 15s; got\n%s",
		least.services, least.endpoints, regexp.MustCompile(`(?m)^kubeproxy_sync_proxy_rules_\w+_changes_\w+ .*$`).FindAllString(body, -1))
	return changeCounts{}
}

func TestBinaryFollowsCluster(t *testing.T) {
	api := requireAPIServer(t)
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be2")
	kubeconfig := relayAPIServer(t, api, w.node)
	c := api.Client
	ns := testNamespace(t, c)

	px := startCommand(t, "ip", "netns", "exec", string(w.node), proxyBin, "--kubeconfig", kubeconfig,
		"--portal=iptables", "--hostname-override=node", "-v=2")
	px.waitLog(0, `"Portals synced"`, 1, 60*time.Second)
	before := waitChangesSynced(t, w.node, changeCounts{})

	const vip = "198.18.0.60:80"
	createService(t, c, newService(ns, "web", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.60" }))
	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.18.12.2")))
	t.Run("a new service answers", func(t *testing.T) { eventually(t, w.pod, "tcp", vip, "be1:") })
	// kube-proxy's change counts: the new Service is a Service change
	// and an endpoint change, synced.
	afterCreate := waitChangesSynced(t, w.node, changeCounts{before.services + 1, before.endpoints + 1})

	// No connection may fail while endpoints come and go: a removed
	// endpoint's backend is still up, so a failure would be the proxy's.
	noFailure := func(t *testing.T, until func(r clientResult) bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
			r := dial(t, w.pod, "tcp", vip, "ping", 0)
			if r.Err != "" {
				t.Fatalf("a connection failed while endpoints changed: %+v", r)
			}
			if until(r) {
				return
			}
		}
		t.Fatal("the change did not reach traffic within 15s")
	}

	t.Run("scaling up adds an endpoint", func(t *testing.T) {
		s := newSlice(ns, "web", "web-2", readyEP("198.18.12.2"))
		port := int32(8081)
		s.Ports[0].Port = &port
		// As the EndpointSlice controller marks it: the network
		// programming latency runs from here.
		s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
		putSlice(t, c, s)
		noFailure(t, func(r clientResult) bool { return strings.HasPrefix(r.Reply, "be2:") })
		eventually(t, w.pod, "tcp", vip, "be1:")
		code, body := curlCodeIn(t, w.node, "http://127.0.0.1:10249/metrics")
		count := regexp.MustCompile(`\nkubeproxy_network_programming_duration_seconds_count\{ip_family="IPv4"\} (\d+)\n`).FindStringSubmatch(body)
		sum := regexp.MustCompile(`\nkubeproxy_network_programming_duration_seconds_sum\{ip_family="IPv4"\} ([0-9.e+-]+)\n`).FindStringSubmatch(body)
		if code != "200" || count == nil || count[1] != "1" || sum == nil {
			t.Fatalf("/metrics: %s, programming latency count %v, sum %v", code, count, sum)
		}
		if v, _ := strconv.ParseFloat(sum[1], 64); v <= 0 || v > 15 {
			t.Errorf("network programming latency %v s, want above 0 and below the 15 s the change took at most to reach traffic", v)
		}
		// The slice is IPv4: kube-proxy's IPv6 proxier never sees it.
		if v6 := regexp.MustCompile(`\nkubeproxy_network_programming_duration_seconds_count\{ip_family="IPv6"\} (\d+)\n`).FindStringSubmatch(body); v6 == nil || v6[1] != "0" {
			t.Errorf("/metrics: IPv6 programming latency count %v, want 0 for an IPv4 slice's change", v6)
		}
	})

	t.Run("ClientIP affinity pins the client", func(t *testing.T) {
		updateService(t, c, ns, "web", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP })
		// Wait until two requests in a row agree, then expect the rest to.
		var first string
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
			a, b := dial(t, w.pod, "tcp", vip, "ping", 0), dial(t, w.pod, "tcp", vip, "ping", 0)
			if a.Err == "" && a.Reply == b.Reply {
				first = a.Reply
				break
			}
		}
		for range 6 {
			if r := dial(t, w.pod, "tcp", vip, "ping", 0); r.Reply != first {
				t.Fatalf("affinity: %q then %q", first, r.Reply)
			}
		}
	})

	t.Run("the changes are counted and synced", func(t *testing.T) {
		// Since the create: a slice added (scaling up), an endpoint
		// change; affinity set, a Service change.
		got := waitChangesSynced(t, w.node, changeCounts{afterCreate.services + 1, afterCreate.endpoints + 1})
		t.Logf("change totals (Services, endpoints): %v at start, %v after the create, %v now; none pending", before, afterCreate, got)
	})

	t.Run("the affinity timeout follows the service", func(t *testing.T) {
		timeout := int32(2)
		updateService(t, c, ns, "web", func(s *corev1.Service) {
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
		})
		time.Sleep(3 * time.Second) // the change lands, and any older pin expires
		first := dial(t, w.pod, "tcp", vip, "ping", 0)
		if again := dial(t, w.pod, "tcp", vip, "ping", 0); first.Err != "" || again.Reply != first.Reply {
			t.Fatalf("not pinned: %+v then %+v", first, again)
		}
		time.Sleep(2500 * time.Millisecond) // past the 2 s timeout
		// Expired: round robin moves on to the other endpoint.
		if next := dial(t, w.pod, "tcp", vip, "ping", 0); next.Err != "" || next.Reply == first.Reply {
			t.Fatalf("after the 2s timeout the client still went to %q", next.Reply)
		}
	})

	t.Run("affinity off round-robins again", func(t *testing.T) {
		updateService(t, c, ns, "web", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityNone
			s.Spec.SessionAffinityConfig = nil
		})
		eventually(t, w.pod, "tcp", vip, "be2:")
		eventually(t, w.pod, "tcp", vip, "be1:")
		allAlternate := true
		prev := ""
		for range 6 {
			r := dial(t, w.pod, "tcp", vip, "ping", 0)
			if r.Reply == prev {
				allAlternate = false
			}
			prev = r.Reply
		}
		if !allAlternate {
			t.Fatal("with affinity off, round robin over two endpoints gave the same one twice in a row")
		}
	})

	t.Run("scaling down removes the endpoint", func(t *testing.T) {
		if err := c.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "web-2", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// Round robin over two endpoints never gives six be1 replies in a
		// row; once the removal lands, every reply is be1's.
		run := 0
		noFailure(t, func(r clientResult) bool {
			if strings.HasPrefix(r.Reply, "be1:") {
				run++
			} else {
				run = 0
			}
			return run == 6
		})
	})

	t.Run("the service-proxy-name label hides the service", func(t *testing.T) {
		updateService(t, c, ns, "web", func(s *corev1.Service) {
			s.Labels = map[string]string{source.LabelServiceProxyName: "someone-else"}
		})
		eventuallyNot(t, w.pod, "tcp", vip)
		updateService(t, c, ns, "web", func(s *corev1.Service) { s.Labels = nil })
		eventually(t, w.pod, "tcp", vip, "be1:")
	})

	t.Run("a deleted service stops answering", func(t *testing.T) {
		if err := c.CoreV1().Services(ns).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventuallyNot(t, w.pod, "tcp", vip)
	})
}

// allFrom sends n connections and reports whether every reply starts with
// prefix, retrying (bounded) until the proxy has the state the test set.
func allFrom(t *testing.T, ns netns, proto, addr, prefix string, n int) {
	t.Helper()
	run := 0
	var last clientResult
	for deadline := time.Now().Add(15 * time.Second); run < n && time.Now().Before(deadline); {
		if last = dial(t, ns, proto, addr, "ping", 0); last.Err == "" && strings.HasPrefix(last.Reply, prefix) {
			run++
		} else {
			run = 0
			time.Sleep(50 * time.Millisecond)
		}
	}
	if run < n {
		t.Fatalf("%s %s from %s: want %d replies in a row from %q, last %+v", proto, addr, ns, n, prefix, last)
	}
}

// TestBinaryClusterSemantics drives the real binary through the cases
// where kube-proxy's semantics decide which endpoints get traffic.
func TestBinaryClusterSemantics(t *testing.T) {
	api := requireAPIServer(t)
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be2")
	kubeconfig := relayAPIServer(t, api, w.node)
	c := api.Client
	ns := testNamespace(t, c)
	px := startCommand(t, "ip", "netns", "exec", string(w.node), proxyBin, "--kubeconfig", kubeconfig,
		"--portal=iptables", "--hostname-override=node", "-v=2")
	px.waitLog(0, `"Portals synced"`, 1, 60*time.Second)

	// One endpoint on this node (be1, port 8080) and one elsewhere (be2,
	// port 8081), in two slices.
	slices := func(svc string, local, remote ep) {
		t.Helper()
		putSlice(t, c, newSlice(ns, svc, svc+"-1", local))
		s := newSlice(ns, svc, svc+"-2", remote)
		port := int32(8081)
		s.Ports[0].Port = &port
		putSlice(t, c, s)
	}
	onNode := func(node string) ep { e := readyEP("198.18.12.2"); e.node = node; return e }

	t.Run("terminating-only endpoints still answer", func(t *testing.T) {
		createService(t, c, newService(ns, "term", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.61" }))
		putSlice(t, c, newSlice(ns, "term", "term-1", ep{addr: "198.18.12.2", serving: true, terminating: true}))
		eventually(t, w.pod, "tcp", "198.18.0.61:80", "be1:")
	})

	t.Run("internalTrafficPolicy Local uses this node's endpoints", func(t *testing.T) {
		createService(t, c, newService(ns, "itp", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.62" }))
		slices("itp", onNode("node"), onNode("other"))
		eventually(t, w.pod, "tcp", "198.18.0.62:80", "be2:") // both endpoints are in
		local := corev1.ServiceInternalTrafficPolicyLocal
		updateService(t, c, ns, "itp", func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = &local })
		allFrom(t, w.pod, "tcp", "198.18.0.62:80", "be1:", 8)
	})

	t.Run("externalTrafficPolicy Local: node ports use this node's endpoints", func(t *testing.T) {
		createService(t, c, newService(ns, "etp", func(s *corev1.Service) {
			s.Spec.ClusterIP = "198.18.0.63"
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.Ports[0].NodePort = 30063
		}))
		slices("etp", onNode("node"), onNode("other"))
		// Cluster traffic reaches both endpoints; node-port traffic only
		// this node's.
		eventually(t, w.pod, "tcp", "198.18.0.63:80", "be2:")
		allFrom(t, w.outside, "tcp", nodeOutSide+":30063", "be1:", 8)
	})

	// Its only slice deleted, the etp Service has no endpoint anywhere:
	// the portal refuses its clients (REJECT), and the log and
	// /debug/services say so, where they said "reset" and "dropped (the
	// portal's DROP rule)".
	t.Run("a Service without endpoints is said to be refused", func(t *testing.T) {
		createService(t, c, newService(ns, "gone", func(s *corev1.Service) {
			s.Spec.ClusterIP = "198.18.0.69"
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.Ports[0].NodePort = 30066
		}))
		putSlice(t, c, newSlice(ns, "gone", "gone-1", onNode("node")))
		eventually(t, w.outside, "tcp", nodeOutSide+":30066", "be1:")
		from := px.lineCount()
		if err := c.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "gone-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		px.waitLog(from, regexp.QuoteMeta(`"Service port has no endpoints now; new connections are refused (the portal's REJECT rule), as kube-proxy refuses them" service="`+ns+`/gone:http/TCP"`), 1, 20*time.Second)
		deadline := time.Now().Add(20 * time.Second)
		for {
			start := time.Now()
			out, _ := w.outside.run("nc", "-z", "-v", "-w2", nodeOutSide, "30066")
			if strings.Contains(out, "refused") && time.Since(start) < time.Second {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node port 30066 without endpoints: %q; want refused at once", out)
			}
			time.Sleep(200 * time.Millisecond)
		}
		code, view := curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services")
		_, block, _ := strings.Cut(view, ns+"/gone:http/TCP\n")
		block, _, _ = strings.Cut(block, "\n\n")
		for _, want := range []string{
			"endpoints:    none: new connections are refused (the portal's REJECT rule), as kube-proxy refuses them",
			"external to:  none: new connections are refused (the portal's REJECT rule), as kube-proxy refuses them",
		} {
			if code != "200" || !strings.Contains(block, want) {
				t.Errorf("/debug/services (%s) lacks %q:\n%s", code, want, block)
			}
		}
		if strings.Contains(block, "dropped") || strings.Contains(block, "reset") {
			t.Errorf("/debug/services says dropped or reset:\n%s", block)
		}
		if line := regexp.MustCompile(`.*no endpoints on this node now.*` + ns + `/gone.*`).FindString(px.log()); line != "" {
			t.Errorf("logged, for a Service with no endpoint anywhere: %s", line)
		}
	})

	t.Run("headless and ExternalName services are ignored", func(t *testing.T) {
		createService(t, c, newService(ns, "headless", func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }))
		putSlice(t, c, newSlice(ns, "headless", "headless-1", readyEP("198.18.12.2")))
		createService(t, c, newService(ns, "extname", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
			s.Spec.ExternalName = "example.invalid"
			s.Spec.Ports = nil
		}))
		// A later service applies, so the earlier ones were seen.
		createService(t, c, newService(ns, "marker", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.64" }))
		putSlice(t, c, newSlice(ns, "marker", "marker-1", readyEP("198.18.12.2")))
		eventually(t, w.pod, "tcp", "198.18.0.64:80", "be1:")
		for _, r := range ourRules(t, w.node, "nft") {
			if strings.Contains(r, ns+"/headless") || strings.Contains(r, ns+"/extname") {
				t.Errorf("rule for an ignored service: %s", r)
			}
		}
		if strings.Contains(px.log(), ns+"/headless") || strings.Contains(px.log(), ns+"/extname") {
			t.Errorf("the proxy serves an ignored service:\n%s", px.log())
		}
	})

	t.Run("a metadata endpoint is refused, never dialed", func(t *testing.T) {
		createService(t, c, newService(ns, "meta", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.65" }))
		bad := newSlice(ns, "meta", "meta-1", readyEP("169.254.169.254"))
		if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), bad, metav1.CreateOptions{}); err != nil {
			// The API server refuses it: write it where the API server
			// reads it, as an older or careless source could.
			bad.UID = "5e0b6f4e-0000-4000-8000-000000000065"
			bad.CreationTimestamp = metav1.Now()
			if err := api.PutEtcd(context.Background(), "endpointslices", discoveryv1.SchemeGroupVersion, bad, ns, bad.Name); err != nil {
				t.Fatal(err)
			}
		}
		px.waitLog(0, `169\.254\.169\.254`, 1, 20*time.Second)
		eventuallyNot(t, w.pod, "tcp", "198.18.0.65:80") // no endpoints: reset, not the metadata address
		// The teaching view (metrics server, default address) says why.
		if code, view := curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services"); code != "200" ||
			!strings.Contains(view, "Parts of objects from the API server are ignored:\n") ||
			!regexp.MustCompile(`(?m)^  .*meta-1.*169\.254\.169\.254`).MatchString(view) {
			t.Errorf("/debug/services: %s\n%s", code, view)
		}
	})
}

// TestBinaryReportsUnmatchedSlicePort: an EndpointSlice port whose name
// matches no port of its Service feeds nothing, as in kube-proxy, and the
// proxy says so in its log and /debug/services, as it does for the same
// mistake in a manifest file; so does a slice port without a port number.
func TestBinaryReportsUnmatchedSlicePort(t *testing.T) {
	api := requireAPIServer(t)
	w := newWorld(t)
	kubeconfig := relayAPIServer(t, api, w.node)
	c := api.Client
	ns := testNamespace(t, c)
	px := startCommand(t, "ip", "netns", "exec", string(w.node), proxyBin, "--kubeconfig", kubeconfig,
		"--portal=iptables", "--hostname-override=node", "-v=2")
	px.waitLog(0, `"Portals synced"`, 1, 60*time.Second)

	createService(t, c, newService(ns, "web", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.67" }))
	bad := newSlice(ns, "web", "web-1", readyEP("198.18.12.2"))
	bad.Ports[0].Name = new("htp")
	putSlice(t, c, bad)
	want := fmt.Sprintf(`port name "htp" with protocol TCP matches no port of Service %s/web`, ns)
	px.waitLog(0, regexp.QuoteMeta(strings.ReplaceAll(want, `"`, `\"`)), 1, 20*time.Second)
	if !strings.Contains(px.log(), `"Ignoring part of an object from the API server"`) {
		t.Errorf("the log does not say the slice port is ignored:\n%s", px.log())
	}
	code, view := curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services")
	if code != "200" || !strings.Contains(view, "Parts of objects from the API server are ignored:\n") ||
		!regexp.MustCompile(`(?m)^  EndpointSlice `+regexp.QuoteMeta(ns+"/web-1: ports[0]: "+want)).MatchString(view) ||
		!regexp.MustCompile(`(?m)^  endpoints: +none`).MatchString(view) {
		t.Errorf("/debug/services: %s\n%s", code, view)
	}

	// A slice port without a port number (the API's "all ports", which
	// the API server takes) feeds nothing either: said, not skipped
	// without a word.
	createService(t, c, newService(ns, "all", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.68" }))
	all := newSlice(ns, "all", "all-1", readyEP("198.18.12.2"))
	all.Ports[0].Port = nil
	putSlice(t, c, all)
	want = ns + "/all-1: ports[0].port: not set: the port is skipped, as kube-proxy skips it"
	px.waitLog(0, `"Ignoring part of an object from the API server".*`+regexp.QuoteMeta(ns+`/all-1" field="ports[0].port"`), 1, 20*time.Second)
	code, view = curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services")
	if code != "200" || !strings.Contains(view, "\n  EndpointSlice "+want+"\n") {
		t.Errorf("/debug/services (%s) does not list %q:\n%s", code, want, view)
	}
}

// TestBinaryAPIServerRefuses points the binary at a loopback port nobody
// listens on, as a wrong --master would. At the default verbosity client-go
// retries a refused connection without a word: the proxy must say what is
// wrong within seconds. And once client-go's back-off between attempts has
// grown long, SIGTERM must still end the proxy at once.
func TestBinaryAPIServerRefuses(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	master := "http://" + ln.Addr().String()
	ln.Close()
	// -v=2 only so the test can see client-go's back-off; the proxy's own
	// report is an error, logged at any verbosity.
	px := startProxy(t, "--master", master, "--portal=none", "-v=2")
	px.waitLog(0, `Cannot reach the API server.*connection refused`, 1, 15*time.Second)

	// client-go logs this before each sleep between watch-list attempts;
	// the sleeps double from 0.8 s, with up to as much again of jitter, so
	// the fifth lasts at least 12.8 s. (If client-go stops logging it,
	// this wait fails and the test needs another way to see the back-off.)
	px.waitLog(0, `watch-list failed - backing off.*type="\*v1.Service"`, 5, 60*time.Second)
	took, ok := px.terminate(8 * time.Second)
	if !ok {
		t.Fatalf("still running %v after SIGTERM, while client-go backs off", took.Round(time.Millisecond))
	}
	t.Logf("exited %v after SIGTERM (%v)", took.Round(time.Millisecond), px.err)
	if px.err != nil {
		t.Errorf("exit status: %v", px.err)
	}
}
