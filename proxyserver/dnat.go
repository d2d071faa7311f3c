package proxyserver

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// dnatTargets decides, for the iptables portal, where its rules send
// Service traffic in each IP family: REDIRECT (to the first address of the
// interface a packet came in on, or loopback for the host's own traffic),
// or DNAT to a node address. REDIRECT needs no node address, so it is the
// rule; but it drops a packet that came in on an interface without an
// address of its family, as Calico's pod interfaces are in IPv4 (their
// host side has none: pods reach the host through proxy ARP). The portal
// then DNATs to a node address in that family, for as long as such
// interfaces carry routes. A --bind-address that is one of this host's
// addresses is a DNAT target for its family, as in the legacy proxier.
// The proxy ports listen on every address, so either way reaches them.
type dnatTargets struct {
	bind    netip.Addr                // --bind-address, when it names a node address
	inspect func() (hostRoutes, bool) // reads the host; false: cannot tell
	local   func(netip.Addr) bool     // whether an address is this host's

	// The host is read again after a change of its addresses, routes or
	// links (changed), or inspectEvery after the last read, in case a
	// change was not told.
	stale    atomic.Bool
	lastRead time.Time
	host     hostRoutes
	hostOK   bool

	mu   sync.Mutex
	cur  map[portal.Family]netip.Addr // what Sync renders (see target)
	said string                       // the decision last logged
}

// hostRoutes is what decides the IPv4 target: the up interfaces that IPv4
// routes point at but that have no IPv4 address, and the node address to
// DNAT to (the default route's interface's, else the first found).
type hostRoutes struct {
	addressless []string
	node        netip.Addr
}

func newDNATTargets(bind netip.Addr) *dnatTargets {
	d := &dnatTargets{inspect: inspectRoutes, local: isLocalAddr}
	d.stale.Store(true)
	if bind.IsValid() && !bind.IsUnspecified() && !bind.IsLoopback() {
		d.bind = bind.Unmap()
	}
	return d
}

// target is IPTablesConfig.DNAT: the target decide last chose.
func (d *dnatTargets) target(f portal.Family) netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cur[f]
}

// decide works out the targets for the next Sync, logs a change, and
// returns them.
func (d *dnatTargets) decide(now time.Time) map[portal.Family]netip.Addr {
	next := make(map[portal.Family]netip.Addr)
	state, why := "redirect", ""
	bindGone := false
	if d.bind.IsValid() {
		if d.local(d.bind) {
			next[portal.FamilyOf(d.bind)] = d.bind
			state, why = "bind", "the bind address"
		} else {
			// Gone from the host (a DHCP change, a VIP moved): a DNAT to
			// it would send Service traffic nowhere.
			bindGone = true
		}
	}
	if _, set := next[portal.IPv4]; !set {
		if d.stale.Swap(false) || now.Sub(d.lastRead) >= inspectEvery || now.Before(d.lastRead) {
			d.host, d.hostOK = d.inspect()
			d.lastRead = now
		}
		if h, ok := d.host, d.hostOK; ok && len(h.addressless) > 0 {
			if h.node.IsValid() {
				next[portal.IPv4] = h.node
				state = "auto"
				why = "interfaces " + joinNames(h.addressless) + " carry IPv4 routes but have no IPv4 address, where REDIRECT would drop what comes in"
			} else {
				state = "stuck"
				why = "interfaces " + joinNames(h.addressless) + " carry IPv4 routes but have no IPv4 address, and this host has no IPv4 address to DNAT to: Service traffic from them is dropped"
			}
		}
	}
	if bindGone {
		state += "/bind-gone"
	}
	// What is logged changes with the targets, not with the interfaces
	// named (pods come and go on a Calico node).
	said := state + " " + next[portal.IPv4].String() + " " + next[portal.IPv6].String()
	d.mu.Lock()
	d.cur = next
	changed := said != d.said
	d.said = said
	d.mu.Unlock()
	if !changed {
		return next
	}
	if bindGone {
		klog.ErrorS(nil, "The bind address is no longer one of this host's: portals do not DNAT to it until it is back", "bindAddress", d.bind)
	}
	var kv []any
	for _, f := range []portal.Family{portal.IPv4, portal.IPv6} {
		if a := next[f]; a.IsValid() {
			kv = append(kv, f.String(), a)
		}
	}
	switch {
	case len(kv) > 0:
		klog.InfoS("Portals DNAT to a node address instead of REDIRECT", append(kv, "why", why)...)
	case strings.HasPrefix(state, "stuck"):
		klog.ErrorS(nil, "Portals cannot reach the proxy from some interfaces", "why", why)
	default:
		klog.V(1).InfoS("Portals REDIRECT to the proxy ports")
	}
	return next
}

// isLocalAddr reports whether a is one of this host's addresses; true
// when they cannot be read.
func isLocalAddr(a netip.Addr) bool {
	addrs, err := userspace.HostAddrs()
	return err != nil || slices.Contains(addrs, a)
}

// joinNames lists interface names, the first few.
func joinNames(names []string) string {
	const most = 5
	if len(names) > most {
		return strings.Join(names[:most], ", ") + " and more"
	}
	return strings.Join(names, ", ")
}

// inspectEvery bounds how long a change of the host that no netlink
// message told goes unseen.
const inspectEvery = 10 * time.Second

// changed says the host's addresses, routes or links changed: the next
// decide reads them again.
func (d *dnatTargets) changed() { d.stale.Store(true) }

// movedFamilies returns the families whose target differs.
func movedFamilies(a, b map[portal.Family]netip.Addr) []portal.Family {
	var out []portal.Family
	for _, f := range []portal.Family{portal.IPv4, portal.IPv6} {
		if a[f] != b[f] {
			out = append(out, f)
		}
	}
	return slices.Clip(out)
}

// heldMoved returns the families whose rules, as read back (see
// portal.IPTables.ExistingTargets), send traffic anywhere but to targets:
// a DNAT to another address, or a REDIRECT where targets DNATs, or the
// other way round.
func heldMoved(held map[portal.Family][]netip.Addr, targets map[portal.Family]netip.Addr) []portal.Family {
	var out []portal.Family
	for _, f := range []portal.Family{portal.IPv4, portal.IPv6} {
		if slices.ContainsFunc(held[f], func(a netip.Addr) bool { return a != targets[f] }) {
			out = append(out, f)
		}
	}
	return slices.Clip(out)
}
