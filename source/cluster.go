package source

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// DefaultConfigSyncPeriod is how often the informers redeliver every object
// when Cluster.ConfigSyncPeriod is zero, as kube-proxy's --config-sync-period.
const DefaultConfigSyncPeriod = 15 * time.Minute

// Cluster serves the Services and EndpointSlices of a live cluster, read
// through client-go informers, with the same rules as the manifest source
// (both call BuildSnapshot).
type Cluster struct {
	// Client reaches the API server. Required; see NewClient.
	Client kubernetes.Interface
	// NodeName is this node's Node object, watched (alone, by field
	// selector) for its labels: its topology zone selects zone hints.
	// Endpoints whose nodeName equals it are local. If empty, no Node is
	// watched, no endpoint is local and topology hints are ignored.
	NodeName string
	// ConfigSyncPeriod is how often the informers redeliver every object
	// they hold (kube-proxy's --config-sync-period). Redelivered objects
	// cause no work. If zero, DefaultConfigSyncPeriod. Negative disables.
	ConfigSyncPeriod time.Duration
	// Options are passed to BuildSnapshot, except NodeName and NodeLabels,
	// which Run sets from the fields above and the Node. Leave
	// AllowLoopback and AllowNoClusterIP false in a cluster: loopback
	// endpoints would reach the node's own daemons. ServiceProxyName also
	// narrows what the informers list.
	Options Options
	// NodeGoingAway, if set, is told whether this node's Node is going
	// away, and why: it is missing (once the caches have synced), being
	// deleted, or tainted ToBeDeletedByClusterAutoscaler; "" when it is
	// not. kube-proxy's /healthz fails meanwhile, so load balancers drain
	// the node. It is called from the informers' handlers: keep it quick.
	NodeGoingAway func(why string)
	// Ignored, if set, is told after every build what of the objects is
	// left unused, and why (each problem is logged when it first shows);
	// empty when nothing is. It is called from Run's goroutine.
	Ignored func(problems []error)
	// HostChanged, if set, says this host's addresses changed: the
	// Services with an endpoint at a node port are built again, as one at
	// an address of this host is ignored (see Options.HostAddrs).
	HostChanged <-chan struct{}

	// report, if set, receives what is logged of refusals (see
	// refusals) instead of klog; err is nil for good news.
	report func(err error, msg string, kv ...any)
	// built, if set, is told after every snapshot built once the caches
	// synced whether apply was called; tests wait on it instead of
	// sleeping.
	built func(applied bool)
}

// Run lists and watches Services, EndpointSlices and this node's Node, and
// calls apply with a snapshot once Services and EndpointSlices have both
// synced (and the Node informer, when NodeName is set), then again after
// every change that alters the snapshot. It never calls apply with what it
// has before that, so a proxy starting against a slow API server does not
// drop every service first.
//
// Informer handlers only note which Services changed; one goroutine, Run's
// own, rebuilds those from the caches with BuildSnapshot, assembles the
// snapshot and calls apply, so a burst of changes produces one snapshot and
// one change costs about the same in a small cluster as in a large one (a
// change of the Node's labels rebuilds every Service). Resyncs (objects
// redelivered with an unchanged resourceVersion) cause no work; updates
// that do not change the snapshot (status, annotations, an unrelated label)
// never call apply. While
// the API server is unreachable the informers keep their caches, so nothing
// is applied until it answers again; they list again and resume by
// themselves. What BuildSnapshot reports is logged once per distinct
// message for as long as it persists.
//
// apply is called from Run's goroutine, one call at a time, and must not
// block for long: changes queue up behind it. Run returns nil when ctx is
// done, once the informers have stopped, or informerStopWait later while
// client-go sleeps out a retry back-off.
func (c *Cluster) Run(ctx context.Context, apply func(state.Snapshot)) error {
	if c.Client == nil {
		return errors.New("cluster: no API client")
	}
	selector, err := listSelector(c.Options.ServiceProxyName)
	if err != nil {
		return fmt.Errorf("cluster: label selector: %w", err)
	}
	resync := cmp.Or(c.ConfigSyncPeriod, DefaultConfigSyncPeriod)
	if resync < 0 {
		resync = 0 // client-go: no resync
	}

	ctx, cancel := context.WithCancel(ctx)
	t := newTracker()
	factory := informers.NewSharedInformerFactory(c.Client, resync)
	defer func() {
		cancel()
		stopped := make(chan struct{})
		go func() {
			factory.Shutdown() // waits for the informers' goroutines
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(informerStopWait):
			klog.InfoS("Not waiting longer for the informers to stop: client-go is sleeping out a retry back-off", "waited", informerStopWait)
		}
	}()

	report := c.report
	if report == nil {
		report = logReport
	}
	creds := &credentials{}
	services, err := readInformer(factory, &corev1.Service{},
		&refusals{resource: "services", unread: whyNothingServed, stale: whyServedStays, report: report}, creds,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return c.Client.CoreV1().Services("").List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return c.Client.CoreV1().Services("").Watch(ctx, o)
		})
	if err != nil {
		return err
	}
	slices, err := readInformer(factory, &discoveryv1.EndpointSlice{},
		&refusals{resource: "endpointslices", group: "discovery.k8s.io", unread: whyNothingServed, stale: whyServedStays, report: report}, creds,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return c.Client.DiscoveryV1().EndpointSlices("").List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return c.Client.DiscoveryV1().EndpointSlices("").Watch(ctx, o)
		})
	if err != nil {
		return err
	}
	if err := slices.AddIndexers(cache.Indexers{serviceIndex: sliceServiceIndex}); err != nil {
		return fmt.Errorf("cluster: index EndpointSlices: %w", err)
	}
	svcReg, err := services.AddEventHandler(t.serviceHandler())
	if err != nil {
		return fmt.Errorf("cluster: watch Services: %w", err)
	}
	sliceReg, err := slices.AddEventHandler(t.sliceHandler())
	if err != nil {
		return fmt.Errorf("cluster: watch EndpointSlices: %w", err)
	}
	synced := []cache.InformerSynced{svcReg.HasSynced, sliceReg.HasSynced}
	var nodeStore cache.Store
	var nodeSynced cache.InformerSynced
	if c.NodeName != "" {
		// The Node alone, by field selector.
		byName := func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, c.NodeName).String()
		}
		nodes, err := readInformer(factory, &corev1.Node{},
			&refusals{resource: "nodes", report: report,
				unread: "meanwhile the Node's labels are not known, so topology hints are ignored,",
				stale:  "meanwhile the Node's labels last read are used"}, creds,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				byName(&o)
				return c.Client.CoreV1().Nodes().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				byName(&o)
				return c.Client.CoreV1().Nodes().Watch(ctx, o)
			})
		if err != nil {
			return err
		}
		nodeStore = nodes.GetStore()
		nodeReg, err := nodes.AddEventHandler(t.nodeHandler(c.NodeName, c.NodeGoingAway))
		if err != nil {
			return fmt.Errorf("cluster: watch Node %s: %w", c.NodeName, err)
		}
		nodeSynced = nodeReg.HasSynced
	}
	factory.Start(ctx.Done())

	if c.HostChanged != nil {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-c.HostChanged:
					t.hostChanged()
				}
			}
		}()
	}
	klog.InfoS("Waiting for the API server's Services and EndpointSlices", "node", c.NodeName, "labelSelector", selector)
	start := time.Now()
	// Not WaitForNamedCacheSync: it logs a second "waiting" line, and an
	// error when the proxy is merely told to stop.
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx is done
	}
	klog.InfoS("Informer caches synced", "took", time.Since(start).Round(time.Millisecond))
	if nodeSynced != nil {
		// The Node gives topology labels only: worth a short wait, so the
		// first sync has them, but not worth serving nothing, as
		// kube-proxy does not. Its labels apply whenever it comes.
		wait, cancel := context.WithTimeout(ctx, nodeSyncWait)
		nodeOK := cache.WaitForCacheSync(wait.Done(), nodeSynced)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if !nodeOK {
			klog.ErrorS(nil, "This node's Node cannot be read yet; serving without its labels, so topology hints are ignored until it can be", "node", c.NodeName, "waited", nodeSyncWait)
			nodeStore = nil // no verdict on whether it exists
		}
	}
	if nodeStore != nil {
		if _, found, _ := nodeStore.GetByKey(c.NodeName); !found {
			if c.NodeGoingAway != nil {
				c.NodeGoingAway("the API server has no Node named " + c.NodeName)
			}
			// Usually a host name that is not the Node's name.
			klog.ErrorS(nil, "The API server has no Node of this name; if this node's Node is named otherwise, set --hostname-override to that name, or no endpoint counts as local here. Topology hints are ignored until the Node exists", "node", c.NodeName)
		}
	}

	view := indexerView{services: services.GetIndexer(), slices: slices.GetIndexer()}
	cur := newServed()
	var problems problemLog
	for first := true; ; first = false {
		// What woke us is in the caches now; a change from here on wakes
		// us again.
		select {
		case <-t.poke:
		default:
		}
		began := time.Now()
		dirty, all, triggers := t.take()
		if t.takeHost() && cur.index != nil {
			maps.Copy(dirty, view.endpointsAt(&frontIndex{nodePorts: cur.index.nodePorts}))
		}
		opts := c.Options
		opts.NodeName = c.NodeName
		opts.NodeLabels = t.nodeLabels()
		if first || all {
			dirty = cur.keys(view)
		}
		var changes state.ChangeSet
		err := cur.update(view, dirty, opts, &changes)
		if err != nil {
			// Only a broken indexer fails; every object is marked again.
			klog.ErrorS(err, "Reading the informer caches")
			t.markAll()
		}
		ignored := cur.problemList()
		for _, e := range problems.fresh(ignored) {
			klog.ErrorS(e, "Ignoring part of an object from the API server", logValues(e)...)
		}
		if c.Ignored != nil {
			c.Ignored(ignored)
		}
		snapChanges := changes.Changes()
		applied := first || !snapChanges.Empty()
		// The trigger times of a Service whose service ports changed are
		// counted with this snapshot; those of one that changed nothing
		// served are not (nothing was programmed for them), but those of
		// slices whose Service does not exist yet wait for it.
		observed := t.observedTriggers(view, triggers, snapChanges, began)
		if applied {
			snap := cur.snapshot()
			snap.ChangeTriggers = observed
			snap.Changes = snapChanges
			klog.V(2).InfoS("Applying a new snapshot from the API server",
				"servicePorts", snap.Len(), "servicesRebuilt", len(dirty), "initial", first, "built", time.Since(began))
			apply(snap)
		} else {
			klog.V(4).InfoS("Nothing served changed", "servicesRebuilt", len(dirty), "took", time.Since(began))
		}
		if c.built != nil {
			c.built(applied)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.poke:
		}
	}
}

// informerStopWait bounds how long Run waits for the informers to stop once
// ctx is done. They stop at once, except while the API server refuses
// connections: client-go then sleeps between watch-list attempts (up to a
// minute) without looking at ctx, and a proxy told to stop must not sit
// that out.
const informerStopWait = 2 * time.Second

// listSelector is the label selector of kube-proxy's informers: Services
// (and, since the EndpointSlice controller copies their labels, their
// slices) that another proxy owns, or that are headless, are not listed.
// With a proxy name, only the Services labelled with it are.
func listSelector(proxyName string) (string, error) {
	proxy, err := labels.NewRequirement(LabelServiceProxyName, selection.DoesNotExist, nil)
	if proxyName != "" {
		proxy, err = labels.NewRequirement(LabelServiceProxyName, selection.Equals, []string{proxyName})
	}
	if err != nil {
		return "", err
	}
	headless, err := labels.NewRequirement(corev1.IsHeadlessService, selection.DoesNotExist, nil)
	if err != nil {
		return "", err
	}
	return labels.NewSelector().Add(*proxy, *headless).String(), nil
}

// problemLog remembers the problems BuildSnapshot reported, so that each
// is logged once for as long as it keeps being reported: every snapshot is
// built from every object, so the same problems come back on every change.
type problemLog struct {
	seen map[string]bool
}

// fresh returns the problems not reported by the previous build, each
// message once.
func (p *problemLog) fresh(problems []error) []error {
	now := make(map[string]bool, len(problems))
	var out []error
	for _, e := range problems {
		msg := e.Error()
		if now[msg] {
			continue
		}
		now[msg] = true
		if !p.seen[msg] {
			out = append(out, e)
		}
	}
	p.seen = now
	return out
}

// whyNothingServed and whyServedStays are what a forbidden Service or
// EndpointSlice list means before the informer synced once, and after.
const (
	whyNothingServed = "nothing is served"
	whyServedStays   = "what is served stays as it is"
)

// nodeSyncWait is how long the first sync waits for this node's Node.
const nodeSyncWait = 10 * time.Second

// observedTriggers returns the trigger times of the Services whose
// service ports changes names, and puts back those of Services that do not
// exist yet; the rest changed nothing served.
func (t *tracker) observedTriggers(v indexerView, triggers map[objectRef][]state.ChangeTrigger, changes state.Changes, now time.Time) []state.ChangeTrigger {
	served := make(map[objectRef]bool)
	for _, n := range slices.Concat(changes.Services, changes.Endpoints) {
		served[objectRef{n.Namespace, n.Name}] = true
	}
	var out []state.ChangeTrigger
	for ref, at := range triggers {
		switch {
		case served[ref]:
			out = append(out, at...)
		case !serviceExists(v, ref):
			t.keepTriggers(ref, at, now)
		}
	}
	slices.SortFunc(out, func(a, b state.ChangeTrigger) int { return a.At.Compare(b.At) })
	return out
}

// serviceExists reports whether the informer holds the Service ref.
func serviceExists(v indexerView, ref objectRef) bool {
	_, ok, err := v.services.GetByKey(ref.key())
	return ok || err != nil
}
