package state

import (
	"fmt"
	"net/netip"
	"testing"
)

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func TestNodePortCIDRs(t *testing.T) {
	tests := []struct {
		name string
		in   []netip.Prefix
		want string // fmt of the result
	}{
		{"none: every address", nil, "[]"},
		{"IPv4 only keeps IPv6 everywhere", prefixes("198.18.1.0/24"), "[198.18.1.0/24 ::/0]"},
		{"IPv6 only keeps IPv4 everywhere", prefixes("fd5e:b1b5:1::/64"), "[0.0.0.0/0 fd5e:b1b5:1::/64]"},
		{"both families", prefixes("fd5e:b1b5:1::/64", "198.18.1.7/24"), "[198.18.1.0/24 fd5e:b1b5:1::/64]"},
		{"zero CIDR of one family means all of it", prefixes("198.18.1.0/24", "0.0.0.0/0", "fd5e:b1b5:1::/64"), "[0.0.0.0/0 fd5e:b1b5:1::/64]"},
		{"zero CIDRs of both are every address", prefixes("0.0.0.0/0", "::/0"), "[]"},
		{"a zero CIDR alone is every address", prefixes("0.0.0.0/0"), "[]"},
		{"localhost", prefixes("127.0.0.0/8", "::1/128"), "[127.0.0.0/8 ::1/128]"},
		{"duplicates", prefixes("198.18.1.0/24", "198.18.1.1/24"), "[198.18.1.0/24 ::/0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := NodePortCIDRs(tc.in)
			if s := fmt.Sprint(got); s != tc.want {
				t.Errorf("NodePortCIDRs(%v) = %s, want %s", tc.in, s, tc.want)
			}
		})
	}
}

func TestInNodePortCIDRs(t *testing.T) {
	tests := []struct {
		cidrs []netip.Prefix
		addr  string
		want  bool
	}{
		{nil, "198.18.1.1", true},
		{nil, "fe80::1%eth0", true},
		{prefixes("198.18.1.0/24"), "198.18.1.1", true},
		{prefixes("198.18.1.0/24"), "198.18.2.1", false},
		{prefixes("198.18.1.0/24"), "fd5e:b1b5:1::1", true}, // no IPv6 CIDR: every IPv6 address
		{prefixes("198.18.1.0/24"), "::ffff:198.18.1.1", true},
		{prefixes("fd5e:b1b5:1::/64"), "fd5e:b1b5:2::1", false},
		{prefixes("fd5e:b1b5:1::/64"), "198.18.9.9", true},
		{prefixes("fe80::/10"), "fe80::1%eth0", true}, // the zone does not keep it out
		{prefixes("fe80::/10", "0.0.0.0/0"), "198.18.9.9", true},
		{prefixes("198.18.1.0/24", "fd5e:b1b5:1::/64"), "fd5e:b1b5:2::1", false},
	}
	for _, tc := range tests {
		a := netip.MustParseAddr(tc.addr)
		if got := InNodePortCIDRs(tc.cidrs, a); got != tc.want {
			t.Errorf("InNodePortCIDRs(%v, %s) = %v, want %v", tc.cidrs, a, got, tc.want)
		}
	}
}
