package proxyserver

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/conntrack"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
)

// TestDNATTargets: the iptables portal REDIRECTs unless a --bind-address
// names a node address (DNAT to it, in its family) or interfaces without
// an IPv4 address carry IPv4 routes (DNAT to a node address in IPv4), and
// it reads the host again only when told it changed, or after a while.
func TestDNATTargets(t *testing.T) {
	node := netip.MustParseAddr("198.18.2.1")
	var host hostRoutes
	reads := 0
	d := newDNATTargets(netip.IPv4Unspecified())
	d.inspect = func() (hostRoutes, bool) { reads++; return host, true }
	now := time.Now()

	if got := d.decide(now); len(got) != 0 || reads != 1 {
		t.Fatalf("no addressless interface: targets %v after %d reads; want REDIRECT after 1", got, reads)
	}
	host = hostRoutes{addressless: []string{"cali1", "cali2"}, node: node}
	if got := d.decide(now.Add(time.Second)); len(got) != 0 || reads != 1 {
		t.Fatalf("the host was read again (%d) without being told it changed: %v", reads, got)
	}
	d.changed()
	if got := d.decide(now.Add(2 * time.Second)); got[portal.IPv4] != node || got[portal.IPv6].IsValid() || reads != 2 {
		t.Fatalf("addressless interfaces: targets %v, %d reads; want IPv4 DNAT to %s", got, reads, node)
	}
	if got := d.target(portal.IPv4); got != node {
		t.Errorf("the portal is told %s, want %s", got, node)
	}
	// Unseen changes are caught after inspectEvery.
	host = hostRoutes{node: node}
	if got := d.decide(now.Add(2*time.Second + inspectEvery)); len(got) != 0 || reads != 3 {
		t.Fatalf("after inspectEvery: targets %v, %d reads; want REDIRECT again", got, reads)
	}
	// Addressless interfaces and no node address: nothing to DNAT to.
	host = hostRoutes{addressless: []string{"cali1"}}
	d.changed()
	if got := d.decide(now.Add(3*time.Second + inspectEvery)); len(got) != 0 {
		t.Fatalf("no node address: targets %v, want REDIRECT", got)
	}

	// A bind address wins in its family; the other family is still
	// decided by the host.
	v6 := netip.MustParseAddr("fd5e:b1b5:2::1")
	d = newDNATTargets(v6)
	local := true
	d.local = func(a netip.Addr) bool { return a == v6 && local }
	d.inspect = func() (hostRoutes, bool) { return hostRoutes{addressless: []string{"cali1"}, node: node}, true }
	if got := d.decide(now); got[portal.IPv6] != v6 || got[portal.IPv4] != node {
		t.Fatalf("IPv6 bind address and addressless IPv4 interfaces: targets %v", got)
	}
	// The bind address leaves the host: no DNAT to it, which would send
	// traffic nowhere, until it is back.
	local = false
	if got := d.decide(now); got[portal.IPv6].IsValid() || got[portal.IPv4] != node {
		t.Fatalf("the bind address gone: targets %v, want IPv6 REDIRECT", got)
	}
	local = true
	if got := d.decide(now); got[portal.IPv6] != v6 {
		t.Fatalf("the bind address back: targets %v", got)
	}
	// A loopback bind address is no target: other hosts could not reach it.
	d = newDNATTargets(netip.MustParseAddr("127.0.0.1"))
	d.inspect = func() (hostRoutes, bool) { return hostRoutes{node: node}, true }
	if got := d.decide(now); len(got) != 0 {
		t.Fatalf("loopback bind address: targets %v, want REDIRECT", got)
	}
}

// TestKernelSyncFollowsTheTarget: a new DNAT target rewrites the rules
// though the portals are the same, and clears the UDP conntrack entries of
// its family, whose mapping may point at an address gone from the host.
func TestKernelSyncFollowsTheTarget(t *testing.T) {
	ctx := context.Background()
	node := netip.MustParseAddr("198.18.2.1")
	host := hostRoutes{node: node}
	d := newDNATTargets(netip.IPv4Unspecified())
	d.inspect = func() (hostRoutes, bool) { return host, true }
	pt := &portal.Fake{DNAT: d.target}
	ct := &conntrack.Fake{}
	k := &kernelSync{pt: pt, ct: ct, dnat: d, minPeriod: 0, resync: time.Hour}
	portals := []portal.Portal{udpPortal("198.18.0.10", 40000), udpPortal("fd5e:b1b5::10", 40001)}
	if err := k.sync(ctx, portals); err != nil {
		t.Fatal(err)
	}
	calls := len(ct.Calls())
	host = hostRoutes{addressless: []string{"cali1"}, node: node}
	d.changed()
	if err := k.sync(ctx, portals); err != nil || pt.Syncs() != 2 {
		t.Fatalf("a new target: err %v, %d syncs; want the rules rewritten", err, pt.Syncs())
	}
	if rules := pt.Rules(portal.IPv4); !strings.Contains(rules, "-j DNAT --to-destination 198.18.2.1:40000") {
		t.Errorf("IPv4 rules do not DNAT:\n%s", rules)
	}
	got := ct.Calls()
	if len(got) != calls+1 || !slices.Equal(got[len(got)-1], []conntrack.Filter{{Family: portal.IPv4, OrigDst: netip.MustParseAddr("198.18.0.10"), OrigDstPort: 53}}) {
		t.Fatalf("conntrack calls %v: want the IPv4 UDP portal's entries cleared", got)
	}
	if err := k.sync(ctx, portals); err != nil || pt.Syncs() != 2 {
		t.Fatalf("the same target again: err %v, %d syncs; want none", err, pt.Syncs())
	}
}

// TestKernelSyncAfterARestartComparesTheHeldTargets: the first sync after
// a restart compares where the new rules send traffic with where the
// previous run's rules sent it, as read back at start: a DNAT to an
// address the host may no longer have, now REDIRECT with the same proxy
// ports, leaves entries on the old mapping, which are cleared; rules that
// send traffic where they did leave the flows alone.
func TestKernelSyncAfterARestartComparesTheHeldTargets(t *testing.T) {
	old := netip.MustParseAddr("198.18.9.3")
	portals := []portal.Portal{udpPortal("198.18.0.10", 40000), udpPortal("fd5e:b1b5::10", 40001)}
	v4 := []conntrack.Filter{{Family: portal.IPv4, OrigDst: netip.MustParseAddr("198.18.0.10"), OrigDstPort: 53}}
	tests := []struct {
		name  string
		held  map[portal.Family][]netip.Addr
		host  hostRoutes
		clear []conntrack.Filter
	}{
		{"DNAT then REDIRECT", map[portal.Family][]netip.Addr{portal.IPv4: {old}, portal.IPv6: {{}}}, hostRoutes{}, v4},
		{"REDIRECT then REDIRECT", map[portal.Family][]netip.Addr{portal.IPv4: {{}}, portal.IPv6: {{}}}, hostRoutes{}, nil},
		{"DNAT to the same address", map[portal.Family][]netip.Addr{portal.IPv4: {old}}, hostRoutes{addressless: []string{"cali1"}, node: old}, nil},
		{"DNAT to another address", map[portal.Family][]netip.Addr{portal.IPv4: {old}}, hostRoutes{addressless: []string{"cali1"}, node: netip.MustParseAddr("198.18.9.4")}, v4},
		{"REDIRECT and DNAT mixed", map[portal.Family][]netip.Addr{portal.IPv4: {{}, old}}, hostRoutes{}, v4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDNATTargets(netip.IPv4Unspecified())
			d.inspect = func() (hostRoutes, bool) { return tc.host, true }
			ct := &conntrack.Fake{}
			k := &kernelSync{pt: &portal.Fake{DNAT: d.target}, ct: ct, dnat: d, last: portals, heldTargets: tc.held, minPeriod: 0, resync: time.Hour}
			if err := k.sync(context.Background(), portals); err != nil {
				t.Fatal(err)
			}
			var got []conntrack.Filter
			for _, c := range ct.Calls() {
				got = append(got, c...)
			}
			if !slices.Equal(got, tc.clear) {
				t.Errorf("cleared %v, want %v", got, tc.clear)
			}
			if k.heldTargets != nil {
				t.Errorf("the previous run's targets are kept after the first sync")
			}
		})
	}
}
