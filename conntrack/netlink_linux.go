package conntrack

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
)

// Netlink deletes conntrack entries through the kernel's netfilter netlink
// interface, in the network namespace New ran in.
type Netlink struct {
	h *netlink.Handle
}

var _ Interface = (*Netlink)(nil)

// New returns the netlink implementation.
func New() (Interface, error) {
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("conntrack: open netlink: %w", err)
	}
	return &Netlink{h: h}, nil
}

// ClearUDP dumps the conntrack table of each family the filters need and
// deletes the UDP entries that match.
func (n *Netlink) ClearUDP(ctx context.Context, filters ...Filter) (int, error) {
	byFamily := make(map[portal.Family][]netlink.CustomConntrackFilter)
	for _, f := range filters {
		if f.IsZero() {
			continue
		}
		for _, fam := range f.families() {
			byFamily[fam] = append(byFamily[fam], nlFilter{f})
		}
	}
	total := 0
	for _, fam := range []portal.Family{portal.IPv4, portal.IPv6} {
		fs := byFamily[fam]
		if len(fs) == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
		inet := netlink.InetFamily(unix.AF_INET)
		if fam == portal.IPv6 {
			inet = netlink.InetFamily(unix.AF_INET6)
		}
		n2, err := n.h.ConntrackDeleteFilters(netlink.ConntrackTable, inet, fs...)
		total += int(n2)
		if err != nil {
			return total, fmt.Errorf("conntrack: delete %s UDP entries: %w", fam, err)
		}
	}
	klog.V(2).InfoS("Cleared UDP conntrack entries", "filters", len(filters), "deleted", total)
	return total, nil
}

// nlFilter adapts a Filter to netlink's filter interface.
type nlFilter struct{ f Filter }

func (n nlFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	return n.f.Match(flowOf(fl))
}

func flowOf(fl *netlink.ConntrackFlow) Flow {
	fam := portal.IPv4
	if fl.FamilyType == unix.AF_INET6 {
		fam = portal.IPv6
	}
	ap := func(ip net.IP, port uint16) netip.AddrPort {
		a, _ := netip.AddrFromSlice(ip)
		return netip.AddrPortFrom(a.Unmap(), port)
	}
	return Flow{
		Family:   fam,
		Protocol: fl.Forward.Protocol,
		OrigSrc:  ap(fl.Forward.SrcIP, fl.Forward.SrcPort),
		OrigDst:  ap(fl.Forward.DstIP, fl.Forward.DstPort),
		ReplySrc: ap(fl.Reverse.SrcIP, fl.Reverse.SrcPort),
		ReplyDst: ap(fl.Reverse.DstIP, fl.Reverse.DstPort),
	}
}

// Close releases the netlink socket.
func (n *Netlink) Close() error {
	n.h.Close()
	return nil
}
