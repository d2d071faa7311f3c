package proxyserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/conntrack"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// choosePortal builds the portal for mode; auto picks iptables when it can
// be used, else bind when we may change addresses, else none, and says why.
// Following a cluster, auto never picks none: it is an error, since no
// Service IP would be served (none must be asked for).
// dnat is where the iptables portal sends traffic (IPTablesConfig.DNAT).
func choosePortal(ctx context.Context, cfg *Config, dnat func(portal.Family) netip.Addr) (portal.Interface, string, error) {
	ipt := func() (portal.Interface, error) {
		return portal.NewIPTables(ctx, portal.IPTablesConfig{NodePortAddresses: cfg.nodePorts, NoLocalhostNodePorts: !cfg.LocalhostNodePorts, ClusterCIDRs: cfg.podCIDRs, DNAT: dnat})
	}
	bind := func() (portal.Interface, error) {
		return portal.NewBind(ctx, portal.BindConfig{Interface: cfg.BindInterface})
	}
	switch cfg.Portal {
	case PortalNone:
		return portal.Noop{}, PortalNone, nil
	case PortalIPTables:
		p, err := ipt()
		if err != nil {
			return nil, "", portalError(PortalIPTables, err)
		}
		return p, PortalIPTables, nil
	case PortalBind:
		p, err := bind()
		if err != nil {
			return nil, "", portalError(PortalBind, err)
		}
		return p, PortalBind, nil
	}
	p, err := ipt()
	if err == nil {
		klog.InfoS("Portal chosen", "portal", PortalIPTables, "reason", "iptables is usable")
		return p, PortalIPTables, nil
	}
	iptErr := err
	// cluster: the proxy follows a cluster, whose Services' addresses
	// clients use: none would serve none of them and stay healthy, so auto
	// refuses it there (manifest mode keeps none, for a first run without
	// root).
	cluster := cfg.Manifests == ""
	if !portal.BindAddsAddresses {
		if cluster {
			return nil, "", fmt.Errorf("--portal=auto: iptables is not usable (%v) and this system's bind portal cannot add service addresses, so no Service IP would be served; give --portal=none explicitly to serve only node ports and proxy ports, or --portal=bind with the service addresses added by hand", iptErr)
		}
		// The bind portal here only checks that someone else put the
		// service addresses on the host: not a choice to make for them.
		klog.InfoS("Portal chosen", "portal", PortalNone, "reason", "iptables is not usable and this system's bind portal cannot add service addresses: clients use the proxy ports and node ports directly (--portal=bind serves addresses you add)", "iptablesError", iptErr.Error())
		return portal.Noop{}, PortalNone, nil
	}
	bp, err := bind() // fails without CAP_NET_ADMIN
	if err == nil {
		klog.InfoS("Portal chosen", "portal", PortalBind, "reason", "iptables is not usable and we may change addresses", "iptablesError", iptErr.Error())
		return bp, PortalBind, nil
	}
	if cluster {
		return nil, "", noPortalError(iptErr, err, os.Geteuid() == 0)
	}
	klog.InfoS("Portal chosen", "portal", PortalNone, "reason", "iptables is not usable and we may not change addresses: clients use the proxy ports and node ports directly", "iptablesError", iptErr.Error(), "bindError", err.Error())
	return portal.Noop{}, PortalNone, nil
}

// noPortalError is --portal=auto's refusal in cluster mode when neither
// iptables (iptErr) nor the bind portal (bindErr) can be used. root says
// the process runs as uid 0: then what it lacks is the capability (a
// container's bounding set without it, as with drop: [ALL]), and running
// as root is no advice.
func noPortalError(iptErr, bindErr error, root bool) error {
	how := "run with CAP_NET_ADMIN (as root, runAsUser: 0, with the iptables commands for the iptables portal)"
	if root {
		how = "this process runs as root but without CAP_NET_ADMIN (not in its capability bounding set, as in a container whose securityContext drops ALL): add NET_ADMIN to securityContext.capabilities.add"
	}
	return fmt.Errorf("--portal=auto: neither iptables (%s) nor the bind portal (%s) can be used, so no Service IP would be served: %s, or give --portal=none explicitly to serve only node ports and proxy ports",
		flatMessage(iptErr), flatMessage(bindErr), how)
}

// flatMessage is err's message on one line: a command's stderr, as
// iptables errors carry it, ends in a newline and may hold several lines.
func flatMessage(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// removeOtherPortal removes what a previous run with another portal left,
// as --cleanup would: iptables rules would REDIRECT service traffic to
// proxy ports nobody serves now, and the bind portal's service addresses
// would make load-balancer IPs this host's own. The iptables and bind
// portals hold CAP_NET_ADMIN for it. With none, a proxy that holds it
// removes both when no running proxy serves them (one run as root after a
// run with another portal); a proxy without CAP_NET_ADMIN leaves the
// kernel alone, saying what a bind portal left, which it can see.
func removeOtherPortal(ctx context.Context, mode string, cfg *Config) {
	if mode == PortalNone && portal.CheckNetAdmin() != nil {
		if left := portal.BindLeftovers(); len(left) > 0 {
			klog.InfoS("Service addresses a bind portal left on this host stay, as this proxy may not remove them: their clients are refused; --cleanup with CAP_NET_ADMIN removes them", "addresses", left)
		}
		return
	}
	if mode != PortalIPTables {
		removeIPTablesLeftovers(ctx, mode == PortalNone)
	}
	if mode == PortalNone {
		removeBindLeftovers(ctx, cfg)
	}
	if mode == PortalIPTables {
		b, err := portal.NewBind(ctx, portal.BindConfig{Interface: cfg.BindInterface})
		if err != nil {
			return
		}
		defer b.Close()
		if err := b.Cleanup(ctx); err != nil {
			klog.ErrorS(err, "Could not remove the service addresses the bind portal of a previous run may have left; --cleanup removes them")
		}
	}
}

// proxyPortsServed reports whether some program listens on a proxy port
// the portals redirect to.
func proxyPortsServed(portals []portal.Portal) bool {
	for _, p := range portals {
		if p.ProxyPort == 0 {
			continue
		}
		addr := net.JoinHostPort("", strconv.Itoa(int(p.ProxyPort)))
		var err error
		if p.Protocol() == state.UDP {
			var c net.PacketConn
			if c, err = net.ListenPacket("udp", addr); err == nil {
				c.Close()
			}
		} else {
			var l net.Listener
			if l, err = net.Listen("tcp", addr); err == nil {
				l.Close()
			}
		}
		if err != nil {
			return true
		}
	}
	return false
}

// removeBindLeftovers removes the service addresses a bind portal left,
// unless a socket is bound to one of them: then a bind portal's proxy runs
// beside this one (a DaemonSet's, while someone tries this one out), and
// removing them would cut its traffic.
func removeBindLeftovers(ctx context.Context, cfg *Config) {
	b, err := portal.NewBind(ctx, portal.BindConfig{Interface: cfg.BindInterface})
	if err != nil {
		return
	}
	defer b.Close()
	owned, err := b.Owned()
	if err != nil || len(owned) == 0 {
		return
	}
	inUse, err := portal.AddrsInUse(owned)
	switch {
	case err != nil:
		klog.ErrorS(err, "Cannot tell whether a running proxy serves the service addresses a bind portal put on this host; leaving them (--cleanup removes them)", "addresses", len(owned))
		return
	case len(inUse) > 0:
		klog.InfoS("Leaving the bind portal's service addresses alone: a running proxy serves them", "addresses", len(owned), "inUse", len(inUse))
		return
	}
	klog.InfoS("Removing the service addresses a previous run's bind portal left: they would make load-balancer and external IPs this host's own", "addresses", len(owned))
	if err := b.Cleanup(ctx); err != nil {
		klog.ErrorS(err, "Could not remove every service address a previous run left; --cleanup removes them")
	}
}

// removeIPTablesLeftovers removes the iptables portal's rules and chains;
// onlyFound, when a portal rule is found (read-only otherwise: a proxy
// without a portal, run as root on a host, changes none of its rules when
// it has nothing to remove).
func removeIPTablesLeftovers(ctx context.Context, onlyFound bool) {
	ipt, err := portal.NewIPTables(ctx, portal.IPTablesConfig{ForCleanup: true})
	if err != nil {
		return // no iptables here: nothing can be left
	}
	left, _ := ipt.Existing(ctx)
	switch {
	case len(left) == 0 && onlyFound:
		return
	case onlyFound && proxyPortsServed(left):
		// Another proxy on this host owns them (a DaemonSet's, while
		// someone tries this one out): they are not leftovers.
		klog.InfoS("Leaving the iptables portal's rules alone: a running proxy serves the ports they redirect to")
		return
	case len(left) > 0:
		klog.InfoS("Removing the iptables portal's rules a previous run left: they would redirect service traffic to ports nobody serves now")
	}
	// Else always: filter chains alone would still drop load-balancer
	// traffic.
	if err := ipt.Cleanup(ctx); err != nil {
		klog.ErrorS(err, "Could not remove every iptables rule a previous run left; --cleanup removes them, run with the privileges that can read and change them")
	}
	if err := clearRemovedUDP(ctx, ipt.Removed()); err != nil {
		klog.ErrorS(err, "Could not delete the UDP conntrack entries of the removed iptables rules: clients that keep their source port stay on the old proxy ports until their entries time out; --cleanup deletes them")
	}
}

// clearRemovedUDP deletes the UDP conntrack entries the rules of removed
// portals made (conntrack.RemovedUDP), whatever portal runs now: each
// keeps a client that goes on talking from the same port (a resolver) on
// the removed REDIRECT or DNAT, to a proxy port nobody serves. Deleting
// needs CAP_NET_ADMIN, which removing the rules needed too.
func clearRemovedUDP(ctx context.Context, removed []portal.Portal) error {
	filters := conntrack.RemovedUDP(removed)
	if len(filters) == 0 {
		return nil
	}
	ct, err := conntrack.New()
	if err != nil {
		return err
	}
	if c, ok := ct.(io.Closer); ok {
		defer c.Close()
	}
	n, err := ct.ClearUDP(ctx, filters...)
	if err != nil {
		return err
	}
	klog.InfoS("Deleted the UDP conntrack entries of the removed iptables rules", "entries", n, "filters", len(filters))
	return nil
}

// errDeferred asks the sync loop to call again after a while, without
// treating it as a failure.
type errDeferred struct{ after time.Duration }

func (e errDeferred) Error() string { return fmt.Sprintf("kernel sync deferred %v", e.after) }

// kernelSync rate-limits portal syncs: the rules are rewritten only when the
// portals changed (endpoint changes never touch the kernel) or a full
// resync is due and finds them otherwise than a sync would write them, and
// never more often than minPeriod. After a sync that removed or moved UDP
// portals it deletes the conntrack entries that would keep clients on the
// dead mapping.
type kernelSync struct {
	pt        portal.Interface
	ct        conntrack.Interface // nil: no conntrack cleanup
	minPeriod time.Duration
	resync    time.Duration

	last    []portal.Portal              // nil before the first sync: a restart clears every UDP frontend
	dnat    *dnatTargets                 // where the iptables portal sends traffic; nil for other portals
	targets map[portal.Family]netip.Addr // dnat's decision at the last sync
	// heldTargets is where a previous run's rules (last, before the
	// first sync) sent traffic, per family, as read back at start
	// (portal.IPTables.ExistingTargets); nil once synced, or when unknown.
	heldTargets map[portal.Family][]netip.Addr
	lastTime    time.Time
	synced      bool
	stale       []conntrack.Filter // conntrack entries still to delete
}

func (k *kernelSync) sync(ctx context.Context, portals []portal.Portal) error {
	now := time.Now()
	var targets map[portal.Family]netip.Addr
	if k.dnat != nil {
		targets = k.dnat.decide(now)
	}
	same := k.synced && slices.EqualFunc(portals, k.last, portal.Portal.Equal) && len(movedFamilies(k.targets, targets)) == 0 &&
		!portalStale(k.pt)
	if same && now.Sub(k.lastTime) < k.resync {
		return nil
	}
	if c, ok := k.pt.(checker); ok && same {
		// A full resync: when the kernel holds just what a Sync would
		// write, write nothing (thousands of rules replaced every period
		// for nothing, and with nft a new generation of the whole
		// ruleset). Anything else, or rules that cannot be read back,
		// is written as before.
		start := time.Now()
		in, err := c.InSync(ctx, portals)
		if err != nil {
			klog.V(2).InfoS("Cannot read the portal's rules back; writing them again", "err", err)
		}
		if err == nil && in {
			k.lastTime = now
			klog.V(2).InfoS("Portals in place; nothing written", "portals", len(portals), "took", time.Since(start))
			return k.clearStale(ctx)
		}
	}
	var held []portal.Portal // what the rules held, when something else rewrote them
	if d, ok := k.pt.(drifter); ok && same {
		// A full resync: first see whether the rules are still ours.
		if h, drifted, err := d.Drift(ctx); err == nil && drifted {
			held = h
			klog.ErrorS(nil, "The portal's rules were rewritten by something else since the last sync (another kube-userspace-proxy on this host?); writing this proxy's again", "redirects", len(h), "wrote", len(portals))
		}
	}
	if wait := k.minPeriod - now.Sub(k.lastTime); k.synced && wait > 0 {
		return errDeferred{after: wait}
	}
	start := time.Now()
	if err := k.pt.Sync(ctx, portals); err != nil {
		k.synced = false // retry at the next call, even if nothing changes and the min period is not over
		return kernelError{err}
	}
	var removed []portal.Portal // what rules the portal removed held (our chains in the other backend)
	if r, ok := k.pt.(remover); ok {
		removed = r.Removed()
	}
	var movedFrom, movedTo []portal.Portal // node ports whose rules' destinations changed
	if m, ok := k.pt.(nodePortMover); ok {
		movedFrom, movedTo = m.MovedNodePorts()
	}
	if k.ct != nil {
		// A client narrowed out of a node port's addresses stays on its
		// REDIRECTed entry, one widened in on its unredirected one.
		k.stale = append(k.stale, conntrack.StaleUDP(movedFrom, nil)...)
		k.stale = append(k.stale, conntrack.StaleUDP(nil, movedTo)...)
		k.stale = append(k.stale, conntrack.StaleUDP(k.last, portals)...)
		k.stale = append(k.stale, conntrack.RemovedUDP(removed)...)
		if held != nil {
			// UDP flows the other rules redirected keep that mapping,
			// whether they moved the proxy port or only where it is
			// (REDIRECT, or DNAT to which address).
			k.stale = append(k.stale, conntrack.StaleUDP(held, portals)...)
			k.stale = append(k.stale, conntrack.RemovedUDP(held)...)
		}
		if k.last != nil {
			// A flow's entry keeps the old mapping, whose address may be
			// gone from this host. After a restart the old mapping is
			// what the previous run's rules said, not this run's
			// (nothing) decision.
			moved := movedFamilies(k.targets, targets)
			if k.heldTargets != nil {
				moved = heldMoved(k.heldTargets, targets)
			}
			for _, f := range moved {
				k.stale = append(k.stale, conntrack.RetargetedUDP(portals, f)...)
			}
		}
	}
	k.last, k.targets, k.lastTime, k.synced = portals, targets, now, true
	k.heldTargets = nil
	klog.V(2).InfoS("Portals synced", "portals", len(portals), "took", time.Since(start))
	return k.clearStale(ctx)
}

// clearStale deletes the conntrack entries of removed UDP portals; on
// failure they are tried again on the next sync.
func (k *kernelSync) clearStale(ctx context.Context) error {
	if len(k.stale) == 0 {
		return nil
	}
	n, err := k.ct.ClearUDP(ctx, k.stale...)
	if err != nil {
		k.synced = false // come back to retry
		return fmt.Errorf("conntrack: %w", err)
	}
	klog.V(2).InfoS("Deleted stale UDP conntrack entries", "entries", n, "filters", len(k.stale))
	k.stale = nil
	return nil
}

// remover is a portal that tells which portals' rules it removed
// (portal.IPTables).
type remover interface {
	Removed() []portal.Portal
}

// nodePortMover is a portal that tells which node ports' rules changed
// their destinations (portal.IPTables).
type nodePortMover interface {
	MovedNodePorts() (from, to []portal.Portal)
}

// staler is a portal whose Sync of the same portals may do more than the
// last one did, and that can tell cheaply (portal.Bind: IPv6 turned back
// on, or off).
type staler interface {
	Stale() bool
}

func portalStale(pt portal.Interface) bool {
	s, ok := pt.(staler)
	return ok && s.Stale()
}

// checker is a portal that can tell, by reading the kernel, whether a
// Sync of portals would change anything (portal.IPTables).
type checker interface {
	InSync(ctx context.Context, portals []portal.Portal) (bool, error)
}

// drifter is a portal that can tell whether its rules are still as it
// wrote them (portal.IPTables).
type drifter interface {
	Drift(ctx context.Context) (held []portal.Portal, drifted bool, err error)
}

// kernelError is a failure to program the kernel's redirection: the proxy
// itself is failing then, not one Service it cannot serve.
type kernelError struct{ err error }

func (e kernelError) Error() string { return e.err.Error() }
func (e kernelError) Unwrap() error { return e.err }

// joinErrors combines the errors of one sync; an errDeferred is kept only
// when nothing failed.
func joinErrors(errs ...error) error {
	var m *multierror.Error
	var deferred error
	for _, err := range errs {
		var d errDeferred
		switch {
		case err == nil:
		case errors.As(err, &d):
			deferred = err
		default:
			m = multierror.Append(m, err)
		}
	}
	if m != nil {
		m.ErrorFormat = oneLine
	}
	if err := m.ErrorOrNil(); err != nil {
		return err
	}
	return deferred
}

// oneLine formats a sync's errors on one line, so each stays one log line
// ("2 errors: …; …") rather than go-multierror's indented list. Past
// maxShownErrors it names how many more there are: a full proxy port range
// fails every Service that has none yet, and hundreds of them on every
// retry made lines of tens of KiB.
func oneLine(errs []error) string {
	if len(errs) == 1 {
		return errs[0].Error()
	}
	msgs := make([]string, 0, min(len(errs), maxShownErrors)+1)
	for _, err := range errs[:min(len(errs), maxShownErrors)] {
		msgs = append(msgs, err.Error())
	}
	if len(errs) > maxShownErrors {
		msgs = append(msgs, fmt.Sprintf("and %d more", len(errs)-maxShownErrors))
	}
	return fmt.Sprintf("%d errors: %s", len(errs), strings.Join(msgs, "; "))
}

// maxShownErrors is how many of a sync's errors its log line spells out.
const maxShownErrors = 10

// portalErr is an error of the portal --portal chose, named by the flag
// rather than by the package ("portal: bind: ") as well.
type portalErr struct {
	mode string
	err  error
}

func portalError(mode string, err error) error { return &portalErr{mode, err} }

func (e *portalErr) Error() string {
	return "--portal=" + e.mode + ": " + strings.TrimPrefix(e.err.Error(), "portal: "+e.mode+": ")
}

func (e *portalErr) Unwrap() error { return e.err }
