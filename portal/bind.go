package portal

import (
	"net/netip"
	"slices"
)

// DefaultBindInterface is the dummy interface the bind portal creates
// and owns when BindConfig.Interface is empty.
const DefaultBindInterface = "kube-ups0"

// BindConfig configures the bind portal.
type BindConfig struct {
	// Interface is the interface service addresses are added to. If
	// empty, DefaultBindInterface, a dummy interface the portal creates,
	// or "lo" where the kernel has no dummy driver. Only on Linux.
	Interface string
}

// bindAddrs returns the distinct frontend addresses of portals: what the
// bind portal puts on the host. NodePorts need none: the data plane
// listens on the node's own addresses.
func bindAddrs(portals []Portal) []netip.Addr {
	var out []netip.Addr
	for _, p := range portals {
		if p.Kind != NodePort && p.IP.IsValid() && !p.IP.IsUnspecified() {
			out = append(out, p.IP.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
