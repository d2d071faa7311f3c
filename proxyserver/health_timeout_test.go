package proxyserver

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestProxyHealthAtExactlyTheTimeout: a change that has waited exactly
// the health timeout still leaves the proxy healthy, and one that has
// waited a nanosecond more does not, as kube-proxy's rule is: unhealthy
// when the oldest queued update is older than healthTimeout
// (currentTime.Sub(queued) > healthTimeout).
func TestProxyHealthAtExactlyTheTimeout(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1_700_000_000, 0)}
	h := newProxyHealth(time.Minute)
	h.now, h.started = clock.now, clock.t
	get := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/livez", nil))
		return rec.Code
	}
	h.queued()
	clock.t = clock.t.Add(time.Minute)
	if !h.healthy() || get() != http.StatusOK {
		t.Fatalf("a change that waited exactly the timeout: healthy %v, /livez %d, want true and 200", h.healthy(), get())
	}
	clock.t = clock.t.Add(time.Nanosecond)
	if h.healthy() || get() != http.StatusServiceUnavailable {
		t.Fatalf("a change that waited the timeout and 1ns: healthy %v, /livez %d, want false and 503", h.healthy(), get())
	}
}

// TestHealthCheckPortNeedsAHealthyProxy: a health-check node port answers
// 200 only when the Service has a local endpoint of the family and the
// proxy keeps up; with local endpoints but the proxy behind, it answers
// 503 and says serviceProxyHealthy false, as kube-proxy's service health
// server does.
func TestHealthCheckPortNeedsAHealthyProxy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		local   int
		healthy bool
		want    int
	}{
		{"local endpoints, proxy healthy", 2, true, http.StatusOK},
		{"local endpoints, proxy behind", 2, false, http.StatusServiceUnavailable},
		{"no local endpoint, proxy healthy", 0, true, http.StatusServiceUnavailable},
		{"no local endpoint, proxy behind", 0, false, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &healthServer{healthy: func() bool { return tc.healthy }}
			s.status.Store(&healthService{namespace: "ns", name: "svc", local: map[state.IPFamily]int{state.IPv4: tc.local}})
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if rec.Code != tc.want {
				t.Errorf("answered %d, want %d", rec.Code, tc.want)
			}
			var st healthStatus
			if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
				t.Fatalf("%v: %s", err, rec.Body)
			}
			if st.LocalEndpoints != tc.local || st.ServiceProxyHealthy != tc.healthy || st.Service.Name != "svc" || st.Service.Namespace != "ns" {
				t.Errorf("body %s, want %d local endpoints and serviceProxyHealthy %v for ns/svc", rec.Body, tc.local, tc.healthy)
			}
		})
	}
}
