//go:build integration && linux

package integration

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBinaryHealthCheckNodePort: a LoadBalancer Service with
// externalTrafficPolicy: Local has its healthCheckNodePort answered as
// kube-proxy answers it, so a cloud load balancer sends traffic only to
// nodes with an endpoint: 200 while this node has a ready one, 503 when it
// has none, and nothing once the Service no longer asks for the port.
func TestBinaryHealthCheckNodePort(t *testing.T) {
	a := httpBackend(t, "a")
	np, hc := freePort(t), freePort(t)
	lb := func(node string, withHealthCheck bool) string {
		typ, extra := "NodePort", ""
		if withHealthCheck {
			typ, extra = "LoadBalancer", fmt.Sprintf("\n  healthCheckNodePort: %d", hc)
		}
		return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lb, namespace: e2e}
spec:
  type: %s
  clusterIP: 198.18.0.30
  externalTrafficPolicy: Local%s
  ports: [{name: http, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: e2e, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, port: %d}]
endpoints:
- {addresses: [127.0.0.1], nodeName: %s}
`, typ, extra, np, a, node)
	}
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, lb("node", true))
	p := startProxy(t, append(proxyArgs(file), "--hostname-override=node")...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)

	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", hc)
	check := func(wantCode, wantBody string) { // wantBody "*": any
		t.Helper()
		var code, body string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			code, body = curlCode(t, url)
			if code == wantCode && (body == wantBody || wantBody == "*") || time.Now().After(deadline) {
				break
			}
		}
		if code != wantCode || body != wantBody && wantBody != "*" {
			t.Fatalf("curl %s: %s %q; want %s %q", url, code, body, wantCode, wantBody)
		}
	}
	check("200", `{"service":{"namespace":"e2e","name":"lb"},"localEndpoints":1,"serviceProxyHealthy":true}`)
	replaceFile(t, file, lb("other", true))
	check("503", `{"service":{"namespace":"e2e","name":"lb"},"localEndpoints":0,"serviceProxyHealthy":true}`)
	// A LoadBalancer without node ports and with no ingress yet still
	// has its health check, as kube-proxy's NeedsHealthCheck says: the
	// cloud may probe before it sets the status.
	withoutNodePorts := strings.Replace(lb("node", true), fmt.Sprintf(", nodePort: %d}", np), "}", 1)
	withoutNodePorts = strings.Replace(withoutNodePorts, "  type: LoadBalancer\n", "  type: LoadBalancer\n  allocateLoadBalancerNodePorts: false\n", 1)
	replaceFile(t, file, withoutNodePorts)
	check("200", `{"service":{"namespace":"e2e","name":"lb"},"localEndpoints":1,"serviceProxyHealthy":true}`)
	replaceFile(t, file, lb("node", false))
	check("000", "*") // curl's code when nothing answers
}

// sharedHealthCheckManifest is two LoadBalancer Services with
// externalTrafficPolicy: Local, e2e/lb (documents 1 and 2) and e2e/lb2
// (3 and 4), both with health-check node port hc; lb's endpoint is on
// another node, lb2's on "node". Without lb2 it is lb alone.
func sharedHealthCheckManifest(hc, np, np2, backend int, withLB2 bool) string {
	lb := func(name string, np int, node string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: e2e}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: %[2]d
  ports: [{name: http, port: 80, nodePort: %[3]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: e2e, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{name: http, port: %[4]d}]
endpoints: [{addresses: [127.0.0.1], nodeName: %[5]s}]
`, name, hc, np, backend, node)
	}
	if !withLB2 {
		return lb("lb", np, "other")
	}
	return lb("lb", np, "other") + "---\n" + lb("lb2", np2, "node")
}

// TestBinaryHealthCheckNodePortShared: two Services given one
// health-check node port, which a cluster's allocator never does, are
// refused as two Services on one node port are: at start-up, with the
// file's line, and in an edit, which keeps the last good state. The port
// went on answering for the first Service with the second's endpoints
// counted, so a load balancer sent its traffic to a node without any.
func TestBinaryHealthCheckNodePortShared(t *testing.T) {
	a := httpBackend(t, "a")
	hc, np, np2 := freePort(t), freePort(t), freePort(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "services.yaml")
	shared := sharedHealthCheckManifest(hc, np, np2, a, true)
	want := fmt.Sprintf("document 3 (Service e2e/lb2): spec.healthCheckNodePort: health check node port %d is also the health check node port of Service e2e/lb (document 1)", hc)

	t.Run("refused at start-up", func(t *testing.T) {
		bad := filepath.Join(dir, "shared.yaml")
		writeFile(t, bad, shared)
		line := strings.Count(shared[:strings.LastIndex(shared, "healthCheckNodePort:")], "\n") + 1
		cmd := exec.Command(proxyBin, append(proxyArgs(bad), "--hostname-override=node")...)
		out, err := combinedOutputWithin(t, cmd, 20*time.Second)
		if code := exitCode(err); code != 1 {
			t.Fatalf("exit code %d, want 1; output:\n%s", code, out)
		}
		if w := fmt.Sprintf("shared.yaml:%d: %s", line, want); !strings.Contains(string(out), w) {
			t.Errorf("output does not say %q:\n%s", w, out)
		}
	})

	t.Run("an edit is refused and the port answers for its Service", func(t *testing.T) {
		writeFile(t, file, sharedHealthCheckManifest(hc, np, np2, a, false))
		p := startProxy(t, append(proxyArgs(file), "--hostname-override=node")...)
		p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
		url := fmt.Sprintf("http://127.0.0.1:%d/healthz", hc)
		lbAlone := `{"service":{"namespace":"e2e","name":"lb"},"localEndpoints":0,"serviceProxyHealthy":true}`
		healthzAnswers(t, func(u string) (string, string) { return curlCode(t, u) }, url, "503", lbAlone)

		from := p.lineCount()
		replaceFile(t, file, shared)
		p.waitLog(from, `"Manifest edit rejected|"Applying edited manifests"`, 1, 5*time.Second)
		if log := p.log()[len(strings.Join(p.lines[:from], "\n")):]; !strings.Contains(log, want) {
			t.Errorf("the edit's log does not say %q:\n%s", want, log)
		}
		if code, body := curlCode(t, url); code != "503" || body != lbAlone {
			t.Errorf("after the edit curl %s: %s %q; want 503 %q (lb's state, lb2 not counted)", url, code, body, lbAlone)
		}
	})
}

// curlCode fetches url with the real curl and returns the status (000
// when nothing answered) and the body.
func curlCode(t *testing.T, url string) (code, body string) {
	t.Helper()
	return curlCodeIn(t, "", url)
}

// curlCodeIn is curlCode run in network namespace ns ("" for this one).
func curlCodeIn(t *testing.T, ns netns, url string) (code, body string) {
	t.Helper()
	args := []string{requireTool(t, "curl"), "-s", "--max-time", "2", "-w", "\n%{http_code}", url}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", string(ns)}, args...)
	}
	// Standard output is the body, a newline and the status.
	out, _ := exec.Command(args[0], args[1:]...).Output()
	i := strings.LastIndexByte(string(out), '\n')
	return string(out[i+1:]), string(out[:max(i, 0)])
}

// healthzManifest is a LoadBalancer Service with externalTrafficPolicy:
// Local, whose health-check node port is hc, with an endpoint at
// 127.0.0.1:backend on node "node", and a NodePort Service on busy.
func healthzManifest(hc, np, busy, backend int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lb, namespace: e2e}
spec:
  type: LoadBalancer
  clusterIP: 198.18.0.30
  externalTrafficPolicy: Local
  healthCheckNodePort: %d
  ports: [{name: http, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: e2e, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, port: %d}]
endpoints: [{addresses: [127.0.0.1], nodeName: node}]
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.31
  ports: [{name: http, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other-1, namespace: e2e, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
ports: [{name: http, port: %d}]
endpoints: [{addresses: [127.0.0.1]}]
`, hc, np, backend, busy, backend)
}

// healthzAnswers polls url with curl (run by run) until it answers code
// with inBody in its body, bounded.
func healthzAnswers(t *testing.T, run func(url string) (code, body string), url, code, inBody string) {
	t.Helper()
	var got, body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got, body = run(url); got == code && strings.Contains(body, inBody) {
			return
		}
	}
	t.Fatalf("%s answered %s %q; want %s with %q within 10s", url, got, body, code, inBody)
}

// TestBinaryHealthz: /healthz, /livez and a health-check node port answer
// with kube-proxy's JSON, and a Service the proxy cannot serve (its node
// port held by another program, so every sync reports it) does not make
// the proxy unhealthy: a restart would not help it, and a 503 would drain
// every Service from the node. (TestBinaryHealthzWhenPortalsFail makes
// the proxy itself fail.)
func TestBinaryHealthz(t *testing.T) {
	a := httpBackend(t, "a")
	np, busy, hc, hz, mp := freePort(t), freePort(t), freePort(t), freePort(t), freePort(t)
	holder, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", busy))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, healthzManifest(hc, np, busy, a))
	px := startProxy(t, append(proxyArgs(file), "--hostname-override=node", "--iptables-sync-period=1s", "-v=2",
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))...)
	px.waitLog(0, `"Serving /healthz and /livez" addr="127.0.0.1:`+strconv.Itoa(hz), 1, 20*time.Second)
	px.waitLog(0, `"Sync failed; will retry`, 1, 20*time.Second)
	run := func(url string) (string, string) { return curlCode(t, url) }
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", hz)
	healthzAnswers(t, run, healthz, "200", `"nodeEligible":true,"healthy":true`)
	// Twice the 2 s health timeout of retries later, still healthy.
	px.waitLog(0, `"Sync failed again"`, 4, 20*time.Second)
	for _, url := range []string{healthz, fmt.Sprintf("http://127.0.0.1:%d/livez", hz)} {
		if code, body := curlCode(t, url); code != "200" || !strings.Contains(body, `"healthy":true`) {
			t.Errorf("%s while one Service cannot be served: %s %s", url, code, body)
		}
	}
	healthzAnswers(t, run, fmt.Sprintf("http://127.0.0.1:%d/", hc), "200", `"localEndpoints":1,"serviceProxyHealthy":true`)
	if code, _ := curlCode(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", hz)); code != "404" {
		t.Errorf("/metrics on the health server: %s, want 404", code)
	}
	// The metrics server counts the failed syncs, not as the portal's.
	if code, body := curlCode(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", mp)); code != "200" ||
		!regexp.MustCompile(`\nkube_userspace_proxy_sync_failures_total\{cause="services"\} [1-9]`).MatchString(body) ||
		!strings.Contains(body, "\n"+`kube_userspace_proxy_sync_failures_total{cause="portal"} 0`+"\n") {
		t.Errorf("/metrics: %s, sync failures: %q", code, regexp.MustCompile(`(?m)^kube_userspace_proxy_sync_failures.*$`).FindAllString(body, -1))
	}
	// The debug view says what fails, and shows the health-check port.
	view, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/debug/services", mp))
	if err != nil || !strings.Contains(view, fmt.Sprintf("The last sync failed, and is retried: userspace: service e2e/other:http/TCP: listen on 127.0.0.1:%d (node-port)", busy)) ||
		!strings.Contains(view, fmt.Sprintf("  health check: node port %d\n", hc)) ||
		!strings.Contains(view, "  node & pods:  external traffic from this node goes to every endpoint (from pods too, given --cluster-cidr)") {
		t.Errorf("/debug/services: %v\n%s", err, view)
	}
}

// TestBinaryMetrics: /metrics on --metrics-bind-address, scraped with
// curl, has kube-proxy's sync metrics and the data plane's counters, which
// follow real traffic; /proxyMode and the plain /healthz answer as
// kube-proxy's metrics server does.
func TestBinaryMetrics(t *testing.T) {
	a, ua := httpBackend(t, "a"), udpBackend(t, "ua")
	np, mp := freePort(t), freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest(np, "None", []int{a}, []int{ua}))
	px := startProxy(t, append(proxyArgs(file), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))...)
	px.waitLog(0, `"Serving /metrics" addr="127.0.0.1:`+strconv.Itoa(mp), 1, 20*time.Second)
	px.waitLog(0, `"Serving".*via="node-port"`, 2, 20*time.Second)
	for range 5 {
		if body, err := curl(t, fmt.Sprintf("http://127.0.0.1:%d/", np)); err != nil || body != "a" {
			t.Fatalf("node port: %q, %v", body, err)
		}
	}
	for range 3 {
		if got, err := ncUDP(t, "127.0.0.1", np, "hi"); err != nil || !strings.HasPrefix(got, "ua") {
			t.Fatalf("UDP node port: %q, %v", got, err)
		}
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", mp)
	// Traffic may flow a moment before the sync that opened it is
	// recorded: wait (bounded) for its changes to be applied.
	var metrics string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if metrics, err = curl(t, base+"/metrics"); err != nil {
			t.Fatalf("/metrics: %v: %s", err, metrics)
		}
		if strings.Contains(metrics, "\nkubeproxy_sync_proxy_rules_service_changes_pending 0\n") &&
			strings.Contains(metrics, "\nkubeproxy_sync_proxy_rules_endpoint_changes_pending 0\n") || time.Now().After(deadline) {
			break
		}
	}
	values := map[string]float64{}
	for _, line := range strings.Split(metrics, "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && !strings.HasPrefix(line, "#") {
			f, _ := strconv.ParseFloat(v, 64)
			values[name] = f
		}
	}
	for name, want := range map[string]float64{
		"kube_userspace_proxy_tcp_connections_accepted_total":               5,
		"kube_userspace_proxy_udp_sessions_opened_total":                    3,
		`kube_userspace_proxy_udp_datagrams_total{direction="to_endpoint"}`: 3,
		`kube_userspace_proxy_udp_datagrams_total{direction="to_client"}`:   3,
		// Each datagram is "hi"; the backend answers "ua:hi".
		`kube_userspace_proxy_bytes_total{direction="to_endpoint",protocol="udp"}`:  3 * 2,
		`kube_userspace_proxy_bytes_total{direction="to_client",protocol="udp"}`:    3 * 5,
		`kube_userspace_proxy_bytes_total{direction="to_endpoint",protocol="sctp"}`: 0,
		"kube_userspace_proxy_tcp_no_endpoints_total":                               0,
		// The file's one Service, with endpoints, is a Service change
		// and an endpoint change, which the first sync applied.
		"kubeproxy_sync_proxy_rules_service_changes_total":    1,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":   1,
		"kubeproxy_sync_proxy_rules_service_changes_pending":  0,
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending": 0,
	} {
		if got, ok := values[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	// kube-proxy's sync metrics carry ip_family, as they do since 1.33;
	// IPv4 is always served.
	for _, name := range []string{
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`,
		`kube_userspace_proxy_bytes_total{direction="to_client",protocol="tcp"}`,
		"process_open_fds",
	} {
		if values[name] <= 0 {
			t.Errorf("%s = %v, want it above 0", name, values[name])
		}
	}
	if _, ok := values[`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"}`]; !ok {
		t.Errorf("/metrics lacks no_local_endpoints_total by ip_family")
	}
	if body, err := curl(t, base+"/proxyMode"); err != nil || body != "userspace" {
		t.Errorf("/proxyMode: %q, %v", body, err)
	}
	if body, err := curl(t, base+"/healthz"); err != nil || body != "ok" {
		t.Errorf("/healthz of the metrics server: %q, %v", body, err)
	}
	// The teaching view: what each service port serves, and where.
	view, err := curl(t, base+"/debug/services")
	if err != nil {
		t.Fatalf("/debug/services: %v: %s", err, view)
	}
	for _, want := range []string{
		"2 service ports, portal none, applied ",
		"\ne2e/app:http/TCP\n",
		fmt.Sprintf("  frontends:    198.18.0.20:80, node port %d\n", np),
		"  affinity:     none: round robin\n",
		fmt.Sprintf("  endpoints:    127.0.0.1:%d\n", a),
		fmt.Sprintf("127.0.0.1:%d (node-port)", np),
		"\ne2e/app:dns/UDP\n",
		fmt.Sprintf("  endpoints:    127.0.0.1:%d\n", ua),
		"  carried:      5 connections, ",
		"  carried:      3 UDP sessions, ",
	} {
		if !strings.Contains(view, want) {
			t.Errorf("/debug/services lacks %q:\n%s", want, view)
		}
	}
}
