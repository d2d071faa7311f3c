package proxyserver

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

func snapOf(n int) state.Snapshot {
	var ports []state.ServicePort
	for i := range n {
		ports = append(ports, state.ServicePort{Name: state.ServicePortName{Namespace: "ns", Name: string(rune('a' + i)), Protocol: state.TCP}})
	}
	return state.NewSnapshot(ports)
}

func TestSyncLoopCoalescesAndRetries(t *testing.T) {
	applied := make(chan int, 100)
	release := make(chan struct{})
	started := make(chan struct{})
	var mu sync.Mutex
	failures := 1
	apply := func(s state.Snapshot) error {
		if s.Len() == 1 {
			close(started)
			<-release // hold the first apply while more offers arrive
		}
		applied <- s.Len()
		mu.Lock()
		defer mu.Unlock()
		if s.Len() == 5 && failures > 0 {
			failures--
			return errors.New("transient")
		}
		return nil
	}
	l := newSyncLoop(apply, 10*time.Millisecond, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	l.offer(snapOf(1))
	// While the first apply is held, three more offers arrive: only the
	// last one is applied next.
	<-started
	l.offer(snapOf(3))
	l.offer(snapOf(4))
	l.offer(snapOf(5))
	close(release)
	want := []int{1, 5, 5} // the failed 5 is retried after retryMin
	for i, w := range want {
		select {
		case got := <-applied:
			if got != w {
				t.Fatalf("apply %d got a snapshot of %d ports, want %d", i, got, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("apply %d did not happen", i)
		}
	}
	select {
	case got := <-applied:
		t.Fatalf("unexpected extra apply of %d ports after success", got)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestJoinErrorsStaysShort: a sync with many failing service ports logs a
// line that names the first few and counts the rest.
func TestJoinErrorsStaysShort(t *testing.T) {
	var errs []error
	for i := range 25 {
		errs = append(errs, fmt.Errorf("service s%d: proxy port range exhausted", i))
	}
	got := joinErrors(errs...).Error()
	for _, want := range []string{"25 errors: service s0: proxy port range exhausted; ", "service s9:", "; and 15 more"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "service s10:") {
		t.Errorf("%q spells out more than 10 errors", got)
	}
}

// scriptedSyncLoop runs a dual-stack sync loop with metrics whose every
// apply takes its result from results and then says so on applied; it
// stops when the test ends. Drive it with syncWith, which fails the test
// rather than block should the loop not come to an apply.
func scriptedSyncLoop(t *testing.T) (l *syncLoop, m *metrics, results chan error, applied chan struct{}) {
	var stats userspace.Stats
	m = newMetrics(&stats, []string{"IPv4", "IPv6"})
	results = make(chan error)
	applied = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	l = newSyncLoop(func(state.Snapshot) error {
		select {
		case err := <-results:
			select {
			case applied <- struct{}{}:
			case <-ctx.Done():
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}, 10*time.Millisecond, time.Hour)
	l.metrics = m
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(scriptTimeout):
			t.Errorf("the sync loop did not stop within %v of its context's end", scriptTimeout)
		}
	})
	return l, m, results, applied
}

// scriptTimeout bounds each step of a scripted sync loop.
const scriptTimeout = 10 * time.Second

// syncWith has the scripted loop's next apply return err, and waits for
// it to have taken it; what names the apply in the failure.
func syncWith(t *testing.T, results chan<- error, applied <-chan struct{}, err error, what string) {
	t.Helper()
	select {
	case results <- err:
	case <-time.After(scriptTimeout):
		t.Fatalf("%s: the sync loop did not start an apply within %v", what, scriptTimeout)
	}
	select {
	case <-applied:
	case <-time.After(scriptTimeout):
		t.Fatalf("%s: the apply did not end within %v", what, scriptTimeout)
	}
}

// TestSyncLoopObservesProgrammingLatency: the change triggers of the
// offers a sync applied are observed once that sync succeeds, each in its
// own IP family, including those of offers it coalesced; a failure of the
// portal keeps them until a sync succeeds.
func TestSyncLoopObservesProgrammingLatency(t *testing.T) {
	l, m, results, applied := scriptedSyncLoop(t)
	// value reads a series of /metrics once it is want, or after 5 s.
	value := func(series, want string) string {
		var got string
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			rec := httptest.NewRecorder()
			m.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			got = "missing"
			for line := range strings.SplitSeq(rec.Body.String(), "\n") {
				if v, ok := strings.CutPrefix(line, series+" "); ok {
					got = v
				}
			}
			if got == want {
				break
			}
		}
		return got
	}
	const count = `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`

	snap := func(family state.IPFamily, ago ...time.Duration) state.Snapshot {
		s := snapOf(1)
		for _, d := range ago {
			s.ChangeTriggers = append(s.ChangeTriggers, state.ChangeTrigger{At: time.Now().Add(-d), Family: family})
		}
		return s
	}
	l.offer(snap(state.IPv4, 2*time.Second, time.Second, -time.Hour)) // the last from a clock an hour ahead: left out
	l.offer(snap(state.IPv6, time.Second))                            // coalesces with the first
	syncWith(t, results, applied, kernelError{errors.New("iptables-restore failed")}, "the failing sync")
	// The failure is counted in the same step that would observe them.
	if f := value(`kube_userspace_proxy_sync_failures_total{cause="portal"}`, "1"); f != "1" {
		t.Fatalf("portal failures %s, want 1", f)
	}
	if c := value(count, "0"); c != "0" {
		t.Fatalf("after a failed sync: %s observations, want 0", c)
	}
	syncWith(t, results, applied, nil, "the retry")
	if c := value(count, "2"); c != "2" {
		t.Fatalf("after the sync that applied them: %s IPv4 observations, want 2", c)
	}
	// Each family observes its own changes, as kube-proxy's proxier of
	// that family does.
	if c := value(`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv6"}`, "1"); c != "1" {
		t.Fatalf("after the sync that applied them: %s IPv6 observations, want 1", c)
	}

	// A pass that leaves the portal to --iptables-min-sync-period is not
	// a sync: the one that finishes the work is, as kube-proxy's syncs
	// are rate-limited whole.
	const durations = `kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	if c := value(durations, "2"); c != "2" {
		t.Fatalf("a failed sync and its retry: %s sync durations, want 2", c)
	}
	l.offer(snap(state.IPv4))
	syncWith(t, results, applied, errDeferred{after: 10 * time.Millisecond}, "the deferred pass")
	syncWith(t, results, applied, nil, "the pass after the deferral")
	if c := value(durations, "3"); c != "3" {
		t.Fatalf("a deferred pass and the sync that finished it: %s sync durations, want 3", c)
	}
}

// TestSyncLoopCountsChanges: every offer adds the Services it names to
// the change totals; the pending gauges hold the distinct Services with
// changes no sync has applied, those of offers a sync coalesced
// included, keep them while the portal fails, and drop to 0 once a sync
// applies them. The series have no ip_family, as kube-proxy's.
func TestSyncLoopCountsChanges(t *testing.T) {
	l, m, results, applied := scriptedSyncLoop(t)

	const (
		svcTotal = "kubeproxy_sync_proxy_rules_service_changes_total"
		svcPend  = "kubeproxy_sync_proxy_rules_service_changes_pending"
		epTotal  = "kubeproxy_sync_proxy_rules_endpoint_changes_total"
		epPend   = "kubeproxy_sync_proxy_rules_endpoint_changes_pending"
	)
	check := func(step string, want map[string]string) {
		t.Helper()
		got := scrapeMetrics(t, m)
		for series, v := range want {
			if got[series] != v {
				t.Errorf("%s: %s = %q, want %q", step, series, got[series], v)
			}
		}
	}
	check("at start", map[string]string{svcTotal: "0", svcPend: "0", epTotal: "0", epPend: "0"})

	names := func(n ...string) []state.ServiceName {
		var out []state.ServiceName
		for _, s := range n {
			out = append(out, state.ServiceName{Namespace: "ns", Name: s})
		}
		return out
	}
	snap := func(c state.Changes) state.Snapshot {
		s := snapOf(2)
		s.Changes = c
		return s
	}
	// Two offers before the first sync ends: a's Service changes in
	// both, b's endpoints in the second.
	l.offer(snap(state.Changes{Services: names("a"), Endpoints: names("a")}))
	l.offer(snap(state.Changes{Services: names("a"), Endpoints: names("b")}))
	check("offered", map[string]string{svcTotal: "2", svcPend: "1", epTotal: "2", epPend: "2"})

	syncWith(t, results, applied, kernelError{errors.New("iptables-restore failed")}, "the failing sync")
	check("after a failed sync", map[string]string{svcTotal: "2", svcPend: "1", epTotal: "2", epPend: "2"})

	syncWith(t, results, applied, nil, "the retry, which applies both offers")
	// An offer that changes nothing is applied after the retry has been
	// recorded: scraping then sees the retry's effect.
	l.offer(snap(state.Changes{}))
	syncWith(t, results, applied, nil, "the empty offer")
	check("after the sync that applied them", map[string]string{svcTotal: "2", svcPend: "0", epTotal: "2", epPend: "0"})
}

// TestSyncLoopLogsEachFailureOnce: as service ports fail one by one (a
// full proxy port range), each failure is logged once, when it first
// happens, not again beside every later one (xa52: 71 lines naming 1, 2,
// ..., 71 failures).
func TestSyncLoopLogsEachFailureOnce(t *testing.T) {
	buf := captureLog(t)
	applied := make(chan struct{}, 10)
	apply := func(s state.Snapshot) error {
		defer func() { applied <- struct{}{} }()
		var errs []error
		for i := range s.Len() {
			errs = append(errs, fmt.Errorf("service port %d: no proxy port left", i))
		}
		return joinErrors(errs...)
	}
	l := newSyncLoop(apply, time.Hour, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	for n := 1; n <= 4; n++ {
		l.offer(snapOf(n))
		select {
		case <-applied:
		case <-time.After(5 * time.Second):
			t.Fatalf("snapshot %d was not applied", n)
		}
	}
	cancel()
	<-done
	klog.Flush()
	log := buf.String()
	for i := range 4 {
		if n := strings.Count(log, fmt.Sprintf("service port %d:", i)); n != 1 {
			t.Errorf("service port %d's failure logged %d times, want once:\n%s", i, n, log)
		}
	}
	if !strings.Contains(log, "alsoFailingAsBefore=3") {
		t.Errorf("the last line does not count the failures logged before:\n%s", log)
	}
}

// TestIgnoredHintsLogged: why a service port's topology hints are ignored
// is logged at -v=2, as kube-proxy logs it, once per change of the
// reason: not again at each snapshot that keeps it (a manifest edit
// elsewhere, a slice change that leaves the reason as it is).
func TestIgnoredHintsLogged(t *testing.T) {
	var klogFlags flag.FlagSet
	klog.InitFlags(&klogFlags)
	var buf bytes.Buffer
	klog.LogToStderr(false)
	klog.SetOutput(&buf)
	_ = klogFlags.Set("v", "2")
	t.Cleanup(func() {
		_ = klogFlags.Set("v", "0")
		klog.LogToStderr(true)
	})
	name := state.ServicePortName{Namespace: "demo", Name: "hinted", Port: "http", Protocol: state.TCP}
	other := state.ServicePortName{Namespace: "demo", Name: "other", Port: "http", Protocol: state.TCP}
	snap := func(why string, more ...state.ServicePortName) state.Snapshot {
		ports := []state.ServicePort{{Name: name, Port: 80, TopologyHintsIgnored: why}}
		for _, n := range more {
			ports = append(ports, state.ServicePort{Name: n, Port: 80})
		}
		return state.NewSnapshot(ports)
	}
	const line = `"Ignoring topology hints for service" service="demo/hinted:http/TCP" reason=`
	l := newSyncLoop(func(state.Snapshot) error { return nil }, time.Hour, time.Hour)
	for _, step := range []struct {
		what string
		snap state.Snapshot
		want string // the line logged, or "" for none
	}{
		{"no zone hint for this zone", snap("zone hints ignored: none is for zone zone-x"), line + `"zone hints ignored: none is for zone zone-x"`},
		{"another Service added", snap("zone hints ignored: none is for zone zone-x", other), ""},
		{"another reason", snap("zone hints ignored: only 1 of 2 ready endpoints carry one"), line + `"zone hints ignored: only 1 of 2 ready endpoints carry one"`},
		{"hints used", snap(""), `"Topology hints for service no longer ignored: they are used, or gone" service="demo/hinted:http/TCP"`},
		{"still used", snap(""), ""},
	} {
		buf.Reset()
		l.offer(step.snap)
		klog.Flush()
		got := strings.TrimSpace(buf.String())
		if step.want == "" && got != "" || step.want != "" && (!strings.HasSuffix(got, step.want) || strings.Contains(got, "\n")) {
			t.Errorf("%s: logged\n%s\nwant %s", step.what, got, cmp.Or(step.want, "nothing"))
		}
	}
}

// TestSyncFailuresPastTheLineAreNamedNext: a line names at most
// maxShownErrors failures; those past it are named by the next line, not
// taken as logged, and failures that are over while others go on are
// counted (xa53: 15 failing, 10 fixed, and the 5 left were never named).
func TestSyncFailuresPastTheLineAreNamedNext(t *testing.T) {
	buf := captureLog(t)
	failing := func(from, to int) error {
		var errs []error
		for i := from; i <= to; i++ {
			errs = append(errs, fmt.Errorf("userspace: service e2e/a%02d:tcp/TCP: listen: bind: address already in use", i))
		}
		return joinErrors(errs...)
	}
	var logged map[string]bool
	for _, err := range []error{failing(1, 15), failing(1, 15), failing(11, 15), failing(11, 15)} {
		logged = logSyncFailure(err, logged, false, "retryIn", time.Second)
	}
	klog.Flush()
	log := buf.String()
	for i := 1; i <= 15; i++ {
		if n := strings.Count(log, fmt.Sprintf("e2e/a%02d:", i)); n != 1 {
			t.Errorf("a%02d named %d times, want once:\n%s", i, n, log)
		}
	}
	for _, want := range []string{"and 5 more", "alsoFailingAsBefore=10", `"Some sync failures are over" over=10 stillFailing=5`} {
		if !strings.Contains(log, want) {
			t.Errorf("lacks %q:\n%s", want, log)
		}
	}
	if len(logged) != 5 {
		t.Errorf("%d failures taken as logged at the end, want the 5 left", len(logged))
	}
}

// lockedLog is klog's output for a test whose lines come from other
// goroutines; wrote is poked at each write.
type lockedLog struct {
	mu    sync.Mutex // guards b
	b     strings.Builder
	wrote chan struct{}
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case l.wrote <- struct{}{}:
	default:
	}
	return l.b.Write(p)
}

func (l *lockedLog) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedLog) count(s string) int { return strings.Count(l.text(), s) }

// TestSyncLoopLogsStalledSync: a sync that hangs (an iptables-restore
// waiting for the xtables lock) fails nothing, so nothing was logged while
// /healthz turned 503 and pointed at the log's sync errors. It is logged
// after stallFirst and every stallEvery while it runs, and /healthz says a
// sync has run that long; once it ends, neither says so.
func TestSyncLoopLogsStalledSync(t *testing.T) {
	logs := &lockedLog{wrote: make(chan struct{}, 1)}
	klog.LogToStderr(false)
	klog.SetOutput(logs)
	t.Cleanup(func() { klog.Flush(); klog.LogToStderr(true) })

	entered, release := make(chan struct{}, 2), make(chan struct{})
	calls := 0
	l := newSyncLoop(func(state.Snapshot) error {
		calls++
		entered <- struct{}{}
		if calls == 2 {
			<-release
		}
		return nil
	}, 10*time.Millisecond, time.Hour)
	l.stallFirst, l.stallEvery = 20*time.Millisecond, 30*time.Millisecond
	l.health = newProxyHealth(10 * time.Millisecond) // less than the wait for the lines
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	l.offer(snapOf(2))
	<-entered // applied at once
	l.offer(snapOf(3))
	<-entered // hangs
	deadline := time.After(10 * time.Second)
	for logs.count(`"Sync still running"`) < 2 {
		select {
		case <-logs.wrote:
		case <-deadline:
			t.Fatalf("a sync hanging for seconds logged %d \"Sync still running\" lines, want 2:\n%s", logs.count(`"Sync still running"`), logs.text())
		}
	}
	if r, code := l.health.report(true); code != http.StatusServiceUnavailable ||
		!strings.Contains(r.Reason, "a change has waited more than 10ms to be applied: a sync has been running for ") ||
		!strings.HasSuffix(r.Reason, " and has not finished") {
		t.Errorf("/healthz while a sync hangs: %d, reason %q", code, r.Reason)
	}
	if text := logs.text(); !strings.Contains(text, `servicePorts=3 version=2 logEvery="30ms"`) {
		t.Errorf("the line does not say what the sync applies:\n%s", text)
	}

	close(release)
	l.offer(snapOf(3))
	<-entered // the sync that hung has ended
	lines := logs.count(`"Sync still running"`)
	cancel()
	<-done
	klog.Flush()
	if n := logs.count(`"Sync still running"`); n != lines {
		t.Errorf("%d \"Sync still running\" lines after the sync ended", n-lines)
	}
	l.health.mu.Lock()
	defer l.health.mu.Unlock()
	if !l.health.syncSince.IsZero() {
		t.Errorf("health still has a sync running since %v", l.health.syncSince)
	}
}
