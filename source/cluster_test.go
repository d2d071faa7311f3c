package source

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

var webHTTP = state.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: state.TCP}

// clusterRun is a Cluster running in a synctest bubble, with what it did.
type clusterRun struct {
	t        *testing.T
	client   *fake.Clientset
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once

	mu      sync.Mutex // guards the fields below
	applied []state.Snapshot
	builds  int
	noops   int // builds that did not call apply
	block   chan struct{}
}

// runCluster starts a Cluster on client inside the current synctest
// bubble. Call it from within synctest.Test; stop it with stop.
func runCluster(t *testing.T, client *fake.Clientset, mods ...func(*Cluster)) *clusterRun {
	t.Helper()
	r := &clusterRun{t: t, client: client, done: make(chan error, 1)}
	c := &Cluster{Client: client, NodeName: "node-a"}
	c.built = func(applied bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.builds++
		if !applied {
			r.noops++
		}
	}
	for _, m := range mods {
		m(c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	t.Cleanup(r.stop)
	go func() {
		r.done <- c.Run(ctx, func(s state.Snapshot) {
			r.mu.Lock()
			r.applied = append(r.applied, s)
			block := r.block
			r.mu.Unlock()
			if block != nil {
				<-block
			}
		})
	}()
	return r
}

// stop stops the Cluster and waits for Run to return. runCluster makes
// it a cleanup, so the bubble ends with no goroutine left.
func (r *clusterRun) stop() {
	r.t.Helper()
	r.stopOnce.Do(func() {
		r.cancel()
		if err := <-r.done; err != nil {
			r.t.Errorf("Run: %v", err)
		}
	})
}

// counts returns how many snapshots were applied and built.
func (r *clusterRun) counts() (applied, builds, noops int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applied), r.builds, r.noops
}

func (r *clusterRun) last() state.Snapshot {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.applied) == 0 {
		r.t.Fatal("nothing applied")
	}
	return r.applied[len(r.applied)-1]
}

// clusterEndpoints returns the cluster endpoints of demo/web:http in the
// last snapshot applied.
func (r *clusterRun) clusterEndpoints() []string {
	r.t.Helper()
	sp := r.last().Get(webHTTP)
	if sp == nil {
		r.t.Fatalf("%s not in the last snapshot", webHTTP)
	}
	return addrs(sp.ClusterEndpoints)
}

// settle lets fake time pass (the informers poll and back off) and waits
// until every goroutine of the bubble is blocked.
func settle() {
	time.Sleep(time.Second)
	synctest.Wait()
}

func withRV(rv string) func(*discoveryv1.EndpointSlice) {
	return func(s *discoveryv1.EndpointSlice) { s.ResourceVersion = rv }
}

func webSlice(rv string, addrs ...string) *discoveryv1.EndpointSlice {
	var eps []discoveryv1.Endpoint
	for _, a := range addrs {
		eps = append(eps, endpoint(a))
	}
	return endpointSlice("web-1", discoveryv1.AddressTypeIPv4, eps, withRV(rv))
}

func updateSlice(t *testing.T, client *fake.Clientset, s *discoveryv1.EndpointSlice) {
	t.Helper()
	if _, err := client.DiscoveryV1().EndpointSlices(s.Namespace).Update(t.Context(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestClusterWaitsForBothCaches(t *testing.T) {
	// HandleError's rate limiter measures from the real time of its
	// creation, which is years after the bubble's fake clock: it would put
	// the failing reflector to sleep for decades. Log errors only.
	saved := utilruntime.ErrorHandlers
	utilruntime.ErrorHandlers = saved[:1:1]
	t.Cleanup(func() { utilruntime.ErrorHandlers = saved })
	for _, kind := range []string{"services", "endpointslices", "nodes"} {
		t.Run(kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := fake.NewClientset(service("web"), webSlice("1", "10.0.0.1"))
				// The list fails until released; the informer retries.
				// (A reactor must not block: the fake holds its lock.)
				var released atomic.Bool
				client.PrependReactor("list", kind, func(k8stesting.Action) (bool, runtime.Object, error) {
					if released.Load() {
						return false, nil, nil // on to the object tracker
					}
					return true, nil, apierrors.NewServiceUnavailable("not yet")
				})
				r := runCluster(t, client)
				// Short of nodeSyncWait, after which the Node is no
				// longer waited for: at it, which comes first is chance.
				time.Sleep(nodeSyncWait - time.Second)
				synctest.Wait()
				if n, _, _ := r.counts(); n != 0 {
					t.Fatalf("applied %d snapshots before %s synced", n, kind)
				}
				released.Store(true)
				time.Sleep(5 * time.Minute) // the informer's backoff, at most 1 min
				synctest.Wait()
				if n, _, _ := r.counts(); n != 1 {
					t.Fatalf("applied %d snapshots after sync, want 1", n)
				}
				if got := r.clusterEndpoints(); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
					t.Errorf("endpoints %v", got)
				}
			})
		})
	}
}

func TestClusterAppliesAnEmptyClusterOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runCluster(t, fake.NewClientset())
		settle()
		if n, _, _ := r.counts(); n != 1 || r.last().Len() != 0 {
			t.Fatalf("want one empty snapshot, got %d (last has %d ports)", n, r.last().Len())
		}
	})
}

func TestClusterFollowsChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(service("web"), webSlice("1", "10.0.0.1"))
		r := runCluster(t, client)
		settle()

		updateSlice(t, client, webSlice("2", "10.0.0.1", "10.0.0.2"))
		settle()
		if got := r.clusterEndpoints(); !slices.Equal(got, []string{"10.0.0.1:8080", "10.0.0.2:8080"}) {
			t.Errorf("after scale up: %v", got)
		}

		svc := service("web", func(s *corev1.Service) {
			s.ResourceVersion = "2"
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
		})
		if _, err := client.CoreV1().Services("demo").Update(t.Context(), svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		if a := r.last().Get(webHTTP).Affinity; a != (state.Affinity{Type: state.AffinityClientIP, Timeout: time.Minute}) {
			t.Errorf("affinity %+v", a)
		}

		if err := client.DiscoveryV1().EndpointSlices("demo").Delete(t.Context(), "web-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		if got := r.clusterEndpoints(); len(got) != 0 {
			t.Errorf("after the slice was deleted: %v", got)
		}
		if err := client.CoreV1().Services("demo").Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		if r.last().Len() != 0 {
			t.Errorf("after the service was deleted: %d ports", r.last().Len())
		}
		if n, _, noops := r.counts(); n != 5 || noops != 0 {
			t.Fatalf("applied %d snapshots (%d builds without a change), want 5 and 0", n, noops)
		}
		// Each snapshot names the Service its change touched, as a
		// Service change, an endpoint change or both.
		web := []state.ServiceName{{Namespace: "demo", Name: "web"}}
		for i, want := range []state.Changes{
			{Services: web, Endpoints: web}, // first sync: everything is new
			{Endpoints: web},                // scaled up
			{Services: web},                 // affinity
			{Endpoints: web},                // slice deleted
			{Services: web},                 // Service deleted, without endpoints by then
		} {
			if got := r.applied[i].Changes; !reflect.DeepEqual(got, want) {
				t.Errorf("snapshot %d: changes %+v, want %+v", i, got, want)
			}
		}
	})
}

// While apply is busy, any number of changes produce one more snapshot.
func TestClusterCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(service("web"), webSlice("1", "10.0.0.1"))
		r := runCluster(t, client)
		settle()

		block := make(chan struct{})
		r.mu.Lock()
		r.block = block
		r.mu.Unlock()
		updateSlice(t, client, webSlice("2", "10.0.0.2"))
		settle() // apply of 10.0.0.2 is now blocked
		for i := range 20 {
			updateSlice(t, client, webSlice(string(rune('a'+i)), "10.0.0.3"))
		}
		settle()
		if n, _, _ := r.counts(); n != 2 {
			t.Fatalf("%d snapshots applied while apply was blocked, want 2", n)
		}
		r.mu.Lock()
		r.block = nil
		r.mu.Unlock()
		close(block)
		settle()
		if n, _, _ := r.counts(); n != 3 {
			t.Errorf("%d snapshots applied, want 3: the 20 changes in one", n)
		}
		if got := r.clusterEndpoints(); !slices.Equal(got, []string{"10.0.0.3:8080"}) {
			t.Errorf("endpoints %v", got)
		}
	})
}

func TestClusterIgnoresResyncsAndNoOpUpdates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := service("web", func(s *corev1.Service) { s.ResourceVersion = "1" })
		client := fake.NewClientset(svc, webSlice("1", "10.0.0.1"))
		r := runCluster(t, client, func(c *Cluster) { c.ConfigSyncPeriod = time.Second })
		settle()
		_, builds, _ := r.counts()

		time.Sleep(10 * time.Second) // ten resyncs of every informer
		synctest.Wait()
		if n, b, _ := r.counts(); n != 1 || b != builds {
			t.Errorf("resyncs: %d snapshots applied and %d built, want 1 and %d", n, b, builds)
		}

		// Status, annotations and unrelated labels change nothing served.
		svc = svc.DeepCopy()
		svc.ResourceVersion = "2"
		svc.Annotations = map[string]string{"note": "x"}
		svc.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Test"}}
		if _, err := client.CoreV1().Services("demo").UpdateStatus(t.Context(), svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		slice := webSlice("2", "10.0.0.1")
		slice.Labels["unrelated"] = "yes"
		updateSlice(t, client, slice)
		settle()
		if n, b, noops := r.counts(); n != 1 || noops == 0 || b-builds != noops {
			t.Errorf("no-op updates: %d snapshots applied, %d built, %d without change; want 1 applied and none changed", n, b-builds, noops)
		}
	})
}

func TestClusterNodeZone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "1",
			Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}}
		other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b", ResourceVersion: "1",
			Labels: map[string]string{corev1.LabelTopologyZone: "zone-b"}}}
		slice := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{
			endpoint("10.0.0.1", zoneHints("zone-a")),
			endpoint("10.0.0.2", zoneHints("zone-b")),
		})
		client := fake.NewClientset(service("web"), slice, node, other)
		r := runCluster(t, client)
		settle()
		if got := r.clusterEndpoints(); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
			t.Errorf("in zone-a: %v", got)
		}

		node = node.DeepCopy()
		node.ResourceVersion = "2"
		node.Labels[corev1.LabelTopologyZone] = "zone-b"
		if _, err := client.CoreV1().Nodes().Update(t.Context(), node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		if got := r.clusterEndpoints(); !slices.Equal(got, []string{"10.0.0.2:8080"}) {
			t.Errorf("in zone-b: %v", got)
		}

		// Another node's labels are not this node's.
		other = other.DeepCopy()
		other.ResourceVersion = "2"
		other.Labels[corev1.LabelTopologyZone] = "zone-a"
		if _, err := client.CoreV1().Nodes().Update(t.Context(), other, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		if got := r.clusterEndpoints(); !slices.Equal(got, []string{"10.0.0.2:8080"}) {
			t.Errorf("after another node moved: %v", got)
		}

		// Without its Node, this node has no zone: hints are ignored.
		if err := client.CoreV1().Nodes().Delete(t.Context(), "node-a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		if got := r.clusterEndpoints(); !slices.Equal(got, []string{"10.0.0.1:8080", "10.0.0.2:8080"}) {
			t.Errorf("without a Node: %v", got)
		}
	})
}

func TestClusterLocalEndpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := service("web", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		})
		slice := endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{
			endpoint("10.0.0.1", onNode("node-a")),
			endpoint("10.0.0.2", onNode("node-b")),
		})
		r := runCluster(t, fake.NewClientset(svc, slice))
		settle()
		sp := r.last().Get(webHTTP)
		if got := addrs(sp.InternalEndpoints()); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
			t.Errorf("internal endpoints %v, want node-a's only", got)
		}
	})
}

// The cluster source refuses what only the manifest source may allow.
func TestClusterRefusesLoopbackAndMetadata(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runCluster(t, fake.NewClientset(service("web"), webSlice("1", "127.0.0.1", "169.254.169.254", "10.0.0.1")))
		settle()
		if got := r.clusterEndpoints(); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
			t.Errorf("endpoints %v", got)
		}
	})
}

func TestClusterNeedsAClient(t *testing.T) {
	if err := (&Cluster{}).Run(t.Context(), func(state.Snapshot) {}); err == nil {
		t.Fatal("Run without a client did not fail")
	}
}

func TestClusterSliceHandler(t *testing.T) {
	web := objectRef{"demo", "web"}
	slice := webSlice("1", "10.0.0.1")
	newer := webSlice("2", "10.0.0.1")
	moved := webSlice("2", "10.0.0.1")
	moved.Labels[discoveryv1.LabelServiceName] = "api"
	orphan := webSlice("2", "10.0.0.1")
	delete(orphan.Labels, discoveryv1.LabelServiceName)
	tests := []struct {
		name  string
		event func(cache.ResourceEventHandler)
		dirty []objectRef // nil: nothing marked
		all   bool
	}{
		{"add", func(h cache.ResourceEventHandler) { h.OnAdd(slice, false) }, []objectRef{web}, false},
		{"update", func(h cache.ResourceEventHandler) { h.OnUpdate(slice, newer) }, []objectRef{web}, false},
		{"moved to another service", func(h cache.ResourceEventHandler) { h.OnUpdate(slice, moved) }, []objectRef{{"demo", "api"}, web}, false},
		{"label removed", func(h cache.ResourceEventHandler) { h.OnUpdate(slice, orphan) }, []objectRef{{"demo", ""}, web}, false},
		{"resync", func(h cache.ResourceEventHandler) { h.OnUpdate(slice, slice.DeepCopy()) }, nil, false},
		{"update without resourceVersion", func(h cache.ResourceEventHandler) {
			h.OnUpdate(webSlice("", "10.0.0.1"), webSlice("", "10.0.0.2"))
		}, []objectRef{web}, false},
		{"delete", func(h cache.ResourceEventHandler) { h.OnDelete(slice) }, []objectRef{web}, false},
		{"tombstone", func(h cache.ResourceEventHandler) {
			h.OnDelete(cache.DeletedFinalStateUnknown{Key: "demo/web-1", Obj: slice})
		}, []objectRef{web}, false},
		{"empty tombstone", func(h cache.ResourceEventHandler) {
			h.OnDelete(cache.DeletedFinalStateUnknown{Key: "demo/web-1"})
		}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkMarked(t, tc.event, (*tracker).sliceHandler, tc.dirty, tc.all)
		})
	}
}

func TestClusterServiceHandler(t *testing.T) {
	web := objectRef{"demo", "web"}
	svc := service("web", func(s *corev1.Service) { s.ResourceVersion = "1" })
	newer := service("web", func(s *corev1.Service) { s.ResourceVersion = "2" })
	tests := []struct {
		name  string
		event func(cache.ResourceEventHandler)
		dirty []objectRef
	}{
		{"add", func(h cache.ResourceEventHandler) { h.OnAdd(svc, false) }, []objectRef{web}},
		{"update", func(h cache.ResourceEventHandler) { h.OnUpdate(svc, newer) }, []objectRef{web}},
		{"resync", func(h cache.ResourceEventHandler) { h.OnUpdate(svc, svc.DeepCopy()) }, nil},
		{"delete", func(h cache.ResourceEventHandler) { h.OnDelete(svc) }, []objectRef{web}},
		{"tombstone", func(h cache.ResourceEventHandler) {
			h.OnDelete(cache.DeletedFinalStateUnknown{Key: "demo/web", Obj: svc})
		}, []objectRef{web}},
		{"empty tombstone", func(h cache.ResourceEventHandler) {
			h.OnDelete(cache.DeletedFinalStateUnknown{Key: "demo/web"})
		}, []objectRef{web}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkMarked(t, tc.event, (*tracker).serviceHandler, tc.dirty, false)
		})
	}
}

// checkMarked sends event to a fresh tracker's handler and checks what it
// marked and that it woke the loop exactly when it marked something.
func checkMarked(t *testing.T, event func(cache.ResourceEventHandler), handler func(*tracker) cache.ResourceEventHandler, want []objectRef, wantAll bool) {
	t.Helper()
	tr := newTracker()
	event(handler(tr))
	dirty, all, _ := tr.take()
	var got []objectRef
	for r := range dirty {
		got = append(got, r)
	}
	slices.SortFunc(got, objectRef.compare)
	if !slices.Equal(got, want) || all != wantAll {
		t.Errorf("marked %v (all %v), want %v (all %v)", got, all, want, wantAll)
	}
	if poked := len(tr.poke) == 1; poked != (len(want) > 0 || wantAll) {
		t.Errorf("woke the loop: %v", poked)
	}
}

// TestSliceChangeTriggers: an EndpointSlice added or updated records its
// last-change-trigger-time for the network programming latency, unless it
// is older than the tracker (the proxy's start-up is no programming
// latency), unreadable, or the update is a resync.
func TestSliceChangeTriggers(t *testing.T) {
	tr := newTracker()
	at := func(d time.Duration) *discoveryv1.EndpointSlice {
		s := webSlice("1", "10.0.0.1")
		s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: tr.started.Add(d).Format(time.RFC3339Nano)}
		return s
	}
	h := tr.sliceHandler()
	h.OnAdd(at(time.Second), false)
	h.OnAdd(at(-time.Second), true)
	bad := at(0)
	bad.Annotations[corev1.EndpointsLastChangeTriggerTime] = "yesterday"
	h.OnAdd(bad, false)
	newer := at(2 * time.Second)
	newer.ResourceVersion = "2"
	h.OnUpdate(at(time.Second), newer)
	h.OnUpdate(newer, newer) // a resync
	// Each slice's family goes with its trigger; an FQDN slice, which no
	// proxier reads, brings none.
	v6 := at(3 * time.Second)
	v6.AddressType = discoveryv1.AddressTypeIPv6
	h.OnAdd(v6, false)
	fqdn := at(4 * time.Second)
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	h.OnAdd(fqdn, false)
	_, _, triggers := tr.take()
	got := triggers[objectRef{"demo", "web"}]
	want := []state.ChangeTrigger{
		{At: tr.started.Add(time.Second), Family: state.IPv4},
		{At: tr.started.Add(2 * time.Second), Family: state.IPv4},
		{At: tr.started.Add(3 * time.Second), Family: state.IPv6},
	}
	same := func(a, b state.ChangeTrigger) bool { return a.At.Equal(b.At) && a.Family == b.Family }
	if !slices.EqualFunc(got, want, same) || len(triggers) != 1 {
		t.Errorf("triggers %v, want %v for demo/web", triggers, want)
	}
	if _, _, got := tr.take(); got != nil {
		t.Errorf("triggers after take: %v", got)
	}
}

func TestClusterNodeHandler(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "z"}}}
	tr := newTracker()
	var told []string
	h := tr.nodeHandler("node-a", func(why string) { told = append(told, why) })
	h.OnAdd(node, false)
	if _, all, _ := tr.take(); !all || len(tr.poke) != 1 || tr.nodeLabels()[corev1.LabelTopologyZone] != "z" {
		t.Fatalf("add: all %v, poked %d, labels %v", all, len(tr.poke), tr.nodeLabels())
	}
	<-tr.poke
	status := node.DeepCopy()
	status.Status.Phase = corev1.NodeRunning
	h.OnUpdate(node, status)
	if len(tr.poke) != 0 {
		t.Error("a status update woke the loop")
	}
	tainted := node.DeepCopy()
	tainted.Spec.Taints = []corev1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: corev1.TaintEffectNoSchedule}}
	h.OnUpdate(node, tainted)
	deleting := node.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	h.OnUpdate(tainted, deleting)
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "node-a", Obj: node})
	if len(tr.poke) != 1 || tr.nodeLabels() != nil {
		t.Errorf("tombstone: poked %d, labels %v", len(tr.poke), tr.nodeLabels())
	}
	want := []string{"", "", "its Node has the taint ToBeDeletedByClusterAutoscaler: the cluster autoscaler is removing it",
		"its Node is being deleted", "its Node was deleted"}
	if !slices.Equal(told, want) {
		t.Errorf("told %q, want %q", told, want)
	}
}

func TestListSelector(t *testing.T) {
	for _, tc := range []struct{ proxyName, want string }{
		{"", "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"},
		{"userspace", "!service.kubernetes.io/headless,service.kubernetes.io/service-proxy-name=userspace"},
	} {
		got, err := listSelector(tc.proxyName)
		if err != nil || got != tc.want {
			t.Errorf("listSelector(%q) = %q, %v; want %q", tc.proxyName, got, err, tc.want)
		}
	}
	if _, err := listSelector("not a label value!"); err == nil {
		t.Error("a bad proxy name was accepted")
	}
}

func TestProblemLog(t *testing.T) {
	a, b, c := errors.New("a"), errors.New("b"), errors.New("c")
	var p problemLog
	for i, tc := range []struct{ reported, fresh []error }{
		{[]error{a, b, a}, []error{a, b}},
		{[]error{b, a}, nil},
		{[]error{b, c}, []error{c}},
		{nil, nil},
		{[]error{a}, []error{a}}, // back after a build without it
	} {
		if got := p.fresh(tc.reported); !slices.Equal(got, tc.fresh) {
			t.Errorf("build %d: fresh %v, want %v", i, got, tc.fresh)
		}
	}
}

// BenchmarkClusterBuild is the work of Run's loop with 5,000 Services of
// 2 ports and their slices of 10 endpoints: building them all (the first
// snapshot, or a Node label change), and rebuilding one changed Service
// and assembling the snapshot (any other change).
func BenchmarkClusterBuild(b *testing.B) {
	var svcs []*corev1.Service
	var eps []*discoveryv1.EndpointSlice
	for i := range 5000 {
		name := fmt.Sprintf("svc-%04d", i)
		svcs = append(svcs, service(name, func(s *corev1.Service) {
			ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
			s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})
		}))
		var list []discoveryv1.Endpoint
		for j := range 10 {
			list = append(list, endpoint(fmt.Sprintf("10.%d.%d.%d", i/250, i%250, j+1)))
		}
		eps = append(eps, endpointSlice(name+"-1", discoveryv1.AddressTypeIPv4, list, func(s *discoveryv1.EndpointSlice) {
			s.Labels[discoveryv1.LabelServiceName] = name
			s.Ports = append(s.Ports, slicePort("https", 8443))
		}))
	}
	view := indexerView{
		services: cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil),
		slices:   cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{serviceIndex: sliceServiceIndex}),
	}
	for i := range svcs {
		if err := view.services.Add(svcs[i]); err != nil {
			b.Fatal(err)
		}
		if err := view.slices.Add(eps[i]); err != nil {
			b.Fatal(err)
		}
	}
	opts := Options{NodeName: "node-a"}
	b.Run("all", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			cur := newServed()
			if err := cur.update(view, cur.keys(view), opts, new(state.ChangeSet)); err != nil {
				b.Fatal(err)
			}
			if cur.snapshot().Len() != 10000 {
				b.Fatal("wrong snapshot")
			}
		}
	})
	b.Run("one", func(b *testing.B) {
		cur := newServed()
		if err := cur.update(view, cur.keys(view), opts, new(state.ChangeSet)); err != nil {
			b.Fatal(err)
		}
		one := map[objectRef]bool{{"demo", "svc-2500"}: true}
		b.ReportAllocs()
		for b.Loop() {
			var changes state.ChangeSet
			err := cur.update(view, one, opts, &changes)
			if c := changes.Changes(); err != nil || !c.Empty() {
				b.Fatal("changed", c, err)
			}
			if cur.snapshot().Len() != 10000 {
				b.Fatal("wrong snapshot")
			}
		}
	})
}

// Building each Service alone, as Run's loop does, gives what
// BuildSnapshot gives for all objects at once, problems included.
func TestServedMatchesBuildSnapshot(t *testing.T) {
	svcs := []*corev1.Service{
		service("web"),
		service("api", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		}),
		service("bad", func(s *corev1.Service) { s.Spec.Ports[0].Port = 70000 }),
		service("other", func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "x"} }),
	}
	owned := func(svc string) func(*discoveryv1.EndpointSlice) {
		return func(s *discoveryv1.EndpointSlice) { s.Labels[discoveryv1.LabelServiceName] = svc }
	}
	eps := []*discoveryv1.EndpointSlice{
		endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.0.1"), endpoint("169.254.169.254")}),
		endpointSlice("web-2", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.0.1", terminatingServing), endpoint("10.0.0.2")}),
		endpointSlice("api-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.1.1", onNode("node-a")), endpoint("10.0.1.2", onNode("node-b"))}, owned("api")),
		endpointSlice("orphan-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.2.1")}, owned("gone")),
		endpointSlice("nolabel-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.3.1")}, func(s *discoveryv1.EndpointSlice) {
			delete(s.Labels, discoveryv1.LabelServiceName)
		}),
	}
	opts := Options{NodeName: "node-a"}
	want, wantProblems := BuildSnapshot(svcs, eps, opts)

	view := indexerView{
		services: cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil),
		slices:   cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{serviceIndex: sliceServiceIndex}),
	}
	for _, s := range svcs {
		if err := view.services.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range eps {
		if err := view.slices.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	cur := newServed()
	var changes state.ChangeSet
	if err := cur.update(view, cur.keys(view), opts, &changes); err != nil {
		t.Fatalf("update: %v", err)
	}
	// Every Service served is new: web and api, both with endpoints.
	web, api := state.ServiceName{Namespace: "demo", Name: "web"}, state.ServiceName{Namespace: "demo", Name: "api"}
	if got, want := changes.Changes(), (state.Changes{Services: []state.ServiceName{api, web}, Endpoints: []state.ServiceName{api, web}}); !reflect.DeepEqual(got, want) {
		t.Errorf("first build changes %v, want %v", got, want)
	}
	if got := cur.snapshot(); !sameSnapshot(got, want) {
		t.Errorf("snapshot differs:\ngot  %v\nwant %v", got.Names(), want.Names())
	}
	var wantMsgs []string
	for _, p := range wantProblems {
		wantMsgs = append(wantMsgs, p.Error())
	}
	checkProblems(t, cur.problemList(), wantMsgs)

	// Gone from the caches, gone from what is served.
	if err := view.services.Delete(svcs[0]); err != nil {
		t.Fatal(err)
	}
	changes = state.ChangeSet{}
	err := cur.update(view, map[objectRef]bool{{"demo", "web"}: true}, opts, &changes)
	if got := changes.Changes(); err != nil || !reflect.DeepEqual(got, state.Changes{Services: []state.ServiceName{web}, Endpoints: []state.ServiceName{web}}) || cur.snapshot().Get(webHTTP) != nil {
		t.Errorf("after deleting web: changes %v, %v, web served: %v", got, err, cur.snapshot().Get(webHTTP) != nil)
	}
}

// TestServedCatchesEndpointsAtOtherServices: built one Service at a time,
// as the informer source builds them, an endpoint at another Service's
// frontend, or at this host's address with another Service's node port,
// is still ignored, whichever of the two Services came first; and it is
// served again once that Service goes. Two Services whose endpoints are
// each other's frontends looped through the proxy until its descriptors
// ran out.
func TestServedCatchesEndpointsAtOtherServices(t *testing.T) {
	withIP := func(ip string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip} }
	}
	owned := func(svc string, port int32) func(*discoveryv1.EndpointSlice) {
		return func(s *discoveryv1.EndpointSlice) {
			s.Labels[discoveryv1.LabelServiceName] = svc
			s.Ports = []discoveryv1.EndpointPort{slicePort("http", port)}
		}
	}
	a := service("a", withIP("10.96.0.1"))
	b := service("b", withIP("10.96.0.2"))
	c := service("c", withIP("10.96.0.3"), func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 31000
	})
	aSlice := endpointSlice("a-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.96.0.2"), endpoint("10.0.0.1")}, owned("a", 80))
	bSlice := endpointSlice("b-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.96.0.1")}, owned("b", 80))
	dSlice := endpointSlice("d-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("192.0.2.9"), endpoint("10.0.0.4")}, owned("d", 31000))
	d := service("d", withIP("10.96.0.4"))
	opts := Options{HostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.9")}, nil }}

	view := indexerView{
		services: cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil),
		slices:   cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{serviceIndex: sliceServiceIndex}),
	}
	cur := newServed()
	// step adds (or, with del, deletes) objects and rebuilds only the
	// Services they belong to, as the tracker marks them; the result must
	// be what BuildSnapshot makes of everything at once.
	step := func(name string, del bool, objs ...any) {
		t.Helper()
		refs := make(map[objectRef]bool)
		for _, o := range objs {
			var store cache.Indexer
			switch o := o.(type) {
			case *corev1.Service:
				store, refs[objectRef{o.Namespace, o.Name}] = view.services, true
			case *discoveryv1.EndpointSlice:
				store, refs[sliceOwner(o)] = view.slices, true
			}
			op := store.Add
			if del {
				op = store.Delete
			}
			if err := op(o); err != nil {
				t.Fatal(err)
			}
		}
		if err := cur.update(view, refs, opts, new(state.ChangeSet)); err != nil {
			t.Fatal(err)
		}
		var svcs []*corev1.Service
		for _, o := range view.services.List() {
			svcs = append(svcs, o.(*corev1.Service))
		}
		var eps []*discoveryv1.EndpointSlice
		for _, o := range view.slices.List() {
			eps = append(eps, o.(*discoveryv1.EndpointSlice))
		}
		want, wantProblems := BuildSnapshot(svcs, eps, opts)
		if got := cur.snapshot(); !sameSnapshot(got, want) {
			t.Errorf("%s: snapshot differs from BuildSnapshot of everything", name)
		}
		var wantMsgs []string
		for _, p := range wantProblems {
			wantMsgs = append(wantMsgs, p.Error())
		}
		checkProblems(t, cur.problemList(), wantMsgs)
	}
	endpointsOf := func(name string) []string {
		var out []string
		if sp := cur.snapshot().Get(state.ServicePortName{Namespace: "demo", Name: name, Port: "http", Protocol: state.TCP}); sp != nil {
			for _, e := range sp.ClusterEndpoints {
				out = append(out, e.Addr.String())
			}
		}
		return out
	}

	step("a first", false, a, aSlice)
	if got := endpointsOf("a"); !slices.Equal(got, []string{"10.0.0.1:80", "10.96.0.2:80"}) {
		t.Fatalf("a alone serves %v", got)
	}
	step("then b, whose frontend is a's endpoint", false, b, bSlice)
	if got := endpointsOf("a"); !slices.Equal(got, []string{"10.0.0.1:80"}) {
		t.Errorf("a serves %v; want b's frontend ignored", got)
	}
	if got := endpointsOf("b"); len(got) != 0 {
		t.Errorf("b serves %v; want a's frontend ignored", got)
	}
	step("d, at this host's address with port 31000", false, d, dSlice)
	step("then c, with node port 31000", false, c)
	if got := endpointsOf("d"); !slices.Equal(got, []string{"10.0.0.4:31000"}) {
		t.Errorf("d serves %v; want 192.0.2.9:31000 ignored once c's node port is 31000", got)
	}
	step("b goes", true, b, bSlice)
	if got := endpointsOf("a"); !slices.Equal(got, []string{"10.0.0.1:80", "10.96.0.2:80"}) {
		t.Errorf("a serves %v once b is gone; want its endpoint back", got)
	}
	step("c goes", true, c)
	if got := endpointsOf("d"); !slices.Equal(got, []string{"10.0.0.4:31000", "192.0.2.9:31000"}) {
		t.Errorf("d serves %v once c is gone; want its endpoint back", got)
	}
}

// TestClusterTriggersWaitForTheirService: the change trigger time of a
// slice seen before its Service is counted with the snapshot that serves
// the Service (it was dropped, the build having changed nothing); that of
// a slice change that changes nothing served is not counted.
func TestClusterTriggersWaitForTheirService(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(service("other"))
		r := runCluster(t, client)
		settle()
		triggered := func(s *discoveryv1.EndpointSlice, at time.Time) *discoveryv1.EndpointSlice {
			s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
			return s
		}
		time.Sleep(time.Second)
		at := time.Now()
		if _, err := client.DiscoveryV1().EndpointSlices("demo").Create(t.Context(), triggered(webSlice("1", "10.0.0.1"), at), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		n, _, _ := r.counts()
		time.Sleep(2 * time.Second)
		if _, err := client.CoreV1().Services("demo").Create(t.Context(), service("web"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		got, _, _ := r.counts()
		if got != n+1 {
			t.Fatalf("%d snapshots after the Service came, want %d", got, n+1)
		}
		if tr := r.last().ChangeTriggers; len(tr) != 1 || !tr[0].At.Equal(at) || tr[0].Family != state.IPv4 {
			t.Fatalf("the Service's snapshot carries triggers %v, want the slice's %v", tr, at)
		}

		// A slice update that changes nothing served, then a change of
		// another Service: the first one's trigger is not counted.
		noop := triggered(webSlice("2", "10.0.0.1"), time.Now())
		updateSlice(t, client, noop)
		settle()
		other := service("other", func(s *corev1.Service) {
			s.ResourceVersion = "2"
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		})
		if _, err := client.CoreV1().Services("demo").Update(t.Context(), other, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		settle()
		if tr := r.last().ChangeTriggers; len(tr) != 0 {
			t.Fatalf("another Service's snapshot carries triggers %v, want none", tr)
		}
	})
}
