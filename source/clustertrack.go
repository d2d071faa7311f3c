package source

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// The informer handlers of Cluster note which Services changed; Run's loop
// rebuilds those alone with BuildSnapshot and reassembles the snapshot, so
// one change costs the same with 10 services or 10,000.

// tracker is what the informer handlers share with Run's loop: the
// Services to rebuild, the Node's labels and a wake-up. Handlers do no I/O
// and never block.
type tracker struct {
	poke chan struct{} // capacity 1: pending wake-ups coalesce

	started time.Time // change triggers before it are not counted

	mu       sync.Mutex // guards the fields below
	dirty    map[objectRef]bool
	all      bool // rebuild every Service
	labels   map[string]string
	triggers map[objectRef][]state.ChangeTrigger // of the EndpointSlice changes since the last take, by Service
	ntrig    int                                 // in triggers
	host     bool                                // this host's addresses changed (see hostChanged)
}

func newTracker() *tracker {
	return &tracker{poke: make(chan struct{}, 1), dirty: make(map[objectRef]bool), started: time.Now()}
}

// maxPendingTriggers bounds the change trigger times kept between builds.
const maxPendingTriggers = 10000

// triggered records when the change an EndpointSlice brings was triggered,
// from its endpoints.kubernetes.io/last-change-trigger-time annotation
// (which the EndpointSlice controller sets), as kube-proxy's change
// tracker of the slice's IP family does: not for objects older than the
// tracker, whose latency would be the proxy's start-up, nor for FQDN
// slices, which no proxier reads.
func (t *tracker) triggered(s *discoveryv1.EndpointSlice) {
	v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if !ok {
		return
	}
	var family state.IPFamily
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4:
		family = state.IPv4
	case discoveryv1.AddressTypeIPv6:
		family = state.IPv6
	default:
		return
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || !at.After(t.started) {
		return
	}
	t.mu.Lock()
	t.addTriggers(sliceOwner(s), state.ChangeTrigger{At: at, Family: family})
	t.mu.Unlock()
}

// addTriggers records trigger times of the Service ref, up to
// maxPendingTriggers in all. t.mu must be held.
func (t *tracker) addTriggers(ref objectRef, at ...state.ChangeTrigger) {
	at = at[:min(len(at), maxPendingTriggers-t.ntrig)]
	if len(at) == 0 {
		return
	}
	if t.triggers == nil {
		t.triggers = make(map[objectRef][]state.ChangeTrigger)
	}
	t.triggers[ref] = append(t.triggers[ref], at...)
	t.ntrig += len(at)
}

// maxTriggerWait is how long the trigger times of slices whose Service
// does not exist yet wait for it: their latency ends when it comes and
// is served (kube-proxy counts them at its next sync).
const maxTriggerWait = 10 * time.Minute

// keepTriggers puts back the trigger times of ref, a Service that does
// not exist yet, those younger than maxTriggerWait.
func (t *tracker) keepTriggers(ref objectRef, at []state.ChangeTrigger, now time.Time) {
	at = slices.DeleteFunc(slices.Clone(at), func(a state.ChangeTrigger) bool { return now.Sub(a.At) > maxTriggerWait })
	t.mu.Lock()
	t.addTriggers(ref, at...)
	t.mu.Unlock()
}

// mark records that the Services refs must be rebuilt and wakes the loop.
// An empty name stands for the slices of a namespace that name no Service.
func (t *tracker) mark(refs ...objectRef) {
	t.mu.Lock()
	for _, r := range refs {
		t.dirty[r] = true
	}
	t.mu.Unlock()
	t.changed()
}

// markAll records that every Service must be rebuilt and wakes the loop.
func (t *tracker) markAll() {
	t.mu.Lock()
	t.all = true
	t.mu.Unlock()
	t.changed()
}

// hostChanged records that this host's addresses changed and wakes the
// loop, which builds again the Services with an endpoint at a node port.
func (t *tracker) hostChanged() {
	t.mu.Lock()
	t.host = true
	t.mu.Unlock()
	t.changed()
}

// takeHost returns and clears what hostChanged recorded.
func (t *tracker) takeHost() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.host
	t.host = false
	return h
}

// take returns and clears what was marked, and the change trigger times
// recorded.
func (t *tracker) take() (dirty map[objectRef]bool, all bool, triggers map[objectRef][]state.ChangeTrigger) {
	t.mu.Lock()
	defer t.mu.Unlock()
	dirty, all, triggers = t.dirty, t.all, t.triggers
	t.dirty, t.all, t.triggers, t.ntrig = make(map[objectRef]bool), false, nil, 0
	return dirty, all, triggers
}

// changed wakes Run's loop, or leaves the pending wake-up to cover this
// change too.
func (t *tracker) changed() {
	select {
	case t.poke <- struct{}{}:
	default:
	}
}

func (t *tracker) nodeLabels() map[string]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.labels
}

// serviceHandler marks a Service on every add and delete, and on every
// update but a resync.
func (t *tracker) serviceHandler() cache.ResourceEventHandler {
	key := func(obj any) {
		if m := metaOf(obj); m != nil {
			t.mark(objectRef{m.GetNamespace(), m.GetName()})
			return
		}
		// A tombstone without its object still has the key.
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			if ns, name, err := cache.SplitMetaNamespaceKey(d.Key); err == nil {
				t.mark(objectRef{ns, name})
				return
			}
		}
		t.markAll()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			logEvent("added", "Service", obj)
			key(obj)
		},
		UpdateFunc: func(oldObj, newObj any) {
			if resync(oldObj, newObj) {
				return
			}
			logEvent("updated", "Service", newObj)
			key(newObj)
		},
		DeleteFunc: func(obj any) {
			logEvent("deleted", "Service", obj)
			key(obj)
		},
	}
}

// sliceHandler marks the Service an EndpointSlice belongs to (both, if an
// update moved it) on every add and delete, and on every update but a
// resync.
func (t *tracker) sliceHandler() cache.ResourceEventHandler {
	key := func(objs ...any) {
		refs := make([]objectRef, 0, len(objs))
		for _, obj := range objs {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			s, ok := obj.(*discoveryv1.EndpointSlice)
			if !ok {
				t.markAll() // a tombstone without its object: which Service?
				return
			}
			refs = append(refs, sliceOwner(s))
		}
		t.mark(refs...)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			logEvent("added", "EndpointSlice", obj)
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
				t.triggered(s)
			}
			key(obj)
		},
		UpdateFunc: func(oldObj, newObj any) {
			if resync(oldObj, newObj) {
				return
			}
			logEvent("updated", "EndpointSlice", newObj)
			if s, ok := newObj.(*discoveryv1.EndpointSlice); ok {
				t.triggered(s)
			}
			key(oldObj, newObj)
		},
		DeleteFunc: func(obj any) {
			logEvent("deleted", "EndpointSlice", obj)
			key(obj)
		},
	}
}

// taintToBeDeleted is the taint the cluster autoscaler puts on a node it
// is about to remove (not a constant of k8s.io/api).
const taintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// goingAway says why node is going away, or "".
func goingAway(node *corev1.Node) string {
	if node.DeletionTimestamp != nil {
		return "its Node is being deleted"
	}
	for _, t := range node.Spec.Taints {
		if t.Key == taintToBeDeleted {
			return "its Node has the taint " + taintToBeDeleted + ": the cluster autoscaler is removing it"
		}
	}
	return ""
}

// nodeHandler follows the labels of this node's Node; a change rebuilds
// every Service, since topology hints depend on the zone. A Node that does
// not exist, or no longer does, has no labels. tell, if not nil, hears
// whether the Node is going away (see Cluster.NodeGoingAway).
func (t *tracker) nodeHandler(name string, tell func(why string)) cache.ResourceEventHandler {
	if tell == nil {
		tell = func(string) {}
	}
	set := func(l map[string]string) {
		t.mu.Lock()
		same := maps.Equal(t.labels, l)
		t.labels = l
		t.mu.Unlock()
		if !same {
			klog.V(2).InfoS("Node labels changed", "node", name, "zone", l[corev1.LabelTopologyZone])
			t.markAll()
		}
	}
	// The field selector lets only this Node through; check anyway.
	mine := func(obj any) (*corev1.Node, bool) {
		node, ok := obj.(*corev1.Node)
		return node, ok && node.Name == name
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if node, ok := mine(obj); ok {
				set(node.Labels)
				tell(goingAway(node))
			}
		},
		UpdateFunc: func(_, obj any) {
			if node, ok := mine(obj); ok {
				set(node.Labels)
				tell(goingAway(node))
			}
		},
		DeleteFunc: func(obj any) {
			if m := metaOf(obj); m == nil || m.GetName() == name {
				set(nil)
				tell("its Node was deleted")
			}
		},
	}
}

// resync reports whether an update redelivers an unchanged object, as the
// informers' periodic resync and a relist after a broken watch do.
func resync(oldObj, newObj any) bool {
	o, n := metaOf(oldObj), metaOf(newObj)
	return o != nil && n != nil && n.GetResourceVersion() != "" && o.GetResourceVersion() == n.GetResourceVersion()
}

func logEvent(what, kind string, obj any) {
	if v := klog.V(5); v.Enabled() {
		v.InfoS("Object "+what, "kind", kind, "object", klog.KObj(metaOf(obj)))
	}
}

// metaOf returns the object metadata of an informer's object, looking
// inside a tombstone (an object deleted while the watch was down), or nil.
func metaOf(obj any) metav1.Object {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil
	}
	return m
}

// serviceIndex indexes EndpointSlices by the Service they belong to, as
// "namespace/name" ("namespace/" for slices without the label).
const serviceIndex = "service"

func sliceOwner(s *discoveryv1.EndpointSlice) objectRef {
	return objectRef{s.Namespace, s.Labels[discoveryv1.LabelServiceName]}
}

func (r objectRef) key() string { return r.namespace + "/" + r.name }

func parseRef(key string) objectRef {
	ns, name, _ := strings.Cut(key, "/")
	return objectRef{ns, name}
}

func sliceServiceIndex(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, fmt.Errorf("%T is not an EndpointSlice", obj)
	}
	return []string{sliceOwner(s).key()}, nil
}

// indexerView reads the informers' caches.
type indexerView struct {
	services cache.Indexer // keyed by namespace/name
	slices   cache.Indexer // with serviceIndex
}

// objects returns the Service ref (nil if absent, or if ref stands for
// slices without a Service) and the slices that name it.
func (v indexerView) objects(ref objectRef) ([]*corev1.Service, []*discoveryv1.EndpointSlice, error) {
	var svcs []*corev1.Service
	if ref.name != "" {
		obj, ok, err := v.services.GetByKey(ref.key())
		if err != nil {
			return nil, nil, fmt.Errorf("cluster: get Service %s: %w", ref.key(), err)
		}
		if svc, isSvc := obj.(*corev1.Service); ok && isSvc {
			svcs = []*corev1.Service{svc}
		}
	}
	objs, err := v.slices.ByIndex(serviceIndex, ref.key())
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: EndpointSlices of %s: %w", ref.key(), err)
	}
	eps := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			eps = append(eps, s)
		}
	}
	return svcs, eps, nil
}

// served is what Run's loop last built: the service ports and problems of
// every Service, each built by BuildSnapshot from that Service and its
// slices alone. kube-proxy's semantics never relate two Services; only the
// proxy's own capture check does (an endpoint at another Service's
// frontend, or at a node port of this host, would loop through the
// proxy), and index carries every Service's frontends to it, so the union
// equals what BuildSnapshot makes of every object at once.
type served struct {
	ports    map[objectRef][]state.ServicePort
	problems map[objectRef][]error
	index    *frontIndex // of ports
}

func newServed() *served {
	return &served{ports: make(map[objectRef][]state.ServicePort), problems: make(map[objectRef][]error)}
}

// keys returns every Service in the caches, every Service a slice names,
// and every Service served now (to drop those gone).
func (s *served) keys(v indexerView) map[objectRef]bool {
	out := make(map[objectRef]bool, len(s.ports))
	for _, k := range v.services.ListKeys() {
		out[parseRef(k)] = true
	}
	for _, k := range v.slices.ListIndexFuncValues(serviceIndex) {
		out[parseRef(k)] = true
	}
	for r := range s.ports {
		out[r] = true
	}
	for r := range s.problems {
		out[r] = true
	}
	return out
}

// update rebuilds the Services in refs and adds to changes those whose
// service ports changed. Their endpoints are checked against the
// frontends and node ports of every Service as they were; if the rebuild
// changed those, the Services with an endpoint at a frontend or node port
// that came, went or changed hands are rebuilt again (a Service's
// frontends depend on the Service alone, so once is enough). That costs a
// look at every endpoint, but only when frontends change, not endpoints.
func (s *served) update(v indexerView, refs map[objectRef]bool, opts Options, changes *state.ChangeSet) error {
	opts.others = s.index
	if err := s.rebuild(v, refs, opts, changes); err != nil {
		return err
	}
	next := newFrontIndex()
	for _, ports := range s.ports {
		for i := range ports {
			next.add(&ports[i])
		}
	}
	moved := s.index.changed(next)
	s.index = next
	if moved.empty() {
		return nil
	}
	affected := v.endpointsAt(moved)
	if len(affected) == 0 {
		return nil
	}
	opts.others = next
	return s.rebuild(v, affected, opts, changes)
}

// endpointsAt returns the Services with an endpoint at a frontend of x, or
// at a node port of x on any address of its family.
func (v indexerView) endpointsAt(x *frontIndex) map[objectRef]bool {
	out := make(map[objectRef]bool)
	for _, obj := range v.slices.List() {
		sl, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		owner := sliceOwner(sl)
		if owner.name == "" || out[owner] {
			continue
		}
	slice:
		for _, p := range sl.Ports {
			if p.Port == nil {
				continue
			}
			proto := state.TCP
			if p.Protocol != nil {
				proto = state.Protocol(*p.Protocol)
			}
			for _, ep := range sl.Endpoints {
				for _, a := range ep.Addresses {
					addr, err := netip.ParseAddr(a)
					if err != nil || *p.Port < 1 || *p.Port > 65535 {
						continue
					}
					if _, _, hit := x.lookup(frontKey{proto, netip.AddrPortFrom(addr.Unmap(), uint16(*p.Port))}); hit {
						out[owner] = true
						break slice
					}
				}
			}
		}
	}
	return out
}

// rebuild builds the Services in refs again and adds to changes those
// whose service ports changed.
func (s *served) rebuild(v indexerView, refs map[objectRef]bool, opts Options, changes *state.ChangeSet) error {
	for r := range refs {
		svcs, eps, err := v.objects(r)
		if err != nil {
			return err
		}
		var ports []state.ServicePort
		var problems []error
		if len(svcs) > 0 || len(eps) > 0 {
			var snap state.Snapshot
			snap, problems = BuildSnapshot(svcs, eps, opts)
			for sp := range snap.All {
				ports = append(ports, *sp)
			}
		}
		if !slices.EqualFunc(s.ports[r], ports, func(a, b state.ServicePort) bool { return a.Equal(&b) }) {
			changes.Add(state.ServiceName{Namespace: r.namespace, Name: r.name}, s.ports[r], ports)
		}
		if len(ports) > 0 {
			s.ports[r] = ports
		} else {
			delete(s.ports, r)
		}
		if len(problems) > 0 {
			s.problems[r] = problems
		} else {
			delete(s.problems, r)
		}
	}
	return nil
}

// snapshot assembles the service ports of every Service.
func (s *served) snapshot() state.Snapshot {
	n := 0
	for _, p := range s.ports {
		n += len(p)
	}
	all := make([]state.ServicePort, 0, n)
	for _, p := range s.ports {
		all = append(all, p...)
	}
	return state.NewSnapshot(all)
}

// problemList returns the problems of every Service.
func (s *served) problemList() []error {
	var out []error
	for _, p := range s.problems {
		out = append(out, p...)
	}
	return out
}
