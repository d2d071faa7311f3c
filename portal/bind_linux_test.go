package portal

import (
	"net/netip"
	"slices"
	"testing"
)

func TestIsOwnedAddr(t *testing.T) {
	tests := []struct {
		name      string
		ip        string
		ones      int
		label     string
		flags     int
		ownedLink bool
		want      bool
	}{
		{"ours on lo", "198.18.0.10", 32, "lo:kup", 0, false, true},
		{"someone else's on lo", "198.18.0.10", 32, "lo", 0, false, false},
		{"loopback", "127.0.0.1", 8, "lo", 0, false, false},
		{"loopback even with our label", "127.0.0.2", 32, "lo:kup", 0, false, false},
		{"not a host address", "198.18.0.10", 24, "lo:kup", 0, false, false},
		{"IPv6 with our flags", "fd5e:b1b5::10", 128, "", ownIPv6Flags, false, true},
		{"IPv6 without them", "fd5e:b1b5::10", 128, "", 0, false, false},
		{"::1", "::1", 128, "", ownIPv6Flags, false, false},
		{"anything on our dummy", "198.19.0.5", 32, "", 0, true, true},
		{"link-local on our dummy", "fe80::1", 128, "", 0, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := isOwnedAddr(netip.MustParseAddr(tc.ip), tc.ones, tc.label, tc.flags, "lo:kup", tc.ownedLink); got != tc.want {
				t.Errorf("isOwnedAddr = %v, want %v", got, tc.want)
			}
		})
	}
	if ownLabel("a-very-long-ifname") != "" || ownLabel("lo") != "lo:kup" {
		t.Error("ownLabel does not respect IFNAMSIZ")
	}
}

func TestBindAddrs(t *testing.T) {
	got := bindAddrs(fixedPortals())
	want := addrs("198.18.0.10", "198.18.0.53", "198.18.0.70", "198.18.0.99", "198.19.0.5", "198.19.1.1", "fd5e:b1b5::10", "fd5e:b1b5::70", "fd5e:b1b5::80")
	if !slices.Equal(got, want) {
		t.Errorf("bindAddrs = %v, want %v", got, want)
	}
}
