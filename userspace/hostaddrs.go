package userspace

import (
	"maps"
	"net"
	"net/netip"
	"slices"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// Whose an address is: this host's, a pod's, or a service address a portal
// put on this host; and where node ports are refused because of it.

// readHostAddrs keeps this host's addresses (localAddrs, when the caller
// has read them already) while needed: while some service port has a
// Local external traffic policy, whose external traffic from this host
// goes to the cluster endpoints, or load-balancer source ranges, which
// may admit the node's own traffic. If they cannot be read, the last ones
// are kept.
func (p *Proxier) readHostAddrs(needed bool, localAddrs []netip.Addr) {
	if !needed {
		p.hostAddrs.Store(nil)
		return
	}
	if localAddrs == nil {
		var err error
		if localAddrs, err = p.cfg.LocalAddrs(); err != nil {
			klog.ErrorS(err, "Cannot list this host's addresses; its own traffic (to Services with externalTrafficPolicy: Local, or to load-balancer IPs with source ranges) is told apart by the last list")
			return
		}
	}
	set := make(map[netip.Addr]bool, len(localAddrs))
	for _, a := range localAddrs {
		set[a.Unmap().WithZone("")] = true
	}
	p.hostAddrs.Store(&set)
}

// hostAddrList returns the addresses readHostAddrs last read, sorted, if
// it keeps them.
func (p *Proxier) hostAddrList() []netip.Addr {
	set := p.hostAddrs.Load()
	if set == nil {
		return nil
	}
	return slices.SortedFunc(maps.Keys(*set), netip.Addr.Compare)
}

// HostAddrs returns this host's addresses as the last Apply read them, when
// a Service needed them (a Local external traffic policy, or
// load-balancer source ranges); else nil. A failed read keeps the list
// before it.
func (p *Proxier) HostAddrs() []netip.Addr { return p.hostAddrList() }

// ResetConnectionsLeaving resets the connections that reached a service
// address the portal put on this host and that snap no longer has: the
// bind portal is about to take it off the host, after which their packets
// could neither arrive nor leave, and a reset could not be sent either.
// Call it before the portal syncs snap.
func (p *Proxier) ResetConnectionsLeaving(snap state.Snapshot) {
	cur := p.frontendAddrs.Load()
	if cur == nil {
		return
	}
	keep := frontendsOf(snap)
	gone := make(map[netip.Addr]bool)
	for a := range *cur {
		if !keep[a] {
			gone[a] = true
		}
	}
	if len(gone) > 0 {
		p.abortConnsTo(gone)
	}
}

// frontendsOf returns the frontend addresses of every service port of snap.
func frontendsOf(snap state.Snapshot) map[netip.Addr]bool {
	out := make(map[netip.Addr]bool)
	for spec := range snap.All {
		for _, ap := range spec.Frontends() {
			out[ap.Addr().Unmap()] = true
		}
	}
	return out
}

// isFrontendAddr reports whether a is a service address the portal put on
// this host (see frontendAddrs).
func (p *Proxier) isFrontendAddr(a netip.Addr) bool {
	set := p.frontendAddrs.Load()
	return set != nil && (*set)[a.Unmap().WithZone("")]
}

// NodePortAddrRefused reports whether a node port reached at local address
// dst through a wildcard socket must be refused there (see
// nodePortRefusal). Health-check node ports follow it as node ports do.
func (p *Proxier) NodePortAddrRefused(dst netip.Addr) bool {
	return p.nodePortRefusal(dst) != ""
}

// nodePortRefusal says why a node port reached at local address dst
// through a wildcard socket must be refused there, or "" when it is
// served: dst is a service address the bind portal put on this host (see
// frontendAddrs), or a loopback address with localhost node ports off.
func (p *Proxier) nodePortRefusal(dst netip.Addr) string {
	switch {
	case p.cfg.NoLocalhostNodePorts && dst.Unmap().IsLoopback():
		return "Node port reached on a loopback address (--iptables-localhost-nodeports=false); refused"
	case p.isFrontendAddr(dst):
		return "Node port reached on a service address; refused"
	}
	return ""
}

// nodePortRefuses reports whether a connection or datagram that reached a
// node-port socket of role r at local address dst must be refused (see
// nodePortRefusal). It logs the refusal at -v=4.
func (sp *servicePort) nodePortRefuses(r socketRole, dst netip.Addr, client netip.AddrPort) bool {
	if r != roleNodePort {
		return false
	}
	why := sp.p.nodePortRefusal(dst)
	if why != "" && klog.V(4).Enabled() {
		klog.InfoS(why, "service", sp.name, "client", client, "addr", dst)
	}
	return why != ""
}

// isPod reports whether a is in ClusterCIDRs.
func (p *Proxier) isPod(a netip.Addr) bool {
	a = a.Unmap()
	return slices.ContainsFunc(p.cfg.ClusterCIDRs, func(c netip.Prefix) bool { return c.Contains(a) })
}

// isHostAddr reports whether a is one of this host's addresses, as
// readHostAddrs last read them.
func (p *Proxier) isHostAddr(a netip.Addr) bool {
	set := p.hostAddrs.Load()
	return set != nil && (*set)[a.Unmap().WithZone("")]
}

// checkNodePortAddrs says so when no local address of a family matches
// NodePortAddresses while services of that family have node ports
// (wanted, by family.index), which are then served nowhere, and again when
// one does.
func (p *Proxier) checkNodePortAddrs(wanted [2]bool, localAddrs []netip.Addr) {
	matched := true
	var missing []string
	for i, f := range bothFamilies {
		if !wanted[i] || state.NodePortsEverywhere(p.cfg.NodePortAddresses, f == familyIPv6) {
			continue
		}
		if !slices.ContainsFunc(localAddrs, func(a netip.Addr) bool {
			return familyOf(a) == f && InNodePortAddresses(p.cfg.NodePortAddresses, a)
		}) {
			matched = false
			missing = append(missing, f.String())
		}
	}
	switch {
	case !matched && !p.noNodePortAddrs:
		p.noNodePortAddrs = true
		klog.InfoS("No address of this host is in --nodeport-addresses: node ports are served nowhere until one is",
			"nodePortAddresses", p.cfg.NodePortAddresses, "families", missing, "hostAddresses", localAddrs)
	case matched && p.noNodePortAddrs:
		p.noNodePortAddrs = false
		klog.InfoS("An address of this host is in --nodeport-addresses again: node ports are served", "nodePortAddresses", p.cfg.NodePortAddresses)
	}
}

// InNodePortAddresses reports whether node ports are served on a by the
// CIDRs of --nodeport-addresses (Config.NodePortAddresses), read per IP
// family (state.InNodePortCIDRs).
func InNodePortAddresses(cidrs []netip.Prefix, a netip.Addr) bool {
	return state.InNodePortCIDRs(cidrs, a)
}

// HostAddrs lists the addresses of every interface of this host.
func HostAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
