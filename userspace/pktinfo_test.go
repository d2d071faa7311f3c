//go:build unix

package userspace

import (
	"net/netip"
	"testing"

	"golang.org/x/net/ipv6"
)

// TestPktinfoLinkLocalInterface: a datagram delivered to a link-local IPv6
// address (REDIRECT on a node whose pod-facing veth has only fe80::1) keeps
// its receiving interface, and the reply's IPV6_PKTINFO names it, or the
// kernel refuses to send from the link-local address and the reply is lost.
// Other destinations name no interface, so replies route freely.
func TestPktinfoLinkLocalInterface(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dst     string
		ifindex int
		want    string // the session's dst
		wantIf  int    // the reply's ipi6_ifindex
	}{
		{"link-local", "fe80::1", 7, "fe80::1%7", 7},
		{"global", "fd5e:b1b5::10", 7, "fd5e:b1b5::10", 0},
		{"loopback", "::1", 1, "::1", 0},
		{"link-local without an interface", "fe80::1", 0, "fe80::1", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := pktinfoDst(netip.MustParseAddr(tc.dst), tc.ifindex)
			if dst.String() != tc.want {
				t.Fatalf("pktinfoDst(%s, %d) = %s; want %s", tc.dst, tc.ifindex, dst, tc.want)
			}
			// Parse reads an IPV6_PKTINFO's address as Dst (it reads
			// received messages); in a sent one it is the source.
			var cm ipv6.ControlMessage
			if err := cm.Parse(pktinfoOOB(familyIPv6, dst)); err != nil {
				t.Fatalf("parse the reply's control message: %v", err)
			}
			if src, _ := netip.AddrFromSlice(cm.Dst); src != netip.MustParseAddr(tc.dst) || cm.IfIndex != tc.wantIf {
				t.Errorf("reply's IPV6_PKTINFO: source %s, interface %d; want %s, %d", cm.Dst, cm.IfIndex, tc.dst, tc.wantIf)
			}
		})
	}
}
