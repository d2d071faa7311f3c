package userspace

import (
	"net/netip"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// family is an IP family, named by its IP version.
type family int

const (
	familyIPv4 family = 4
	familyIPv6 family = 6
)

func familyOf(a netip.Addr) family {
	if a.Unmap().Is4() {
		return familyIPv4
	}
	return familyIPv6
}

func (f family) String() string {
	if f == familyIPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// index is 0 for IPv4 and 1 for IPv6, as in bothFamilies.
func (f family) index() int {
	if f == familyIPv6 {
		return 1
	}
	return 0
}

func wildcard(f family) netip.Addr {
	if f == familyIPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// families returns the IP families of a service port's frontends, IPv4
// first; a port with no frontends is served on IPv4.
func families(spec *state.ServicePort) []family {
	switch has4, has6 := spec.Families(); {
	case has4 && has6:
		return bothFamilies
	case has6:
		return onlyIPv6
	}
	return onlyIPv4
}

var (
	onlyIPv4     = []family{familyIPv4}
	onlyIPv6     = []family{familyIPv6}
	bothFamilies = []family{familyIPv4, familyIPv6}
)
