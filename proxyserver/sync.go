package proxyserver

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-multierror"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// syncLoop applies the newest snapshot on one goroutine. Offers coalesce:
// however many arrive during an apply, the next apply sees only the last.
// A failed apply is retried after retryMin, doubling up to resync; a good
// one is repeated every resync, which re-opens anything that failed and
// sweeps expired affinity.
type syncLoop struct {
	apply    func(state.Snapshot) error
	retryMin time.Duration
	resync   time.Duration
	health   *proxyHealth // told of offers and of syncs that applied them; may be nil (see run)
	metrics  *metrics     // told the same, and how long each sync took; may be nil

	// stallFirst and stallEvery are when a sync that has not ended is
	// logged: after stallFirst, then every stallEvery while it runs.
	stallFirst, stallEvery time.Duration

	kick chan struct{}

	mu       sync.Mutex // guards the fields below
	latest   state.Snapshot
	have     bool
	version  uint64           // bumped by every offer
	triggers []offeredTrigger // change trigger times offered and not yet applied
	// changedServices (changedEndpoints) are the Services with a Service
	// (endpoint) change offered and not yet applied, each with the
	// version of the last offer that brought one.
	changedServices, changedEndpoints map[state.ServiceName]uint64
}

// offeredTrigger is a change trigger, and the version of the offer that
// brought it.
type offeredTrigger struct {
	version uint64
	state.ChangeTrigger
}

// maxOfferedTriggers bounds the trigger times kept while syncs fail.
const maxOfferedTriggers = 10000

func newSyncLoop(apply func(state.Snapshot) error, retryMin, resync time.Duration) *syncLoop {
	return &syncLoop{apply: apply, retryMin: max(retryMin, 100*time.Millisecond), resync: resync, kick: make(chan struct{}, 1),
		stallFirst: 10 * time.Second, stallEvery: time.Minute,
		changedServices: make(map[state.ServiceName]uint64), changedEndpoints: make(map[state.ServiceName]uint64)}
}

// offer hands the loop a new desired state. It never blocks.
func (l *syncLoop) offer(s state.Snapshot) {
	l.mu.Lock()
	logIgnoredHints(l.latest, s)
	l.latest, l.have = s, true
	l.version++
	for _, tr := range s.ChangeTriggers {
		if len(l.triggers) < maxOfferedTriggers {
			l.triggers = append(l.triggers, offeredTrigger{l.version, tr})
		}
	}
	for _, n := range s.Changes.Services {
		l.changedServices[n] = l.version
	}
	for _, n := range s.Changes.Endpoints {
		l.changedEndpoints[n] = l.version
	}
	if l.metrics != nil {
		l.metrics.queued(s.Changes)
		l.reportPending()
	}
	l.mu.Unlock()
	if l.health != nil {
		l.health.queued()
	}
	l.poke()
}

// logIgnoredHints logs at -v=2, as kube-proxy does, why the topology
// hints of a service port of cur are ignored (see
// state.ServicePort.TopologyHintsIgnored), when that differs from what
// old said: once per change, not at every snapshot.
func logIgnoredHints(old, cur state.Snapshot) {
	if !klog.V(2).Enabled() {
		return
	}
	for sp := range cur.All {
		was := ""
		if o := old.Get(sp.Name); o != nil {
			was = o.TopologyHintsIgnored
		}
		switch {
		case sp.TopologyHintsIgnored == was:
		case sp.TopologyHintsIgnored != "":
			klog.V(2).InfoS("Ignoring topology hints for service", "service", sp.Name, "reason", sp.TopologyHintsIgnored)
		default:
			klog.V(2).InfoS("Topology hints for service no longer ignored: they are used, or gone", "service", sp.Name)
		}
	}
}

// poke asks for the current snapshot to be applied again, for a change
// the snapshot does not show (such as the host's addresses). It never
// blocks.
func (l *syncLoop) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// applied forgets what the offers up to version brought, which a sync has
// applied, and returns their change triggers.
func (l *syncLoop) applied(version uint64) []state.ChangeTrigger {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range []map[state.ServiceName]uint64{l.changedServices, l.changedEndpoints} {
		maps.DeleteFunc(m, func(_ state.ServiceName, v uint64) bool { return v <= version })
	}
	if l.metrics != nil {
		l.reportPending()
	}
	var out []state.ChangeTrigger
	kept := l.triggers[:0]
	for _, t := range l.triggers {
		if t.version <= version {
			out = append(out, t.ChangeTrigger)
		} else {
			kept = append(kept, t)
		}
	}
	l.triggers = kept
	return out
}

// reportPending tells the metrics how many Services have changes not yet
// applied. l.mu must be held, so that reports arrive in order.
func (l *syncLoop) reportPending() {
	l.metrics.pending(len(l.changedServices), len(l.changedEndpoints))
}

func (l *syncLoop) current() (state.Snapshot, uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.latest, l.version, l.have
}

// run applies snapshots until ctx is done.
func (l *syncLoop) run(ctx context.Context) {
	timer := time.NewTimer(l.resync)
	defer timer.Stop()
	backoff := time.Duration(0)
	var lastErrs map[string]bool // the failures last logged, by message
	var logged uint64            // the last version a "Synced" line named
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
		case <-timer.C:
		}
		snap, version, ok := l.current()
		if !ok {
			continue // nothing to serve until the source has synced
		}
		start := time.Now()
		ended := l.watchStall(start, snap.Len(), version)
		err := l.apply(snap)
		ended()
		took := time.Since(start)
		next := l.resync
		var deferred errDeferred
		var kernel kernelError
		// Health counts the change applied unless the proxy's own
		// machinery failed or waits: a Service that cannot be served (a
		// node port another program holds) is logged and retried, but a
		// restart would not help it, and an unhealthy proxy drains every
		// Service from this node.
		done := !errors.As(err, &deferred) && !errors.As(err, &kernel)
		waits := errors.As(err, &deferred)
		if waits {
			// Part of the work waits for a rate limit: come back then.
			next, err = deferred.after, nil
		}
		if done && l.health != nil {
			_, latest, _ := l.current()
			l.health.updated(start, latest != version)
		}
		var triggers []state.ChangeTrigger
		if done {
			triggers = l.applied(version)
		}
		if l.metrics != nil {
			failed := ""
			switch {
			case errors.As(err, &kernel):
				failed = failedPortal
			case err != nil:
				failed = failedServices
			}
			l.metrics.synced(snap, took, done, !waits, failed)
			l.metrics.programmed(triggers, time.Now())
		}
		if err != nil {
			fdShort := shortOfFDs(err)
			backoff = l.retryAfter(fdShort, backoff)
			next = backoff
			lastErrs = logSyncFailure(err, lastErrs, fdShort, "retryIn", next, "maxRetryInterval", l.resync, "servicePorts", snap.Len())
		} else {
			if lastErrs != nil {
				klog.InfoS("Sync recovered", "servicePorts", snap.Len())
			}
			backoff, lastErrs = 0, nil
			// A periodic resync of an unchanged snapshot is news only at
			// -v=4.
			v := klog.Level(2)
			switch {
			case waits:
				// The data plane has the change; "Synced" comes once the
				// portal has it too.
				klog.V(4).InfoS("Applied to the data plane; the portal waits for --iptables-min-sync-period", "version", version, "took", took, "retryIn", next)
			case version == logged:
				v = 4
				fallthrough
			default:
				logged = version
				klog.V(v).InfoS("Synced", "servicePorts", snap.Len(), "version", version, "took", took)
			}
		}
		resetTimer(timer, next)
	}
}

// watchStall watches a sync that started at start: one that runs on (an
// iptables-restore waiting for the xtables lock) logs no error, so it is
// logged after stallFirst and every stallEvery while it runs, and health
// names it as the reason a change waits. The returned func, called as the
// sync ends, stops that; no line comes after it returns.
func (l *syncLoop) watchStall(start time.Time, servicePorts int, version uint64) (ended func()) {
	if l.health != nil {
		l.health.syncing(start)
	}
	var mu sync.Mutex // guards done and t
	done := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(l.stallFirst, func() {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		klog.InfoS("Sync still running", "runningFor", time.Since(start).Round(time.Second), "servicePorts", servicePorts, "version", version,
			"logEvery", l.stallEvery)
		t.Reset(l.stallEvery)
	})
	return func() {
		mu.Lock()
		done = true
		t.Stop()
		mu.Unlock()
		if l.health != nil {
			l.health.syncing(time.Time{})
		}
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}

// splitErrors returns the failures a sync's error holds (see joinErrors),
// one by one.
func splitErrors(err error) []error {
	var m *multierror.Error
	if !errors.As(err, &m) || len(m.Errors) == 0 {
		return []error{err}
	}
	var out []error
	for _, e := range m.Errors {
		out = append(out, splitErrors(e)...)
	}
	return out
}

// oneError joins errs as a sync's error is joined, on one line.
func oneError(errs []error) error {
	m := &multierror.Error{Errors: errs, ErrorFormat: oneLine}
	return m.ErrorOrNil()
}

// logSyncFailure logs a sync's failure err, given the failures logged
// before (by message), and returns those logged now and before that still
// fail. Each is named once, when it first happens, not at every retry nor
// again beside each new one (a full proxy port range fails Services one by
// one as they come); a line names at most maxShownErrors, and those past
// it are named by the next. Failures that are over while others go on are
// counted. fdShort says the retry is not the doubling pause.
func logSyncFailure(err error, logged map[string]bool, fdShort bool, kv ...any) map[string]bool {
	msg := "Sync failed; will retry, less often each time, until it succeeds"
	if fdShort {
		msg = "Sync failed; will retry at most a second apart while file descriptors are short, until it succeeds"
	}
	errs := splitErrors(err)
	failing := make(map[string]bool, len(errs))
	var fresh []error
	for _, e := range errs {
		failing[e.Error()] = true
		if !logged[e.Error()] {
			fresh = append(fresh, e)
		}
	}
	over := 0
	still := make(map[string]bool, len(logged))
	for m := range logged {
		if failing[m] {
			still[m] = true
		} else {
			over++
		}
	}
	if over > 0 {
		klog.InfoS("Some sync failures are over", "over", over, "stillFailing", len(errs))
	}
	named := fresh[:min(len(fresh), maxShownErrors)]
	switch {
	case len(fresh) == len(errs) && len(errs) <= maxShownErrors:
		klog.ErrorS(err, msg, kv...)
	case len(fresh) > 0:
		if before := len(errs) - len(fresh); before > 0 {
			kv = append(kv, "alsoFailingAsBefore", before)
		}
		klog.ErrorS(oneError(fresh), msg, kv...)
	default:
		klog.V(2).InfoS("Sync failed again", append(kv[:2:2], "failing", len(errs))...)
	}
	for _, e := range named {
		still[e.Error()] = true
	}
	return still
}

// shortOfFDs reports whether err holds a failure for want of file
// descriptors.
func shortOfFDs(err error) bool {
	return slices.ContainsFunc(splitErrors(err), func(e error) bool {
		return errors.Is(e, syscall.EMFILE) || errors.Is(e, syscall.ENFILE)
	})
}

// retryAfter returns the pause before a failed sync is tried again, the
// last pause having been backoff: twice that, from retryMin up to resync.
// A sync that ran out of file descriptors (fdShort: a Service added while
// clients hold them all) is tried again every retryMin, at most a second
// apart, instead: descriptors come back as clients leave, and nothing else
// would say so before a pause of up to resync was over.
func (l *syncLoop) retryAfter(fdShort bool, backoff time.Duration) time.Duration {
	if fdShort {
		return min(l.retryMin, time.Second)
	}
	return min(max(2*backoff, l.retryMin), l.resync)
}
