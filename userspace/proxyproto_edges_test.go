package userspace

import (
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestProxyHeaderUnknownAddress: when the client's address or the
// frontend's is unknown, the header says so (v1 "UNKNOWN", v2 the
// command LOCAL, AF_UNSPEC, with no addresses), whatever family the
// known one is: an IPv6 address beside an unknown one must not pass for
// a pair of one family.
func TestProxyHeaderUnknownAddress(t *testing.T) {
	v6 := netip.MustParseAddrPort("[fd5e:b1b5::10]:443")
	v4 := netip.MustParseAddrPort("198.18.0.10:80")
	const v2Unknown = "0d0a0d0a000d0a515549540a" + "20" + "00" + "0000"
	for _, tc := range []struct {
		name     string
		src, dst netip.AddrPort
	}{
		{"client unknown, IPv6 frontend", netip.AddrPort{}, v6},
		{"IPv6 client, frontend unknown", v6, netip.AddrPort{}},
		{"client unknown, IPv4 frontend", netip.AddrPort{}, v4},
		{"IPv4 client, frontend unknown", v4, netip.AddrPort{}},
		{"both unknown", netip.AddrPort{}, netip.AddrPort{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(appendProxyHeader(nil, state.ProxyProtocolV1, tc.src, tc.dst)); got != "PROXY UNKNOWN\r\n" {
				t.Errorf("v1: %q, want %q", got, "PROXY UNKNOWN\r\n")
			}
			if got := hex.EncodeToString(appendProxyHeader(nil, state.ProxyProtocolV2, tc.src, tc.dst)); got != v2Unknown {
				t.Errorf("v2: %s, want %s", got, v2Unknown)
			}
		})
	}
}

// TestRedirectedRoles: the header names the original destination of a
// connection a portal redirected to the socket (the proxy port, and the
// external proxy port of a Service whose external traffic has endpoints
// of its own); a socket served directly (a node port, a frontend bound
// on the host) names the address it was reached at. Only a real REDIRECT
// tells them apart on the wire, so the rule is held here.
func TestRedirectedRoles(t *testing.T) {
	for _, tc := range []struct {
		role socketRole
		want bool
	}{
		{roleProxyPort, true},
		{roleExternalProxyPort, true},
		{roleNodePort, false},
		{roleFrontend, false},
		{roleExternalFrontend, false},
	} {
		if got := tc.role.redirected(); got != tc.want {
			t.Errorf("%v: redirected() = %v, want %v", tc.role, got, tc.want)
		}
	}
}
