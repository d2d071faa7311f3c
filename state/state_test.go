package state

import (
	"net/netip"
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
