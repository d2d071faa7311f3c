package portal

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/go-multierror"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// bindLabelSuffix marks IPv4 addresses we add to an interface we do not
// own ("lo:kup"). IPv6 has no labels: there our addresses are the /128s
// that carry both IFA_F_NODAD and IFA_F_NOPREFIXROUTE, which we always set
// and the kernel never sets by itself.
const bindLabelSuffix = ":kup"

const ownIPv6Flags = unix.IFA_F_NODAD | unix.IFA_F_NOPREFIXROUTE

// Bind is the netfilter-free portal: it adds every service address as a
// /32 or /128 to an interface, so the data plane can listen on
// serviceIP:port itself (userspace.Config.ServeFrontends), and removes the
// addresses that are no longer wanted.
type Bind struct {
	cfg BindConfig
	h   *netlink.Handle // bound to the network namespace NewBind ran in

	mu        sync.Mutex // serializes Sync and Cleanup; guards the fields below
	link      netlink.Link
	owned     bool                // link is our dummy interface: every address on it is ours
	saidV6Off bool                // the last Sync said IPv6 addresses are skipped
	v6Off     bool                // IPv6 was off on link at the last Sync
	skipped   map[netip.Addr]bool // the service addresses the last Sync left off the host
	swept     bool                // other interfaces were swept (see sweepElsewhere)
	node      map[netip.Addr]bool // this host's own addresses, as the last Sync read them
}

var _ Interface = (*Bind)(nil)

// NewBind returns the bind portal for the current network namespace. It
// changes nothing until the first Sync, and fails at once without
// CAP_NET_ADMIN, which every Sync would need.
func NewBind(_ context.Context, cfg BindConfig) (*Bind, error) {
	if err := CheckNetAdmin(); err != nil {
		return nil, fmt.Errorf("portal: bind: %w", err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("portal: bind: open netlink: %w", err)
	}
	return &Bind{cfg: cfg, h: h}, nil
}

// Interface returns the interface addresses go to, once a Sync found or
// created it.
func (b *Bind) Interface() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.link == nil {
		return ""
	}
	return b.link.Attrs().Name
}

// ensureLink finds or creates the interface service addresses go to. One
// deleted since (the dummy interface, or the one --bind-interface names)
// is looked up, or created, again.
func (b *Bind) ensureLink() error {
	if b.link != nil {
		l, err := b.h.LinkByIndex(b.link.Attrs().Index)
		if err == nil && l.Attrs().Name == b.link.Attrs().Name {
			return nil
		}
		klog.InfoS("The bind portal's interface is gone; looking for it again", "interface", b.link.Attrs().Name)
		b.link = nil
	}
	name := b.cfg.Interface
	if name != "" && name != DefaultBindInterface {
		l, err := b.h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("portal: bind: interface %s: %w", name, err)
		}
		b.link, b.owned = l, false
		klog.InfoS("Bind portal adds service addresses", "interface", name)
		return nil
	}
	l, err := b.h.LinkByName(DefaultBindInterface)
	if err == nil && l.Type() == "dummy" {
		b.link, b.owned = l, true
	} else {
		d := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DefaultBindInterface}}
		switch err := b.h.LinkAdd(d); {
		case err == nil:
			if l, err = b.h.LinkByName(DefaultBindInterface); err != nil {
				return fmt.Errorf("portal: bind: find %s: %w", DefaultBindInterface, err)
			}
			b.link, b.owned = l, true
		case name == "" && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EEXIST)):
			// No dummy driver (the kernel answers "Unknown device type"),
			// or a non-dummy link took the name: use the loopback.
			l, lerr := b.h.LinkByName("lo")
			if lerr != nil {
				return fmt.Errorf("portal: bind: no dummy interface (%v) and no lo: %w", err, lerr)
			}
			klog.InfoS("Bind portal adds service addresses to lo", "reason", "cannot create a dummy interface", "err", err)
			b.link, b.owned = l, false
			return nil
		default:
			return fmt.Errorf("portal: bind: create dummy interface %s: %w", DefaultBindInterface, err)
		}
	}
	if err := b.h.LinkSetUp(b.link); err != nil {
		return fmt.Errorf("portal: bind: set %s up: %w", DefaultBindInterface, err)
	}
	klog.InfoS("Bind portal adds service addresses", "interface", DefaultBindInterface, "dummy", true)
	return nil
}

// Sync makes the interface hold exactly the service addresses of portals
// among the addresses we own.
func (b *Bind) Sync(_ context.Context, portals []Portal) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.ensureLink(); err != nil {
		return err
	}
	have, err := b.ownedAddrs(b.link, b.owned)
	if err != nil {
		return err
	}
	node, err := b.nodeAddrs()
	if err != nil {
		return err
	}
	b.node = node
	v6Off := ipv6Off(b.link.Attrs().Name)
	want := make(map[netip.Addr]bool)
	var errs *multierror.Error
	skipped := make(map[netip.Addr]bool)
	for _, ip := range bindAddrs(portals) {
		if node[ip] {
			// One of this host's own addresses (a Service's external IP
			// that is the node's): served where it is, and left alone.
			continue
		}
		if ip.Is6() && v6Off {
			skipped[ip] = true
			continue
		}
		want[ip] = true
		if _, ok := have[ip]; ok {
			continue
		}
		err := b.h.AddrAdd(b.link, b.newAddr(ip))
		switch {
		case errors.Is(err, unix.EEXIST):
			// Someone else's address: served, and left to them.
			klog.V(2).InfoS("Service address already on the interface; serving it, leaving it there", "addr", ip, "interface", b.link.Attrs().Name)
		case err != nil:
			errs = multierror.Append(errs, fmt.Errorf("portal: bind: add %s to %s: %w", ip, b.link.Attrs().Name, err))
			continue
		default:
			klog.V(2).InfoS("Added service address", "addr", ip, "interface", b.link.Attrs().Name)
		}
	}
	for ip, a := range have {
		if want[ip] {
			continue
		}
		if err := b.h.AddrDel(b.link, a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = multierror.Append(errs, fmt.Errorf("portal: bind: remove %s from %s: %w", ip, b.link.Attrs().Name, err))
			continue
		}
		klog.V(2).InfoS("Removed service address", "addr", ip, "interface", b.link.Attrs().Name)
	}
	if !b.swept {
		// Once: what a run with another --bind-interface (or our dummy
		// interface, when this run uses another) left elsewhere, unless
		// a running proxy serves it.
		if err := b.sweepElsewhere(); err != nil {
			errs = multierror.Append(errs, err)
		} else {
			b.swept = true
		}
	}
	if len(skipped) > 0 && !b.saidV6Off {
		klog.InfoS("IPv6 is turned off on the bind interface: IPv6 service addresses are not served", "interface", b.link.Attrs().Name, "addresses", len(skipped))
	}
	b.saidV6Off = len(skipped) > 0
	b.v6Off, b.skipped = v6Off, skipped
	return errs.ErrorOrNil()
}

// Unserved returns the service addresses the last Sync left off the host
// for want of their IP family (IPv6 turned off on the interface): the
// data plane can listen on none of them, and leaves them out
// (userspace.Config.UnservedFrontends). It asks right after the Sync; the
// map is not changed later.
func (b *Bind) Unserved() map[netip.Addr]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.skipped
}

// Stale reports whether a Sync of the same portals would now do more than
// the last one did: IPv6 was turned on or off on the interface since. It
// costs one read of /proc, so a caller that skips unchanged Syncs can ask
// at each of them and serve a family that comes back at once.
func (b *Bind) Stale() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.link != nil && ipv6Off(b.link.Attrs().Name) != b.v6Off
}

// sweepElsewhere removes the service addresses a bind portal put on
// interfaces other than b.link (and our dummy interface, when it is not
// b.link), unless a listening socket uses one (another proxy beside this
// one). b.mu must be held.
func (b *Bind) sweepElsewhere() error {
	var errs *multierror.Error
	err := b.eachOwned(func(l netlink.Link, dummy bool, have map[netip.Addr]*netlink.Addr) {
		if l.Attrs().Index == b.link.Attrs().Index || len(have) == 0 && !dummy {
			return
		}
		addrs := slices.Collect(maps.Keys(have))
		if inUse, err := AddrsInUse(addrs); err != nil || len(inUse) > 0 {
			return // cannot tell, or served: not ours to take away
		}
		removed, err := b.removeOwned(l, dummy, have)
		errs = multierror.Append(errs, err)
		switch {
		case dummy && err == nil:
			klog.InfoS("Deleted the bind portal's interface a previous run left: this run uses another", "interface", l.Attrs().Name, "addresses", len(have))
		case !dummy:
			klog.InfoS("Removed the service addresses a previous run's bind portal left on another interface", "interface", l.Attrs().Name, "addresses", removed)
		}
	})
	errs = multierror.Append(errs, err)
	return errs.ErrorOrNil()
}

// ipv6Off reports whether IPv6 is turned off on the interface (or on the
// whole host), where adding an IPv6 address fails.
func ipv6Off(link string) bool {
	data, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + link + "/disable_ipv6")
	return err != nil || strings.TrimSpace(string(data)) == "1"
}

// nodeAddrs returns this host's own addresses: every address on every
// interface but the service addresses a bind portal added (see
// ownedAddrs). A Service may use one as a frontend (an external IP that
// is the node's): it is served, node ports on it too, and never removed.
// b.mu must be held.
func (b *Bind) nodeAddrs() (map[netip.Addr]bool, error) {
	owned, err := b.ownedSet()
	if err != nil {
		return nil, err
	}
	addrs, err := b.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("portal: bind: list addresses: %w", err)
	}
	out := make(map[netip.Addr]bool)
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !owned[ip.Unmap()] {
			out[ip.Unmap()] = true
		}
	}
	return out, nil
}

// BindLeftovers lists the service addresses a bind portal left on this
// host; listing them takes no privilege, unlike removing them.
func BindLeftovers() []netip.Addr {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil
	}
	b := &Bind{h: h}
	defer b.Close()
	out, _ := b.Owned()
	return out
}

// NodeAddrs returns this host's own addresses, those a bind portal did not
// add (see nodeAddrs): as the last Sync read them, which the data plane
// asks for right after it. The map is not changed later.
func (b *Bind) NodeAddrs() (map[netip.Addr]bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.node != nil {
		return b.node, nil
	}
	return b.nodeAddrs()
}

func (b *Bind) newAddr(ip netip.Addr) *netlink.Addr {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}}
	if ip.Is4() {
		if !b.owned {
			a.Label = ownLabel(b.link.Attrs().Name)
		}
	} else {
		// No duplicate address detection, or the address stays
		// "tentative" and listeners cannot bind it for a while.
		a.Flags = ownIPv6Flags
	}
	return a
}

// ownLabel is the IPv4 label we give addresses on a link we do not own;
// the kernel wants labels to start with the link name, within 15 bytes.
func ownLabel(link string) string {
	if l := link + bindLabelSuffix; len(l) <= unix.IFNAMSIZ-1 {
		return l
	}
	return ""
}

// ownedAddrs lists the addresses on link that we added.
func (b *Bind) ownedAddrs(link netlink.Link, all bool) (map[netip.Addr]*netlink.Addr, error) {
	list, err := b.h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("portal: bind: list addresses of %s: %w", link.Attrs().Name, err)
	}
	out := make(map[netip.Addr]*netlink.Addr)
	for i := range list {
		a := &list[i]
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		if isOwnedAddr(ip.Unmap(), ones, a.Label, a.Flags, ownLabel(link.Attrs().Name), all) {
			out[ip.Unmap()] = a
		}
	}
	return out, nil
}

// isOwnedAddr decides whether an address on an interface is one we added:
// a host address, not loopback or link-local, and on an interface we do not
// own, marked by our label (IPv4) or flags (IPv6).
func isOwnedAddr(ip netip.Addr, ones int, label string, flags int, ownLabel string, ownedLink bool) bool {
	if ones != ip.BitLen() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() {
		return false
	}
	if ownedLink {
		return true
	}
	if ip.Is4() {
		return ownLabel != "" && label == ownLabel
	}
	return flags&ownIPv6Flags == ownIPv6Flags
}

// otherLinks names the interfaces other than our dummy one where a run
// may have added service addresses: lo, the configured interface, and any
// whose IPv4 addresses carry our label (a run with another
// --bind-interface, or none).
func (b *Bind) otherLinks() []string {
	names := []string{"lo"}
	if n := b.cfg.Interface; n != "" && n != "lo" && n != DefaultBindInterface {
		names = append(names, n)
	}
	if links, err := b.h.LinkList(); err == nil {
		for _, l := range links {
			n := l.Attrs().Name
			if slices.Contains(names, n) || ownLabel(n) == "" {
				continue
			}
			if list, err := b.h.AddrList(l, netlink.FAMILY_V4); err == nil && slices.ContainsFunc(list, func(a netlink.Addr) bool { return a.Label == ownLabel(n) }) {
				names = append(names, n)
			}
		}
	}
	return names
}

// eachOwned calls f with each interface a bind portal (this one, or a
// previous run's) may have put service addresses on, and the addresses it
// added there: our dummy interface (dummy true; all of its addresses),
// then the others of otherLinks. Called with b.mu held.
func (b *Bind) eachOwned(f func(l netlink.Link, dummy bool, have map[netip.Addr]*netlink.Addr)) error {
	var errs *multierror.Error
	visit := func(name string, dummy bool) {
		l, err := b.h.LinkByName(name)
		if err != nil || dummy && l.Type() != "dummy" {
			return // absent, or not ours
		}
		have, err := b.ownedAddrs(l, dummy)
		if err != nil {
			errs = multierror.Append(errs, err)
			return
		}
		f(l, dummy, have)
	}
	visit(DefaultBindInterface, true)
	for _, n := range b.otherLinks() {
		visit(n, false)
	}
	return errs.ErrorOrNil()
}

// Owned lists the service addresses a bind portal (this one, or a previous
// run's) has on this host, on our dummy interface and on the others.
func (b *Bind) Owned() ([]netip.Addr, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	owned, err := b.ownedSet()
	return slices.SortedFunc(maps.Keys(owned), netip.Addr.Compare), err
}

// ownedSet is the set of addresses eachOwned finds. b.mu must be held.
func (b *Bind) ownedSet() (map[netip.Addr]bool, error) {
	out := make(map[netip.Addr]bool)
	err := b.eachOwned(func(_ netlink.Link, _ bool, have map[netip.Addr]*netlink.Addr) {
		for ip := range have {
			out[ip] = true
		}
	})
	return out, err
}

// removeOwned deletes what eachOwned found on l: our dummy interface
// whole, or the addresses have on another. It returns how many addresses
// went from another interface.
func (b *Bind) removeOwned(l netlink.Link, dummy bool, have map[netip.Addr]*netlink.Addr) (int, error) {
	n := l.Attrs().Name
	if dummy {
		if err := b.h.LinkDel(l); err != nil {
			return 0, fmt.Errorf("portal: bind: delete %s: %w", n, err)
		}
		return 0, nil
	}
	var errs *multierror.Error
	removed := 0
	for ip, a := range have {
		if err := b.h.AddrDel(l, a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = multierror.Append(errs, fmt.Errorf("portal: bind: remove %s from %s: %w", ip, n, err))
			continue
		}
		removed++
	}
	return removed, errs.ErrorOrNil()
}

// Cleanup removes the addresses we added and our dummy interface.
func (b *Bind) Cleanup(_ context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs *multierror.Error
	err := b.eachOwned(func(l netlink.Link, dummy bool, have map[netip.Addr]*netlink.Addr) {
		removed, err := b.removeOwned(l, dummy, have)
		errs = multierror.Append(errs, err)
		switch {
		case dummy && err == nil:
			klog.InfoS("Deleted the bind portal's interface, with its service addresses", "interface", l.Attrs().Name)
		case !dummy && removed > 0:
			klog.InfoS("Removed the bind portal's service addresses", "interface", l.Attrs().Name, "addresses", removed)
		}
	})
	if err != nil {
		errs = multierror.Append(errs, err)
	}
	b.link = nil
	return errs.ErrorOrNil()
}

// Close releases the netlink socket. The addresses stay.
func (b *Bind) Close() error {
	b.h.Close()
	return nil
}

// BindAddsAddresses says the bind portal puts service addresses on an
// interface itself (on Linux, with CAP_NET_ADMIN).
const BindAddsAddresses = true

// CheckNetAdmin returns an error unless this process holds CAP_NET_ADMIN,
// which adding addresses and interfaces, and every iptables change, take.
// Running as root is not enough: a container's root often lacks it.
func CheckNetAdmin() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData // version 3 takes two
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read this process's capabilities: %w", err)
	}
	if data[unix.CAP_NET_ADMIN/32].Effective&(1<<(unix.CAP_NET_ADMIN%32)) == 0 {
		if os.Geteuid() == 0 {
			// Root whose bounding set lacks it (a container with drop: [ALL]).
			return errors.New("changing the network configuration takes CAP_NET_ADMIN, which this process does not have although it runs as root (grant the capability)")
		}
		return errors.New("changing the network configuration takes CAP_NET_ADMIN, which this process does not have (run as root, or grant the capability)")
	}
	// The capability may be held only in a user namespace that does not
	// own this network namespace (rootless): ask the kernel with a change
	// that changes nothing, setting lo up when it is up.
	if lo, err := netlink.LinkByName("lo"); err == nil && lo.Attrs().Flags&net.FlagUp != 0 {
		if err := netlink.LinkSetUp(lo); errors.Is(err, unix.EPERM) {
			return errors.New("changing the network configuration takes CAP_NET_ADMIN over this network namespace, which this process holds only in a user namespace that does not own it (rootless)")
		}
	}
	return nil
}
