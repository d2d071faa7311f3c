package source

import (
	"context"
	"errors"
	"fmt"
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
