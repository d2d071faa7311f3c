package source

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

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
