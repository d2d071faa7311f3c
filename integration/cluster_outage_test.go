//go:build integration && linux

package integration

import (
	"testing"
	"time"
)

// outage is how long the API server stays down, as the issue specifies.
const outage = 30 * time.Second

// While the API server is down the proxy keeps what it has: no snapshot at
// all is applied, least of all an empty one. Once it is back, the informers
// resume on their own and later changes apply.
func TestClusterAPIServerOutage(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	a := runCluster(t, c)
	ns := testNamespace(t, c)
	web := svcPort(ns, "web")
	createService(t, c, newService(ns, "web"))
	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.19.7.1")))
	i, _ := a.waitFor(t, 0, "the service", waitApply, endpointsAre(web, clusterEPs, "198.19.7.1:8080"))
	before := a.count()

	api.StopAPIServer()
	down := true
	t.Cleanup(func() {
		if down { // the test failed while it was down: later tests need it
			if err := api.StartAPIServer(); err != nil {
				t.Errorf("restart kube-apiserver: %v", err)
			}
		}
	})
	time.Sleep(outage)
	if n := a.count(); n != before {
		t.Errorf("%d snapshots applied while the API server was down", n-before)
	}
	start := time.Now()
	if err := api.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	down = false
	t.Logf("kube-apiserver ready again after %v", time.Since(start).Round(time.Millisecond))

	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.19.7.1"), readyEP("198.19.7.2")))
	// While it is down the reflectors back off, up to 30 s plus as much
	// jitter between attempts (client-go's default, as in kube-proxy), so
	// they may take a minute to notice it is back.
	_, at := a.waitFor(t, i, "the change made after the restart", 150*time.Second,
		endpointsAre(web, clusterEPs, "198.19.7.1:8080", "198.19.7.2:8080"))
	t.Logf("change applied %v after the API server was started again", at.Sub(start).Round(time.Millisecond))

	a.mu.Lock()
	defer a.mu.Unlock()
	for k, s := range a.snaps[before:] {
		if s.Len() == 0 || s.Get(web) == nil {
			t.Errorf("snapshot %d after the outage lacks %s (%d ports)", before+k, web, s.Len())
		}
	}
}
