package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
)

// Interface deletes conntrack entries.
type Interface interface {
	// ClearUDP deletes the UDP entries that match any of filters and
	// returns how many it deleted. No filters delete nothing.
	ClearUDP(ctx context.Context, filters ...Filter) (int, error)
}

// Filter selects UDP conntrack entries. A zero field matches anything; a
// Filter with no field set matches nothing, so a mistake never empties the
// table.
type Filter struct {
	// Family is the IP family of the entries. If zero, the family of
	// OrigDst or ReplySrc, or both families when neither is set.
	Family portal.Family
	// OrigDst and OrigDstPort are where the client sent its datagrams: a
	// service frontend, or (address unset) a node port.
	OrigDst     netip.Addr
	OrigDstPort uint16
	// ReplySrc and ReplySrcPort are where replies come from: the address
	// and port the kernel redirected the flow to (for a REDIRECTed flow,
	// a local address and the proxy port), or the peer of an
	// unredirected flow.
	ReplySrc     netip.Addr
	ReplySrcPort uint16
	// NoNAT, if set, matches only entries without NAT: the reply comes
	// from the original destination to the original source. An entry a
	// datagram to a local port made before any rule redirected it is
	// one; a routed flow some other rule masqueraded (a pod's to another
	// host) is not. It narrows the other fields and selects nothing alone.
	NoNAT bool
}

// Flow is the part of a conntrack entry filters look at.
type Flow struct {
	Family   portal.Family
	Protocol uint8 // IANA number: 17 for UDP
	OrigSrc  netip.AddrPort
	OrigDst  netip.AddrPort
	ReplySrc netip.AddrPort
	ReplyDst netip.AddrPort
}

// ProtocolUDP is UDP's IANA protocol number.
const ProtocolUDP = 17

// IsZero reports whether f sets no field.
func (f Filter) IsZero() bool {
	return !f.OrigDst.IsValid() && f.OrigDstPort == 0 && !f.ReplySrc.IsValid() && f.ReplySrcPort == 0
}

// families returns the families f can match.
func (f Filter) families() []portal.Family {
	switch {
	case f.Family != 0:
		return []portal.Family{f.Family}
	case f.OrigDst.IsValid():
		return []portal.Family{portal.FamilyOf(f.OrigDst)}
	case f.ReplySrc.IsValid():
		return []portal.Family{portal.FamilyOf(f.ReplySrc)}
	}
	return []portal.Family{portal.IPv4, portal.IPv6}
}

// Match reports whether the UDP flow fl matches f.
func (f Filter) Match(fl Flow) bool {
	if f.IsZero() || fl.Protocol != ProtocolUDP {
		return false
	}
	if f.Family != 0 && fl.Family != f.Family {
		return false
	}
	if f.OrigDst.IsValid() && fl.OrigDst.Addr().Unmap() != f.OrigDst.Unmap() {
		return false
	}
	if f.OrigDstPort != 0 && fl.OrigDst.Port() != f.OrigDstPort {
		return false
	}
	if f.ReplySrc.IsValid() && fl.ReplySrc.Addr().Unmap() != f.ReplySrc.Unmap() {
		return false
	}
	if f.ReplySrcPort != 0 && fl.ReplySrc.Port() != f.ReplySrcPort {
		return false
	}
	if f.NoNAT && (unmapped(fl.ReplySrc) != unmapped(fl.OrigDst) || unmapped(fl.ReplyDst) != unmapped(fl.OrigSrc)) {
		return false
	}
	return true
}

func (f Filter) String() string {
	var parts []string
	if f.Family != 0 {
		parts = append(parts, f.Family.String())
	}
	if f.OrigDst.IsValid() {
		parts = append(parts, "orig-dst="+f.OrigDst.String())
	}
	if f.OrigDstPort != 0 {
		parts = append(parts, fmt.Sprintf("orig-dport=%d", f.OrigDstPort))
	}
	if f.ReplySrc.IsValid() {
		parts = append(parts, "reply-src="+f.ReplySrc.String())
	}
	if f.ReplySrcPort != 0 {
		parts = append(parts, fmt.Sprintf("reply-sport=%d", f.ReplySrcPort))
	}
	if f.NoNAT {
		parts = append(parts, "no-nat")
	}
	return "udp " + strings.Join(parts, " ")
}

// unmapped is ap with an IPv4-mapped address unmapped.
func unmapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
