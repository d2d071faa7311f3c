package source

import (
	"fmt"
	"net/netip"
	"strings"
)

// parseIP parses a textual IP address as Kubernetes stores them: no zone;
// an IPv4 address may have leading zeros in its parts, which older API
// servers accepted and kube-proxy still reads, as decimal
// (ParseIPSloppy), so that objects stored then keep working. (Manifests
// are checked as a current API server checks them: see findings.ip.) The
// result is not yet unmapped, so callers can still check the family the
// author wrote.
func parseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if t, ok := withoutLeadingZeros(s); err != nil && ok {
		ip, err = netip.ParseAddr(t)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not a valid IP address", s)
	}
	if ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q has a zone, which Kubernetes addresses may not have", s)
	}
	return ip, nil
}

// withoutLeadingZeros rewrites a dotted IPv4 address, or the address of
// an IPv4 prefix, with its leading zeros dropped ("010.001.0.0/16" is
// "10.1.0.0/16"); ok is false when s is not of that shape.
func withoutLeadingZeros(s string) (string, bool) {
	addr, bits, prefix := strings.Cut(s, "/")
	parts := strings.Split(addr, ".")
	if len(parts) != 4 {
		return "", false
	}
	for i, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return "", false
		}
		if t := strings.TrimLeft(p, "0"); t != "" {
			parts[i] = t
		} else {
			parts[i] = "0"
		}
	}
	out := strings.Join(parts, ".")
	if prefix {
		out += "/" + bits
	}
	return out, true
}

var (
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8") // RFC 1122 3.2.1.3: never a destination
	broadcast   = netip.AddrFrom4([4]byte{255, 255, 255, 255})
)

// checkAddr returns an error wrapping ErrRefusedAddress when ip may not be
// an endpoint or a frontend. ip must already be unmapped, so that
// ::ffff:127.0.0.1 is seen as the loopback address it is.
//
// Link-local addresses are refused because 169.254.169.254 is the cloud
// metadata service on most providers: a Service that sends traffic there,
// or captures it (CVE-2020-8554), hands node credentials to whoever wrote
// the Service. Loopback endpoints would reach the node's own daemons.
func checkAddr(ip netip.Addr, allowLoopback bool) error {
	var why string
	switch {
	case ip.IsUnspecified():
		why = "is the unspecified address"
	case ip.Is4() && thisNetwork.Contains(ip):
		why = "is in 0.0.0.0/8 (\"this network\")"
	case ip == broadcast:
		why = "is the broadcast address"
	case ip.IsMulticast():
		why = "is a multicast address"
	case ip.IsLinkLocalUnicast():
		why = "is link-local"
	case ip.IsLoopback() && !allowLoopback:
		why = "is a loopback address (allowed only in manifest mode)"
	default:
		return nil
	}
	return fmt.Errorf("%w: %s %s", ErrRefusedAddress, ip, why)
}
