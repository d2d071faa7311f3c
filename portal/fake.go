package portal

import (
	"context"
	"net/netip"
	"slices"
	"sync"
)

// Fake is a recording portal for tests. It keeps the portals of the last
// Sync and renders them as the iptables portal would.
type Fake struct {
	// NodePortAddresses is passed to the rule renderer, as
	// IPTablesConfig.NodePortAddresses.
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs is passed to the rule renderer, as
	// IPTablesConfig.ClusterCIDRs.
	ClusterCIDRs []netip.Prefix
	// DNAT is passed to the rule renderer, as IPTablesConfig.DNAT.
	DNAT func(Family) netip.Addr

	mu       sync.Mutex // guards the fields below
	portals  []Portal
	syncs    int
	cleanups int
	err      error
}

var _ Interface = (*Fake)(nil)

// Sync records a copy of portals, sorted, and returns the error set by
// SetError.
func (f *Fake) Sync(_ context.Context, portals []Portal) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncs++
	if f.err != nil {
		return f.err
	}
	f.portals = slices.Clone(portals)
	slices.SortFunc(f.portals, Portal.Compare)
	return nil
}

// Cleanup forgets every portal.
func (f *Fake) Cleanup(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups++
	f.portals = nil
	return nil
}

// SetError makes later Syncs fail with err (nil to succeed again).
func (f *Fake) SetError(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// Portals returns the portals of the last successful Sync, sorted.
func (f *Fake) Portals() []Portal {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.portals)
}

// Syncs counts the calls to Sync.
func (f *Fake) Syncs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncs
}

// Cleanups counts the calls to Cleanup.
func (f *Fake) Cleanups() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cleanups
}

// Rules renders the last Sync's portals of family fam as the
// iptables-restore input the iptables portal would write.
func (f *Fake) Rules(fam Family) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Render(f.portals, fam, IPTablesConfig{NodePortAddresses: f.NodePortAddresses, ClusterCIDRs: f.ClusterCIDRs, DNAT: f.DNAT})
}

// Lookup returns the proxy port traffic of proto from src to dst goes to,
// as the last Sync's portals redirect it; a NodePort matches any dst whose
// port is the node port (the caller decides dst is local), and a
// load-balancer IP only the sources of its SourceRanges. ok is false when
// no portal catches it.
func (f *Fake) Lookup(proto string, src netip.Addr, dst netip.AddrPort) (proxyPort uint16, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, want := range []bool{true, false} { // address portals first, as the chains are ordered
		for _, p := range f.portals {
			if string(p.Protocol()) != proto || p.Port != dst.Port() || p.ProxyPort == 0 || FamilyOf(dst.Addr()) != p.Family {
				continue
			}
			if want && p.Kind != NodePort && p.IP == dst.Addr().Unmap() {
				if p.SourceRanges != nil && !slices.ContainsFunc(p.SourceRanges, func(r netip.Prefix) bool { return r.Contains(src.Unmap()) }) {
					return 0, false
				}
				return p.ProxyPort, true
			}
			if !want && p.Kind == NodePort {
				return p.ProxyPort, true
			}
		}
	}
	return 0, false
}
