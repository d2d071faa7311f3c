package source

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// grantedVerbs are the verbs the ClusterRole of
// deploy/kube-userspace-proxy.yaml grants on each resource the proxy reads
// (those of kube-proxy's system:node-proxier): what a refusal's hint
// names. TestGrantedVerbsAreTheDeployRole keeps them equal.
var grantedVerbs = map[string]string{
	"services":       "list,watch",
	"endpointslices": "list,watch",
	"nodes":          "get,list,watch",
}

// refusalPersists is how long the API server must go on refusing a list
// or watch (403 Forbidden) before the proxy reports it as an RBAC problem:
// a retry refused at least this long after the first refusal, with nothing
// else between, is. A restarted kube-apiserver answers 403 to everyone for
// the second or two it takes to fill its RBAC caches; ten seconds is well
// past that. client-go retries after 0.8 s, doubling (times 1 to 2 for
// jitter), so a refusal that stands is reported some 12 to 25 s after the
// first.
const refusalPersists = 10 * time.Second

// refusals follows the 403s the API server answers one informer's lists
// and watches with, and says plainly when one persists what RBAC forbids,
// what that means meanwhile and which verbs the deploy ClusterRole grants
// (client-go's own message repeats with every retry and names no fix);
// then, once the informer lists or watches again, that it does, in one
// line: a refusal of the other verb that came with the one reported, never
// reported itself, is part of it, not a passing one. A later refusal that
// persists is reported again. The informer keeps retrying, so a later
// grant is picked up without a restart.
type refusals struct {
	resource, group string
	// unread is what a forbidden list means before the informer synced
	// once; stale after (its cache is kept).
	unread, stale string
	synced        func() bool
	report        func(err error, msg string, kv ...any) // err is nil for good news

	mu   sync.Mutex // guards the fields below
	read refusal    // lists (or, in client-go's watch-list mode, everything)
	// watch is of watches after a list that worked; zero while read is
	// reported, which stands for it.
	watch refusal
}

// refusal is a run of refusals of one kind with nothing else between.
type refusal struct {
	since    time.Time // the first; zero when not refused
	reported bool
}

// refused notes a 403 of ListAndWatch, which client-go gives its watch
// error handler: of the watch when the API server let the proxy list but
// not watch, else of the list.
func (r *refusals) refused(err error) {
	watch := strings.Contains(err.Error(), "cannot watch")
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.read
	if watch {
		if r.read.reported {
			return // reading is forbidden, watching too: said
		}
		s = &r.watch
	}
	now := time.Now()
	switch {
	case s.since.IsZero():
		s.since = now
		return
	case s.reported || now.Sub(s.since) < refusalPersists:
		return
	}
	s.reported = true
	kv := []any{"resource", r.resource, "apiGroup", r.group, "verbs", grantedVerbs[r.resource], "for", now.Sub(s.since).Round(time.Second)}
	if watch {
		// The list worked: client-go lists again and again, which serves
		// what each list sees.
		r.report(err, "The API server lets the proxy list but not watch; what is served follows lists client-go repeats up to a minute apart, so changes come late and cost the API server more, until RBAC allows watch (deploy/kube-userspace-proxy.yaml has the ClusterRole)", kv...)
		return
	}
	// A refused watch is part of this refusal, which it may have begun
	// (the one an informer resumes after the API server restarted), and
	// is lifted with it: once lists work, a watch still refused is a new
	// refusal, of watch alone.
	r.watch = refusal{}
	meanwhile := r.unread
	if r.synced != nil && r.synced() {
		meanwhile = r.stale
	}
	r.report(err, "The API server forbids reading what the proxy needs; "+meanwhile+" until RBAC allows it (deploy/kube-userspace-proxy.yaml has the ClusterRole)", kv...)
}

// failed notes another error of ListAndWatch: a refusal before it, not
// yet reported, is not counted with those after it.
func (r *refusals) failed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range []*refusal{&r.read, &r.watch} {
		if !s.reported {
			*s = refusal{}
		}
	}
}

// listed notes a list that worked.
func (r *refusals) listed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clear(&r.read, "list", r.told())
}

// watched notes a watch that the API server accepted; in client-go's
// watch-list mode the watch lists too.
func (r *refusals) watched() {
	r.mu.Lock()
	defer r.mu.Unlock()
	told := r.told()
	r.clear(&r.read, "list", told)
	r.clear(&r.watch, "watch", told)
}

// told says whether a refusal of either verb was reported and not yet
// lifted.
func (r *refusals) told() bool {
	return r.read.reported || r.watch.reported
}

// clear ends the refusal s of verb, saying so: that it is lifted if it was
// reported; else, unless told (a refusal of the other verb was reported,
// and s came with it), that it passed.
func (r *refusals) clear(s *refusal, verb string, told bool) {
	if s.since.IsZero() {
		return
	}
	took := time.Since(s.since).Round(time.Second)
	switch {
	case s.reported && verb == "watch":
		r.report(nil, "The API server lets the proxy watch again; changes are served as they come", "resource", r.resource, "apiGroup", r.group, "after", took)
	case s.reported:
		r.report(nil, "The API server lets the proxy read again what it forbade", "resource", r.resource, "apiGroup", r.group, "after", took)
	case !told:
		r.report(nil, "The API server refused for a moment what it allows now: a restarted API server does until it has loaded RBAC, or RBAC changed meanwhile", "resource", r.resource, "apiGroup", r.group, "verb", verb, "for", took)
	}
	*s = refusal{}
}

// handler is the informer's watch error handler: it notes refusals, and
// rejected credentials (see credentials). Every error goes to client-go's
// handler too.
func (r *refusals) handler(creds *credentials) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, refl *cache.Reflector, err error) {
		if apierrors.IsForbidden(err) {
			r.refused(err)
		} else {
			r.failed()
		}
		if apierrors.IsUnauthorized(err) {
			creds.rejected(r.resource, err, r.report)
		}
		cache.DefaultWatchErrorHandler(ctx, refl, err)
	}
}

// credentials says, once for all the informers sharing it, when the API
// server stops accepting the proxy's credentials (401 Unauthorized):
// client-go's own message repeats with every retry and names no fix. Once
// every informer it rejected lists or watches again it says so, and a
// later rejection is said again (an expired token, a rotated
// certificate).
type credentials struct {
	mu  sync.Mutex      // guards bad
	bad map[string]bool // the resources whose informer was rejected, not accepted since
}

// rejected notes a 401 to the informer of resource.
func (c *credentials) rejected(resource string, err error, report func(err error, msg string, kv ...any)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) == 0 {
		report(err, "The API server does not accept the proxy's credentials (401 Unauthorized); nothing new is served until it does: check the token or client certificate of the kubeconfig, or the ServiceAccount's token in a pod")
	}
	if c.bad == nil {
		c.bad = make(map[string]bool)
	}
	c.bad[resource] = true
}

// accepted notes a list or watch of the informer of resource that worked.
func (c *credentials) accepted(resource string, report func(err error, msg string, kv ...any)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.bad[resource] {
		return
	}
	delete(c.bad, resource)
	if len(c.bad) == 0 {
		report(nil, "The API server accepts the proxy's credentials again")
	}
}

// readInformer returns factory's informer of obj's type, which lists and
// watches with list and watch and tells r of each that works (client-go
// only tells of failures) and of each failure.
func readInformer(factory informers.SharedInformerFactory, obj runtime.Object, r *refusals, creds *credentials,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) (cache.SharedIndexInformer, error) {
	inf := factory.InformerFor(obj, func(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				out, err := list(ctx, o)
				if err == nil {
					r.listed()
					creds.accepted(r.resource, r.report)
				}
				return out, err
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				w, err := watchFn(ctx, o)
				if err == nil {
					r.watched()
					creds.accepted(r.resource, r.report)
				}
				return w, err
			},
		}
		return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), obj, resync,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	})
	r.synced = inf.HasSynced
	if err := inf.SetWatchErrorHandlerWithContext(r.handler(creds)); err != nil {
		return nil, fmt.Errorf("cluster: watch %s: %w", r.resource, err)
	}
	return inf, nil
}

// logReport logs a report of contact or refusals: an error, or with err
// nil good news.
func logReport(err error, msg string, kv ...any) {
	if err != nil { // depth 1: the caller of report
		klog.ErrorSDepth(1, err, msg, kv...)
	} else {
		klog.InfoSDepth(1, msg, kv...)
	}
}
