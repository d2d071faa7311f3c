package proxyserver

import (
	"fmt"
	"net/netip"
	"testing"
)

// TestHealthCheckListenAddrsPerFamily: health-check node ports listen where
// node ports are served, per IP family: CIDRs of one family narrow that
// family, and the other listens on its wildcard address.
func TestHealthCheckListenAddrsPerFamily(t *testing.T) {
	local := func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.2.1"), netip.MustParseAddr("fd5e:b1b5:1::1")}, nil
	}
	tests := []struct {
		cidrs []netip.Prefix
		want  string
	}{
		{nil, "[]"},
		{[]netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}, "[198.18.1.1 ::]"},
		{[]netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("::/0")}, "[198.18.1.1 ::]"},
		{[]netip.Prefix{netip.MustParsePrefix("fd5e:b1b5:1::/64")}, "[0.0.0.0 fd5e:b1b5:1::1]"},
		{[]netip.Prefix{netip.MustParsePrefix("198.18.9.0/24"), netip.MustParsePrefix("fd5e:b1b5:9::/64")}, "[]"},
	}
	for _, tc := range tests {
		h := &healthChecks{nodePortAddresses: tc.cidrs, localAddrs: local}
		got, err := h.listenAddrs()
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("nodePortAddresses %v: listen on %v, %v; want %s", tc.cidrs, got, err, tc.want)
		}
	}
}
