package proxyserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// fakeNow is a clock the test moves.
type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time { return f.t }

func TestProxyHealth(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1_700_000_000, 0)}
	h := newProxyHealth(time.Minute)
	h.now = clock.now
	step := func(d time.Duration) { clock.t = clock.t.Add(d) }

	if !h.healthy() {
		t.Fatal("unhealthy before any change")
	}
	h.queued()
	step(59 * time.Second)
	if !h.healthy() {
		t.Fatal("unhealthy while a change has waited less than the timeout")
	}
	step(2 * time.Second)
	if h.healthy() {
		t.Fatal("healthy while a change has waited more than the timeout")
	}
	h.queued() // a newer change does not restart the wait
	if h.healthy() {
		t.Fatal("a newer change made it healthy")
	}
	started := clock.t
	step(time.Second)
	h.updated(started, false)
	if !h.healthy() {
		t.Fatal("unhealthy after everything was applied")
	}
	// A change that came while a sync ran waits from the sync's start.
	h.queued()
	started = clock.t
	step(30 * time.Second)
	h.updated(started, true)
	step(31 * time.Second)
	if h.healthy() {
		t.Fatal("healthy though the change that came during the sync waited 61s")
	}
}

func TestHealthEndpoints(t *testing.T) {
	clock := &fakeNow{t: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	h := newProxyHealth(time.Minute)
	h.now = clock.now
	get := func(path string) (int, healthReport) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var r healthReport
		if rec.Code != http.StatusNotFound {
			if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
				t.Fatalf("%s: %v: %s", path, err, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s: Content-Type %q", path, ct)
			}
		}
		return rec.Code, r
	}
	// Before the first sync, as kube-proxy, no family has a status.
	if code, r := get("/healthz"); code != 200 || !r.Healthy || r.NodeEligible == nil || !*r.NodeEligible || !r.LastUpdated.Equal(clock.t) ||
		len(r.Status) != 0 {
		t.Errorf("/healthz at start: %d %+v", code, r)
	}
	if code, r := get("/livez"); code != 200 || r.NodeEligible != nil {
		t.Errorf("/livez at start: %d %+v (it has no nodeEligible)", code, r)
	}
	if code, _ := get("/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics: %d, want 404", code)
	}

	// Nothing applied a minute after the start: the source has not
	// delivered, and the portal serves nothing the node is asked for.
	h.started = clock.t.Add(-61 * time.Second)
	if code, r := get("/healthz"); code != 503 || r.Healthy || r.Reason == "" || r.Status["IPv4"].Healthy || !r.LastUpdated.IsZero() {
		t.Errorf("/healthz with nothing applied 61s after the start: %d %+v", code, r)
	}
	if code, r := get("/livez"); code != 200 || !r.Healthy {
		t.Errorf("/livez with nothing applied 61s after the start: %d %+v, want 200 (a restart would not help)", code, r)
	}

	// As kube-proxy: a 200 says now at the top level, for old clients,
	// and each family says when it was applied; a 503 says when at the
	// top level too, whatever the reason.
	synced := clock.t
	h.updated(synced, false)
	clock.t = clock.t.Add(30 * time.Second)
	for _, path := range []string{"/healthz", "/livez"} {
		if code, r := get(path); code != 200 || !r.Healthy || !r.LastUpdated.Equal(clock.t) || len(r.Status) != 2 ||
			!r.Status["IPv4"].Healthy || !r.Status["IPv4"].LastUpdated.Equal(synced) || !r.Status["IPv6"].LastUpdated.Equal(synced) {
			t.Errorf("%s 30s after a sync: %d %+v", path, code, r)
		}
	}
	h.setEligible("its Node is being deleted")
	if code, r := get("/healthz"); code != 503 || *r.NodeEligible || r.Reason != "its Node is being deleted" ||
		!r.LastUpdated.Equal(synced) || !r.Status["IPv4"].Healthy || !r.Status["IPv6"].LastUpdated.Equal(synced) {
		t.Errorf("/healthz of a node going away: %d %+v", code, r)
	}
	if code, r := get("/livez"); code != 200 || !r.LastUpdated.Equal(clock.t) || !r.Status["IPv4"].LastUpdated.Equal(synced) {
		t.Errorf("/livez of a node going away: %d %+v, want 200 (the proxy itself is fine)", code, r)
	}
	h.setEligible("")

	h.queued()
	clock.t = clock.t.Add(2 * time.Minute)
	for _, path := range []string{"/healthz", "/livez"} {
		if code, r := get(path); code != 503 || r.Healthy || !r.LastUpdated.Equal(synced) || r.Reason == "" ||
			r.Status["IPv4"].Healthy || !r.Status["IPv6"].LastUpdated.Equal(synced) {
			t.Errorf("%s with a change waiting 2m: %d %+v", path, code, r)
		}
	}
}

// TestHealthReasonNamesARunningSync: a sync that hangs (an
// iptables-restore waiting for the xtables lock) logs no error, so a 503's
// reason says a sync has run that long, when it was already running as the
// change became late; otherwise the reason points at the sync errors. Before
// anything is applied, the reason tells a hanging first sync and a source
// that delivered from one that has not.
func TestHealthReasonNamesARunningSync(t *testing.T) {
	clock := &fakeNow{t: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	h := newProxyHealth(time.Minute)
	h.now, h.started = clock.now, clock.t
	reason := func() string {
		t.Helper()
		r, code := h.report(true)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("answer %d %+v, want 503", code, r)
		}
		return r.Reason
	}
	at := func(d time.Duration) time.Time { return h.started.Add(d) }

	h.queued()
	h.syncing(at(time.Second))
	clock.t = at(90 * time.Second)
	if got, want := reason(), "nothing applied yet: the first sync has been running for 1m29s and has not finished"; got != want {
		t.Errorf("a first sync hanging: reason %q, want %q", got, want)
	}
	h.syncing(time.Time{})
	if got, want := reason(), "nothing applied yet: the source delivered Services and EndpointSlices 1m30s ago, and they wait to be applied (see the sync errors in the log)"; got != want {
		t.Errorf("a first sync failing: reason %q, want %q", got, want)
	}

	h.updated(at(91*time.Second), false)
	h.queued() // at 1m30s: late from 2m30s
	h.syncing(at(100 * time.Second))
	clock.t = at(200 * time.Second)
	if got, want := reason(), "a change has waited more than 1m0s to be applied: a sync has been running for 1m40s and has not finished"; got != want {
		t.Errorf("a sync hanging: reason %q, want %q", got, want)
	}
	// A sync that began once the change was late is not why: the ones
	// before it failed.
	h.syncing(at(160 * time.Second))
	if got, want := reason(), "a change has waited more than 1m0s to be applied (see the sync errors in the log)"; got != want {
		t.Errorf("a sync begun late: reason %q, want %q", got, want)
	}
	h.syncing(time.Time{})
	if got, want := reason(), "a change has waited more than 1m0s to be applied (see the sync errors in the log)"; got != want {
		t.Errorf("no sync running: reason %q, want %q", got, want)
	}
}

// TestSyncLoopTellsHealth: offers queue; a sync whose kernel part failed,
// or a rate limit deferred, leaves them waiting; one where only a Service
// failed (a busy node port) counts as applied, as does a good one. Each
// apply notes whether a change is pending as it starts, which is what the
// previous one left.
func TestSyncLoopTellsHealth(t *testing.T) {
	results := []error{
		joinErrors(kernelError{errors.New("iptables-restore: exit status 1")}, errors.New("listen: address in use")),
		errDeferred{after: 10 * time.Millisecond},
		errors.New("listen: address in use"), // retried after retryMin
		nil,
	}
	pendingAtStart := make(chan bool, len(results))
	var l *syncLoop
	pending := func() bool {
		l.health.mu.Lock()
		defer l.health.mu.Unlock()
		return !l.health.pendingSince.IsZero()
	}
	calls := 0
	l = newSyncLoop(func(state.Snapshot) error {
		pendingAtStart <- pending()
		calls++
		return results[calls-1]
	}, 10*time.Millisecond, time.Hour)
	l.health = newProxyHealth(0) // any wait is too long
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	l.offer(snapOf(1))
	// after: the offer; the kernel failure; the deferred sync; the
	// Service's failure.
	for i, want := range []bool{true, true, true, false} {
		select {
		case got := <-pendingAtStart:
			if got != want {
				t.Fatalf("apply %d began with pending %v, want %v", i+1, got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("apply %d never came", i+1)
		}
	}
}

// TestMetricsCountHealthAnswers: /healthz and /livez answers are counted
// by status code, as kube-proxy's kubeproxy_proxy_healthz_total counts
// them, and a sync shows in the sync metrics: its duration, its failure,
// and the service ports with a Local policy and no local endpoint.
func TestMetricsCountHealthAnswers(t *testing.T) {
	var stats userspace.Stats
	m := newMetrics(&stats, []string{"IPv4"})
	h := newProxyHealth(time.Minute)
	h.answered = m.answered
	h.setEligible("its Node was deleted")
	for _, path := range []string{"/healthz", "/healthz", "/livez"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	local := []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.2.1:80"), Local: true}}
	remote := []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.3.1:80")}}
	m.synced(state.NewSnapshot([]state.ServicePort{
		{Name: state.ServicePortName{Namespace: "ns", Name: "a", Protocol: state.TCP}, InternalLocal: true, ExternalLocal: true, ClusterEndpoints: remote},
		{Name: state.ServicePortName{Namespace: "ns", Name: "b", Protocol: state.TCP}, ExternalLocal: true, ClusterEndpoints: remote},
		{Name: state.ServicePortName{Namespace: "ns", Name: "c", Protocol: state.TCP}, ExternalLocal: true, LocalEndpoints: local, ClusterEndpoints: local},
		{Name: state.ServicePortName{Namespace: "ns", Name: "d", Protocol: state.TCP}},
		// No endpoint anywhere: refused, not counted, as kube-proxy
		// counts only Services that have endpoints elsewhere.
		{Name: state.ServicePortName{Namespace: "ns", Name: "e", Protocol: state.TCP}, InternalLocal: true, ExternalLocal: true},
	}), 3*time.Millisecond, false, true, failedPortal)
	stats.TCPAccepted.Add(7)
	got := scrapeMetrics(t, m)
	for series, want := range map[string]string{
		`kubeproxy_proxy_healthz_total{code="503"}`:                                                       "2",
		`kubeproxy_proxy_livez_total{code="200"}`:                                                         "1",
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`:                             "1",
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"}`: "1",
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"}`: "2",
		`kube_userspace_proxy_sync_failures_total{cause="portal"}`:                                        "1",
		`kube_userspace_proxy_sync_failures_total{cause="services"}`:                                      "0",
		`kube_userspace_proxy_tcp_connections_accepted_total`:                                             "7",
	} {
		if got[series] != want {
			t.Errorf("%s = %q, want %q", series, got[series], want)
		}
	}
}

// TestMetricsPerIPFamily: as kube-proxy's proxier of each family does, the
// sync metrics have a series per IP family the proxy serves, and only
// those; one sync serves them all, so they have the same values, except
// the service ports with a Local policy and no local endpoint, which each
// family counts among the ports it serves, by their endpoints of that
// family. The health answers are counted once each, with no family.
func TestMetricsPerIPFamily(t *testing.T) {
	ep := func(addr string, local bool) state.Endpoint {
		return state.Endpoint{Addr: netip.MustParseAddrPort(addr), Local: local}
	}
	ips := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	port := func(name string) state.ServicePortName {
		return state.ServicePortName{Namespace: "ns", Name: name, Port: "http", Protocol: state.TCP}
	}
	remote4, local4 := ep("198.18.3.1:80", false), ep("198.18.2.1:80", true)
	remote6 := ep("[fd5e:b1b5::3:1]:80", false)
	snap := state.NewSnapshot([]state.ServicePort{
		// IPv4 only: Local both ways, endpoints elsewhere only.
		{Name: port("v4"), ClusterIPs: ips("198.18.0.10"), InternalLocal: true, ExternalLocal: true, ClusterEndpoints: []state.Endpoint{remote4}},
		// Dual-stack, external Local: a local IPv4 endpoint, IPv6 ones
		// elsewhere only; IPv6 counts it.
		{Name: port("dual-ext"), ClusterIPs: ips("198.18.0.11", "fd5e:b1b5::11"), ExternalLocal: true,
			ClusterEndpoints: []state.Endpoint{local4, remote6}, LocalEndpoints: []state.Endpoint{local4}},
		// Dual-stack, internal Local, IPv4 endpoints elsewhere and no IPv6
		// one: IPv6 refuses its clients, and does not count it.
		{Name: port("dual-int"), ClusterIPs: ips("198.18.0.12", "fd5e:b1b5::12"), InternalLocal: true, ClusterEndpoints: []state.Endpoint{remote4}},
		// IPv6 only, internal Local, endpoints elsewhere.
		{Name: port("v6"), ClusterIPs: ips("fd5e:b1b5::13"), InternalLocal: true, ClusterEndpoints: []state.Endpoint{remote6}},
	})
	for _, tc := range []struct {
		name     string
		families []string
		noLocal  map[string][2]string // family → internal, external
	}{
		{name: "IPv4 only", families: []string{"IPv4"}, noLocal: map[string][2]string{"IPv4": {"2", "1"}}},
		{name: "dual-stack", families: []string{"IPv4", "IPv6"}, noLocal: map[string][2]string{"IPv4": {"2", "1"}, "IPv6": {"1", "1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stats userspace.Stats
			m := newMetrics(&stats, tc.families)
			h := newProxyHealth(time.Minute)
			h.families, h.answered = tc.families, m.answered
			h.updated(time.Now(), false) // a family has a status once a sync has applied everything
			fresh := scrapeMetrics(t, m)
			m.queued(state.Changes{})
			m.synced(snap, 3*time.Millisecond, true, true, "")
			// One change of each family: an IPv4-only proxy has no
			// proxier to observe the IPv6 one.
			ago := time.Now().Add(-time.Second)
			m.programmed([]state.ChangeTrigger{{At: ago, Family: state.IPv4}, {At: ago, Family: state.IPv6}}, time.Now())
			for _, path := range []string{"/healthz", "/healthz", "/livez"} {
				h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
			}
			got := scrapeMetrics(t, m)

			// The families are those /healthz's status names.
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			var r healthReport
			if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || len(r.Status) != len(tc.families) {
				t.Fatalf("/healthz: %v: %s", err, rec.Body)
			}
			sync := []string{
				"kubeproxy_sync_proxy_rules_duration_seconds_count", "kubeproxy_sync_proxy_rules_duration_seconds_sum",
				"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
				"kubeproxy_network_programming_duration_seconds_count", "kubeproxy_network_programming_duration_seconds_sum",
			}
			first := map[string]string{}
			for _, f := range tc.families {
				if _, ok := r.Status[f]; !ok {
					t.Errorf("/healthz's status lacks %s: %s", f, rec.Body)
				}
				for _, name := range sync {
					series := name + `{ip_family="` + f + `"}`
					if fresh[series] == "" {
						t.Errorf("before any sync, %s is missing", series)
					}
					v := got[series]
					if v == "" || v == "0" {
						t.Errorf("%s = %q, want a value", series, v)
					}
					if first[name] == "" {
						first[name] = v
					} else if v != first[name] {
						t.Errorf("%s = %s, but %s in %s: one sync serves every family", series, v, first[name], tc.families[0])
					}
				}
				for i, policy := range []string{"internal", "external"} {
					series := `kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="` + f + `",traffic_policy="` + policy + `"}`
					if want := tc.noLocal[f][i]; got[series] != want {
						t.Errorf("%s = %q, want %q", series, got[series], want)
					}
				}
			}
			for _, c := range []string{"kubeproxy_sync_proxy_rules_duration_seconds_count", "kubeproxy_network_programming_duration_seconds_count"} {
				if first[c] != "1" {
					t.Errorf("%s = %s per family, want 1", c, first[c])
				}
			}
			for series := range got {
				if strings.Contains(series, `ip_family="IPv6"`) && len(tc.families) == 1 {
					t.Errorf("an IPv4-only proxy has the series %s", series)
				}
			}
			// One answer, one count, whatever the families.
			for series, want := range map[string]string{
				`kubeproxy_proxy_healthz_total{code="200"}`: "2",
				`kubeproxy_proxy_livez_total{code="200"}`:   "1",
			} {
				if got[series] != want {
					t.Errorf("%s = %q, want %q", series, got[series], want)
				}
			}
			for series := range got {
				f, ok := seriesFamily(series)
				// The health answers and, as in kube-proxy 1.36, the
				// change counts have no family.
				familyless := strings.HasPrefix(series, "kubeproxy_proxy_") || strings.Contains(series, "_changes_")
				if !ok && strings.HasPrefix(series, "kubeproxy_") && !familyless {
					t.Errorf("%s has no ip_family", series)
				}
				if ok && familyless {
					t.Errorf("%s has an ip_family, which kube-proxy's has not", series)
				}
				if ok && !slices.Contains(tc.families, f) {
					t.Errorf("%s: a family the proxy does not serve", series)
				}
			}
		})
	}
}

// scrapeMetrics reads the real /metrics handler of m: each series (name
// and labels, as printed) and its value.
func scrapeMetrics(t *testing.T, m *metrics) map[string]string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d: %s", rec.Code, rec.Body)
	}
	out := map[string]string{}
	for line := range strings.SplitSeq(rec.Body.String(), "\n") {
		if i := strings.LastIndexByte(line, ' '); i > 0 && !strings.HasPrefix(line, "#") {
			out[line[:i]] = line[i+1:]
		}
	}
	return out
}

// seriesFamily returns the ip_family label of a series as scrapeMetrics
// names it.
func seriesFamily(series string) (string, bool) {
	_, rest, ok := strings.Cut(series, `ip_family="`)
	if !ok {
		return "", false
	}
	f, _, _ := strings.Cut(rest, `"`)
	return f, true
}

// TestListeningFamilies: the log of a wildcard listener names the
// families it takes: a [::] socket takes IPv6 only where the host has it
// (with disable_ipv6=1 it still binds, but serves IPv4 alone).
func TestListeningFamilies(t *testing.T) {
	ln, err := net.Listen("tcp", "[::]:0")
	if err != nil {
		t.Skipf("no IPv6 wildcard socket here: %v", err)
	}
	defer ln.Close()
	for _, tc := range []struct {
		name string
		host []string
		want string
	}{
		{"dual-stack host", []string{"IPv4", "IPv6"}, "IPv4,IPv6"},
		{"IPv6 off", []string{"IPv4"}, "IPv4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := listening("[::]:10256", ln, tc.host)
			if got := fmt.Sprint(kv[len(kv)-1]); got != tc.want {
				t.Errorf("families=%s, want %s (%v)", got, tc.want, kv)
			}
		})
	}
}

// TestBusyServerAddressHint: an address /healthz or /metrics cannot bind
// is reported with what to do. A flag may be emptied to turn the server
// off; a --config file's field may not (empty means kube-proxy's default
// address there), so only a free address is suggested.
func TestBusyServerAddressHint(t *testing.T) {
	holder, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	busy := holder.Addr().String()
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, tc := range []struct {
		name, file string
		args       []string
		flag, want string
		wantOff    bool
	}{
		{"healthz flag", "", []string{"--healthz-bind-address=" + busy}, "healthz-bind-address", "set --healthz-bind-address to a free address, or to empty to turn it off", true},
		{"metrics flag", "", []string{"--metrics-bind-address=" + busy}, "metrics-bind-address", "set --metrics-bind-address to a free address, or to empty to turn it off", true},
		{"healthz field", head + "healthzBindAddress: " + busy + "\n", nil, "healthz-bind-address", ": healthzBindAddress to a free address)", false},
		{"metrics field", head + "metricsBindAddress: " + busy + "\n", nil, "metrics-bind-address", ": metricsBindAddress to a free address)", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig(t, tc.file, tc.args...)
			addr := c.healthz
			if tc.flag == "metrics-bind-address" {
				addr = c.metrics
			}
			var buf strings.Builder
			klog.LogToStderr(false)
			klog.SetOutput(&buf)
			t.Cleanup(func() { klog.LogToStderr(true) })
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // one try, reported, and no retry
			serveHTTP(ctx, "/x", c.where(tc.flag), addr, nil, http.NotFoundHandler(), time.Hour)
			klog.Flush()
			if !strings.Contains(buf.String(), tc.want) {
				t.Errorf("the log does not say %q:\n%s", tc.want, buf.String())
			}
			if off := strings.Contains(buf.String(), "turn it off"); off != tc.wantOff {
				t.Errorf("offers to turn the server off: %v, want %v:\n%s", off, tc.wantOff, buf.String())
			}
		})
	}
}

// TestBindAddressHardFail: as kube-proxy, with --bind-address-hard-fail
// (or the --config file's bindAddressHardFail) an address /healthz or
// /metrics cannot listen on ends the proxy at start, with an error that
// names the address, what set it and the setting.
func TestBindAddressHardFail(t *testing.T) {
	holder, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	busy := holder.Addr().String()
	manifests := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(manifests, []byte("# no Services\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	head := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	common := []string{"--manifests=" + manifests, "--portal=none", "--hostname-override=node"}
	for _, tc := range []struct {
		name, file string
		args       []string
		want       []string
	}{
		{"healthz, flags", "", []string{"--bind-address-hard-fail", "--healthz-bind-address=" + busy, "--metrics-bind-address="},
			[]string{"cannot serve /healthz and /livez on " + busy + " (--healthz-bind-address)", "--bind-address-hard-fail is set, so this is fatal"}},
		{"metrics, flags", "", []string{"--bind-address-hard-fail=true", "--healthz-bind-address=", "--metrics-bind-address=" + busy},
			[]string{"cannot serve /metrics on " + busy + " (--metrics-bind-address)", "--bind-address-hard-fail is set"}},
		{"metrics, file", head + "bindAddressHardFail: true\nhealthzBindAddress: 127.0.0.1:0\nmetricsBindAddress: " + busy + "\n", nil,
			[]string{"cannot serve /metrics on " + busy + " (--config ", ": metricsBindAddress)", ": bindAddressHardFail is set, so this is fatal", "metricsBindAddress to a free address)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig(t, tc.file, append(slices.Clone(common), tc.args...)...)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			err = Run(ctx, c)
			if err == nil || ctx.Err() != nil {
				t.Fatalf("Run: %v (context: %v), want a start-up error at once", err, ctx.Err())
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
		})
	}
	if got := inapplicable(mustDecode(t, head+"bindAddressHardFail: true\n")); len(got) != 0 {
		t.Errorf("bindAddressHardFail named as ignored: %v", got)
	}
	c, err := loadConfig(t, "", "--bind-address-hard-fail")
	if err != nil || slices.Contains(c.ignoredKubeProxyFlags(), "--bind-address-hard-fail") {
		t.Errorf("--bind-address-hard-fail named as ignored: %v, %v", err, c.ignoredKubeProxyFlags())
	}
}

// TestServeHTTPOnOpenListener: what listenHardFail opened is what
// serveHTTP serves on.
func TestServeHTTPOnOpenListener(t *testing.T) {
	ln, err := listenHardFail("/x", "--x", "127.0.0.1:0", "--hard")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveHTTP(ctx, "/x", "--x", "127.0.0.1:1", ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("served"))
		}), time.Hour)
	}()
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "served" {
		t.Errorf("answer %q, want served", body)
	}
	cancel()
	<-done
}
