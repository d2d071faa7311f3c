//go:build integration && linux

package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// proxyFDs counts the descriptors process pid holds.
func proxyFDs(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// holdThrough connects n idle clients to addr, each echoed once, and
// closes them when the test ends; it fails the test at the first one not
// served.
func holdThrough(t *testing.T, p *proxyProc, addr string, n int) []net.Conn {
	t.Helper()
	var held []net.Conn
	for i := range n {
		c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			err = echoes(c)
		}
		if err != nil {
			t.Fatalf("client %d of %d: %v\n%s", i, n, err, tail(p.log(), 30))
		}
		held = append(held, c)
	}
	return held
}

// TestBinaryServiceAddedUnderConnectionLoad: clients hold about 90% of the
// connections' room, far more descriptor numbers than listeners had below
// their old ceiling, and a Service added then is listened on and serves
// (a handful of service ports are far from the listeners' bound). Both
// builds, under a limit set before the proxy starts. The listeners'
// ceiling was a descriptor number an eighth of the room below the
// connections', which the connections' low numbers pushed every new
// listener past: the new Service got "too many listening sockets" and no
// listener until the clients left.
func TestBinaryServiceAddedUnderConnectionLoad(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) { serviceAddedUnderLoad(t, tc.bin) })
	}
}

func serviceAddedUnderLoad(t *testing.T, bin string) {
	const (
		limit = 512
		conns = limit - 64 // the connections' ceiling
	)
	backend := echoBackend(t)
	np, np2 := freePort(t), freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, loopbackNodePortManifest("held", np, backend))
	p := startWithFDLimit(t, bin, limit, proxyArgs(file)...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
	pid := p.cmd.Process.Pid
	addr := fmt.Sprintf("127.0.0.1:%d", np)
	holdThrough(t, p, addr, 1) // the loops and pools are set up

	// Two descriptors a client: about 90% of the room left, ending about
	// 24 descriptors short of the connections' ceiling, far above the
	// listeners' old one (an eighth of the room, 64, below it).
	n := (conns - proxyFDs(t, pid) - 24) / 2
	holdThrough(t, p, addr, n)
	held := proxyFDs(t, pid)
	t.Logf("%d clients hold the proxy's descriptors up to %d of %d (connections' ceiling %d)", n+1, held, limit, conns)
	if held < conns-64 {
		t.Fatalf("the clients hold only %d descriptors", held)
	}

	replaceFile(t, file, loopbackNodePortManifest("held", np, backend)+"---\n"+loopbackNodePortManifest("added", np2, backend))
	if err := servedWithin(fmt.Sprintf("127.0.0.1:%d", np2), 10*time.Second); err != nil {
		t.Fatalf("the Service added under load is not served: %v\n%s", err, tail(p.log(), 30))
	}
	if regexp.MustCompile(`too many listening sockets`).MatchString(p.log()) {
		t.Errorf("a listener refused:\n%s", tail(p.log(), 30))
	}
	// The clients already held are still served.
	holdThrough(t, p, addr, 1)
}

// TestBinaryHealthAnswersAfterManyLocalLoadBalancers: Services with
// externalTrafficPolicy: Local added while clients hold most of the
// connections' room: their health-check node ports are counted as
// listening sockets, so those past the bound are refused (reported, and
// retried) instead of taking the descriptors kept for the proxy's own
// work; /livez, /healthz and /metrics answer, the clients held are served,
// and no health-check server logs accept errors every second. Both
// builds, under a limit of 100. Health-check ports were plain listeners
// that took the connections' room and then the reserve: the probes went
// unanswered and each port's server logged "http: Accept error: ... too
// many open files; retrying in 1s" once a second.
func TestBinaryHealthAnswersAfterManyLocalLoadBalancers(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) { healthAfterManyLocalLBs(t, tc.bin) })
	}
}

func healthAfterManyLocalLBs(t *testing.T, bin string) {
	const (
		limit   = 100
		conns   = 75 // the connections' ceiling
		lbs     = 32
		clients = 15
	)
	backend := echoBackend(t)
	np, hp, mp := freePort(t), freePort(t), freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	base := loopbackNodePortManifest("held", np, backend)
	writeFile(t, file, base)
	p := startWithFDLimit(t, bin, limit, append(proxyArgs(file), "--hostname-override=node", "-v=1",
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hp), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
	urls := []string{
		fmt.Sprintf("http://127.0.0.1:%d/livez", hp),
		fmt.Sprintf("http://127.0.0.1:%d/healthz", hp),
		fmt.Sprintf("http://127.0.0.1:%d/metrics", mp),
	}
	waitAnswers(t, p, urls[1])
	addr := fmt.Sprintf("127.0.0.1:%d", np)
	held := holdThrough(t, p, addr, clients)
	t.Logf("%d clients hold the proxy's descriptors up to %d (connections' ceiling %d)", clients, proxyFDs(t, p.cmd.Process.Pid), conns)

	// One run of ports for the health checks: ports drawn one by one may
	// repeat, and a file giving two Services one is refused.
	hc := freePortRun(t, lbs)
	var m strings.Builder
	m.WriteString(base)
	for i := range lbs {
		fmt.Fprintf(&m, `---
apiVersion: v1
kind: Service
metadata: {name: lb%[1]d, namespace: e2e}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  externalTrafficPolicy: Local
  healthCheckNodePort: %[2]d
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb%[1]d-1, namespace: e2e, labels: {kubernetes.io/service-name: lb%[1]d}}
addressType: IPv4
ports: [{name: http, port: %[3]d}]
endpoints: [{addresses: [127.0.0.1], nodeName: node}]
`, i, hc+i, backend)
	}
	replaceFile(t, file, m.String())
	p.waitLog(0, `"Serving" service="e2e/lb0:http/TCP"`, 1, 20*time.Second)
	// A few syncs and retries, and time for accept errors to repeat.
	time.Sleep(4 * time.Second)

	for _, url := range urls {
		if err := answers(url); err != nil {
			t.Errorf("after %d Local LoadBalancers were added under load: %v", lbs, err)
		}
	}
	for i, c := range held {
		if err := echoes(c); err != nil {
			t.Errorf("held client %d: %v", i, err)
		}
	}
	log := p.log()
	t.Logf("%d health check node ports served, %d proxy descriptors", strings.Count(log, `"Serving health check node port"`), proxyFDs(t, p.cmd.Process.Pid))
	if n := strings.Count(log, "http: Accept error"); n > 0 {
		t.Errorf("%d accept errors logged by HTTP servers", n)
	}
	if !strings.Contains(log, "too many listening sockets") && !strings.Contains(log, "down to the last 25") {
		t.Errorf("no listener refused: %d Local LoadBalancers fit under a limit of %d?", lbs, limit)
	}
	if t.Failed() {
		t.Logf("proxy log:\n%s", tail(log, 30))
	}
}
