//go:build integration && linux

package integration

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// outage is how long the API server stays down, as the issue specifies.
const outage = 30 * time.Second

// TestAPIServerOutage stops the API server for 30 s, once, for two
// watchers of it: the cluster source in this process and the proxy binary
// with iptables portals in a network namespace. (One outage for both: each
// costs half a minute down and up to a minute of client-go's back-off.)
//
// The source applies nothing while the server is down, least of all an
// empty snapshot; once it is back, the informers resume on their own and
// later changes apply. Traffic through the binary never stops; it says it
// cannot reach the server and, later, that it answers again, and a change
// made after it is back still reaches traffic.
func TestAPIServerOutage(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client

	// The cluster source, in this process.
	a := runCluster(t, c)
	ns := testNamespace(t, c)
	web := svcPort(ns, "web")
	createService(t, c, newService(ns, "web"))
	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.19.7.1")))
	i, _ := a.waitFor(t, 0, "the service", waitApply, endpointsAre(web, clusterEPs, "198.19.7.1:8080"))

	// The binary.
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be2")
	kubeconfig := relayAPIServer(t, api, w.node)
	bns := testNamespace(t, c)
	px := startCommand(t, "ip", "netns", "exec", string(w.node), proxyBin, "--kubeconfig", kubeconfig,
		"--portal=iptables", "--hostname-override=node", "-v=2")
	px.waitLog(0, `"Portals synced"`, 1, 60*time.Second)
	createService(t, c, newService(bns, "web", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.66" }))
	putSlice(t, c, newSlice(bns, "web", "web-1", readyEP("198.18.12.2")))
	eventually(t, w.pod, "tcp", "198.18.0.66:80", "be1:")

	before := a.count()
	logged := px.lineCount()
	api.StopAPIServer()
	down := true
	t.Cleanup(func() {
		if down { // the test failed while it was down: later tests need it
			if err := api.StartAPIServer(); err != nil {
				t.Errorf("restart kube-apiserver: %v", err)
			}
		}
	})
	for start := time.Now(); time.Since(start) < outage; time.Sleep(time.Second) {
		if r := dial(t, w.pod, "tcp", "198.18.0.66:80", "ping", 0); r.Err != "" || !strings.HasPrefix(r.Reply, "be1:") {
			t.Fatalf("traffic through the binary stopped %v into the outage: %+v", time.Since(start).Round(time.Second), r)
		}
	}
	if n := a.count(); n != before {
		t.Errorf("%d snapshots applied while the API server was down", n-before)
	}
	// The binary's watches broke when the server went; their next
	// attempts found nobody (through the relay: a connection that closes
	// at once).
	logged = px.waitLog(logged, `"Cannot reach the API server`, 1, time.Second)
	start := time.Now()
	if err := api.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	down = false
	t.Logf("kube-apiserver ready again after %v", time.Since(start).Round(time.Millisecond))

	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.19.7.1"), readyEP("198.19.7.2")))
	s := newSlice(bns, "web", "web-2", readyEP("198.18.12.2"))
	port := int32(8081)
	s.Ports[0].Port = &port
	putSlice(t, c, s)

	// While it is down the reflectors back off, up to 30 s plus as much
	// jitter between attempts (client-go's default, as in kube-proxy), so
	// they may take a minute to notice it is back.
	_, at := a.waitFor(t, i, "the change made after the restart", 150*time.Second,
		endpointsAre(web, clusterEPs, "198.19.7.1:8080", "198.19.7.2:8080"))
	t.Logf("the source applied the change %v after the API server was started again", at.Sub(start).Round(time.Millisecond))
	a.mu.Lock()
	for k, s := range a.snaps[before:] {
		if s.Len() == 0 || s.Get(web) == nil {
			t.Errorf("snapshot %d after the outage lacks %s (%d ports)", before+k, web, s.Len())
		}
	}
	a.mu.Unlock()

	var r clientResult
	for deadline := start.Add(150 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if r = dial(t, w.pod, "tcp", "198.18.0.66:80", "ping", 0); strings.HasPrefix(r.Reply, "be2:") {
			t.Logf("the binary served the change %v after the API server was started again", time.Since(start).Round(time.Millisecond))
			px.waitLog(logged, `"The API server answers again; the informers now list`, 1, time.Second)
			return
		}
	}
	t.Fatalf("the change made after the outage never reached the binary's traffic: last %+v", r)
}
