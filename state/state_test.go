package state

import (
	"net/netip"
	"slices"
	"testing"
)

func TestServicePortFamilies(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd5e:b1b5::1")
	mapped := netip.MustParseAddr("::ffff:198.18.0.2")
	tests := []struct {
		name         string
		sp           ServicePort
		want4, want6 bool
	}{
		{name: "no frontends is IPv4", want4: true},
		{name: "IPv4 cluster IP", sp: ServicePort{ClusterIPs: []netip.Addr{v4}}, want4: true},
		{name: "IPv6 cluster IP", sp: ServicePort{ClusterIPs: []netip.Addr{v6}}, want6: true},
		{name: "dual stack", sp: ServicePort{ClusterIPs: []netip.Addr{v4, v6}}, want4: true, want6: true},
		{name: "IPv6 cluster IP, IPv4 external IP", sp: ServicePort{ClusterIPs: []netip.Addr{v6}, ExternalIPs: []netip.Addr{v4}}, want4: true, want6: true},
		{name: "IPv6 load-balancer IP only", sp: ServicePort{LoadBalancerIPs: []netip.Addr{v6}}, want6: true},
		{name: "IPv4-mapped counts as IPv4", sp: ServicePort{ClusterIPs: []netip.Addr{mapped}}, want4: true},
		{name: "no frontends, ipFamilies IPv6", sp: ServicePort{IPFamilies: []IPFamily{IPv6}}, want6: true},
		{name: "no frontends, ipFamilies dual", sp: ServicePort{IPFamilies: []IPFamily{IPv6, IPv4}}, want4: true, want6: true},
		{name: "frontends decide over ipFamilies", sp: ServicePort{ClusterIPs: []netip.Addr{v4}, IPFamilies: []IPFamily{IPv6}}, want4: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got4, got6 := tc.sp.Families(); got4 != tc.want4 || got6 != tc.want6 {
				t.Fatalf("Families() = %v, %v; want %v, %v", got4, got6, tc.want4, tc.want6)
			}
		})
	}
}

func TestSourceRanges(t *testing.T) {
	lb4, lb6 := netip.MustParseAddr("198.19.1.1"), netip.MustParseAddr("fd5e:b1b5:1::1")
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	node := []netip.Addr{netip.MustParseAddr("198.18.11.1"), netip.MustParseAddr("fd5e:b1b5:11::1")}
	tests := []struct {
		name   string
		ranges []netip.Prefix
		lbIP   netip.Addr
		host   []netip.Addr
		want   []netip.Prefix
	}{
		{name: "none admits all", lbIP: lb4},
		{name: "IPv4 ranges for an IPv4 VIP", ranges: pfx("198.18.10.0/24", "fd5e:b1b5:10::/64"), lbIP: lb4, want: pfx("198.18.10.0/24")},
		{name: "IPv6 ranges for an IPv6 VIP", ranges: pfx("198.18.10.0/24", "fd5e:b1b5:10::/64"), lbIP: lb6, want: pfx("fd5e:b1b5:10::/64")},
		{name: "no range of the VIP's family admits all", ranges: pfx("fd5e:b1b5:10::/64"), lbIP: lb4},
		{name: "a /0 admits all", ranges: pfx("198.18.10.0/24", "0.0.0.0/0"), lbIP: lb4},
		{name: "the other family's /0 does not", ranges: pfx("198.18.10.0/24", "::/0"), lbIP: lb4, want: pfx("198.18.10.0/24")},
		{name: "IPv4-mapped VIP is IPv4", ranges: pfx("198.18.10.0/24"), lbIP: netip.MustParseAddr("::ffff:198.19.1.1"), want: pfx("198.18.10.0/24")},
		{name: "node outside the ranges: VIPs not admitted", ranges: pfx("198.18.10.0/24"), lbIP: lb4, host: node, want: pfx("198.18.10.0/24")},
		{name: "node in a range: the family's VIPs admitted", ranges: pfx("198.18.11.0/24"), lbIP: lb4, host: node, want: pfx("198.18.11.0/24", "198.19.1.1/32")},
		{name: "node in a range: IPv6 VIP admitted", ranges: pfx("fd5e:b1b5:11::/64"), lbIP: lb6, host: node, want: pfx("fd5e:b1b5:11::/64", "fd5e:b1b5:1::1/128")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sp := ServicePort{LoadBalancerIPs: []netip.Addr{lb4, lb6}, LoadBalancerSourceRanges: tc.ranges}
			if got := sp.SourceRanges(tc.lbIP, tc.host); !slices.Equal(got, tc.want) {
				t.Fatalf("SourceRanges(%s) = %v, want %v", tc.lbIP, got, tc.want)
			}
		})
	}
}

// TestNewSnapshotLaterDuplicateWins: a port named twice is in the snapshot
// once, as the later one has it, wherever the snapshot is read from.
func TestNewSnapshotLaterDuplicateWins(t *testing.T) {
	web := ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: TCP}
	api := ServicePortName{Namespace: "demo", Name: "api", Port: "grpc", Protocol: TCP}
	s := NewSnapshot([]ServicePort{
		{Name: web, Port: 80},
		{Name: api, Port: 9000},
		{Name: web, Port: 8080},
	})
	if s.Len() != 2 || !slices.Equal(s.Names(), []ServicePortName{api, web}) {
		t.Fatalf("Len %d, names %v; want 2, [%v %v]", s.Len(), s.Names(), api, web)
	}
	if got := s.Get(web); got == nil || got.Port != 8080 {
		t.Fatalf("Get(%v) = %v; want the later one, port 8080", web, got)
	}
	for sp := range s.All {
		if sp.Name == web && sp.Port != 8080 {
			t.Fatalf("All yields %v with port %d; want the later port, 8080", web, sp.Port)
		}
	}
}
