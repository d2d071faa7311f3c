package portal

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// Interface makes the kernel steer service traffic to the proxy. It is
// declarative: each Sync states the whole wanted set, and the
// implementation adds what is missing and removes what is no longer wanted.
type Interface interface {
	// Sync makes the kernel's redirection match portals exactly. It
	// carries on past a portal it cannot program and returns every
	// failure; calling it again retries them.
	Sync(ctx context.Context, portals []Portal) error
	// Cleanup removes everything the implementation owns in the kernel. It
	// is harmless when there is nothing to remove.
	Cleanup(ctx context.Context) error
}

// ErrNotSupported is returned by constructors of portals that this
// operating system cannot run.
var ErrNotSupported = errors.New("not supported on this OS")

// Kind is the kind of address a portal catches.
type Kind string

// The kinds of frontend a service port has.
const (
	ClusterIP      Kind = "ClusterIP"
	ExternalIP     Kind = "ExternalIP"
	LoadBalancerIP Kind = "LoadBalancerIP"
	NodePort       Kind = "NodePort"
)

// Family is an IP family.
type Family int

// The IP families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// FamilyOf returns the family of a.
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// Portal is one redirection: traffic of Protocol to IP:Port (or, for a
// NodePort, to Port on the node's own addresses of Family) goes to the
// proxy's ProxyPort on this host.
type Portal struct {
	// Service is the service port served; its Comment() names the rules.
	Service state.ServicePortName
	Kind    Kind
	// Family is the IP family; for all kinds but NodePort it is IP's.
	Family Family
	// IP is the frontend address. It is the zero Addr for a NodePort.
	IP netip.Addr
	// Port is the service port, or the node port for a NodePort.
	Port uint16
	// ProxyPort is where the proxy listens for this service port. Zero
	// means the proxy has no proxy port for it (it is not served, or it
	// binds the frontend itself): redirecting portals skip it.
	ProxyPort uint16
	// SourceRanges, on a LoadBalancerIP portal, are the only sources
	// whose traffic is redirected (loadBalancerSourceRanges, see
	// state.ServicePort.SourceRanges); the iptables portal drops traffic
	// to the address from any other source. Nil redirects every source.
	SourceRanges []netip.Prefix
	// Reject says the service port has no endpoints of Family (the data
	// plane sends a connection only to endpoints of its family): the iptables
	// portal refuses new connections redirected to ProxyPort, as
	// kube-proxy rejects them (TCP clients get "connection refused" at
	// connect, UDP clients an ICMP port unreachable), instead of letting
	// the proxy accept and reset them.
	Reject bool
	// NoLocal says the service port has endpoints of Family, but none
	// that this portal's Local traffic policy lets it use (none on this
	// node): the iptables portal drops its new connections, as kube-proxy
	// drops them, instead of letting the proxy accept and reset them. An
	// external portal (any kind but ClusterIP) still takes those from this
	// host and from pods (IPTablesConfig.ClusterCIDRs), which the proxy
	// sends to every endpoint, as kube-proxy routes them.
	NoLocal bool
	// HealthCheckNodePort is the Service's health-check node port (see
	// state.ServicePort.HealthCheckNodePort), or 0 for none. The proxy
	// answers on it itself, without a redirect; the iptables portal
	// accepts TCP to it in its filter chain, for hosts whose INPUT policy
	// drops, as kube-proxy accepts it whether or not the node has local
	// endpoints. Every portal of the Service in a family carries it.
	HealthCheckNodePort uint16
	// NodePortDst, on a NodePort read back from the iptables portal's
	// rules (IPTables.Drift, MovedNodePorts), is the destination its rule
	// matches: a --nodeport-addresses CIDR, or the zero Prefix for every
	// local address (a node port has a portal per rule). FromSnapshot
	// leaves it zero, and Sync ignores it: the rules take their
	// destinations from IPTablesConfig.
	NodePortDst netip.Prefix
}

// Protocol is the portal's transport protocol.
func (p Portal) Protocol() state.Protocol { return p.Service.Protocol }

// String describes the portal as "198.18.0.10:80/TCP -> :41234" or
// "NodePort(IPv4) 30080/UDP -> :41235".
func (p Portal) String() string {
	if p.Kind == NodePort {
		return fmt.Sprintf("NodePort(%s) %d/%s -> :%d", p.Family, p.Port, p.Protocol(), p.ProxyPort)
	}
	return fmt.Sprintf("%s/%s -> :%d", netip.AddrPortFrom(p.IP, p.Port), p.Protocol(), p.ProxyPort)
}

// Compare orders portals by service, kind, family, address and port.
func (p Portal) Compare(o Portal) int {
	if c := p.Service.Compare(o.Service); c != 0 {
		return c
	}
	if c := kindRank(p.Kind) - kindRank(o.Kind); c != 0 {
		return c
	}
	if c := int(p.Family) - int(o.Family); c != 0 {
		return c
	}
	if c := p.IP.Compare(o.IP); c != 0 {
		return c
	}
	if c := int(p.Port) - int(o.Port); c != 0 {
		return c
	}
	if c := int(p.ProxyPort) - int(o.ProxyPort); c != 0 {
		return c
	}
	if c := compareBool(p.Reject, o.Reject); c != 0 {
		return c
	}
	if c := compareBool(p.NoLocal, o.NoLocal); c != 0 {
		return c
	}
	if c := int(p.HealthCheckNodePort) - int(o.HealthCheckNodePort); c != 0 {
		return c
	}
	if c := comparePrefix(p.NodePortDst, o.NodePortDst); c != 0 {
		return c
	}
	return slices.CompareFunc(p.SourceRanges, o.SourceRanges, comparePrefix)
}

// Equal reports whether two portals are the same redirection.
func (p Portal) Equal(o Portal) bool { return p.Compare(o) == 0 }

// compareBool orders false before true.
func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

func kindRank(k Kind) int {
	switch k {
	case ClusterIP:
		return 0
	case ExternalIP:
		return 1
	case LoadBalancerIP:
		return 2
	case NodePort:
		return 3
	}
	return 4
}

// FromSnapshot lists the portals of every service port in snap, sorted.
// proxyPort gives each service port's proxy port (pass the data plane's
// Proxier.ProxyPort); a zero result is kept as ProxyPort 0, which
// redirecting portals skip and binding portals do not need. A NodePort
// gets one portal per IP family of the service's frontends (IPv4 when it
// has none), as the data plane listens. hostAddrs are this host's
// addresses, which decide whether a load-balancer IP may be the source of
// its own traffic (see state.ServicePort.SourceRanges). Each portal carries
// its Service's health-check node port, so the families that serve the
// Service accept it.
func FromSnapshot(snap state.Snapshot, proxyPort func(state.ServicePortName) uint16, hostAddrs []netip.Addr) []Portal {
	var out []Portal
	for sp := range snap.All {
		pp := uint16(0)
		if proxyPort != nil {
			pp = proxyPort(sp.Name)
		}
		add := func(kind Kind, ips []netip.Addr) {
			for _, ip := range ips {
				ip = ip.Unmap()
				f := FamilyOf(ip)
				p := Portal{Service: sp.Name, Kind: kind, Family: f, IP: ip, Port: sp.Port, ProxyPort: pp, HealthCheckNodePort: sp.HealthCheckNodePort}
				p.Reject, p.NoLocal = refusal(sp, kind, f)
				if kind == LoadBalancerIP {
					p.SourceRanges = sp.SourceRanges(ip, hostAddrs)
				}
				out = append(out, p)
			}
		}
		add(ClusterIP, sp.ClusterIPs)
		add(ExternalIP, sp.ExternalIPs)
		add(LoadBalancerIP, sp.LoadBalancerIPs)
		if sp.NodePort != 0 {
			for _, f := range families(sp) {
				p := Portal{Service: sp.Name, Kind: NodePort, Family: f, Port: sp.NodePort, ProxyPort: pp, HealthCheckNodePort: sp.HealthCheckNodePort}
				p.Reject, p.NoLocal = refusal(sp, NodePort, f)
				out = append(out, p)
			}
		}
	}
	slices.SortFunc(out, Portal.Compare)
	return slices.CompactFunc(out, Portal.Equal)
}

// refusal says how a portal of kind and family f turns new connections
// away, as kube-proxy's filter rules do: reject when sp has no endpoint of
// f at all, drop (noLocal) when it has some but the traffic policy of the
// portal's traffic (internal for a ClusterIP, else external) is Local and
// none is on this node.
func refusal(sp *state.ServicePort, kind Kind, f Family) (reject, noLocal bool) {
	if !hasFamily(sp.ClusterEndpoints, f) && !hasFamily(sp.LocalEndpoints, f) {
		return true, false
	}
	eps := sp.ExternalEndpoints()
	if kind == ClusterIP {
		eps = sp.InternalEndpoints()
	}
	return false, !hasFamily(eps, f)
}

// hasFamily reports whether eps has an endpoint of family f.
func hasFamily(eps []state.Endpoint, f Family) bool {
	return slices.ContainsFunc(eps, func(ep state.Endpoint) bool { return FamilyOf(ep.Addr.Addr()) == f })
}

func families(sp *state.ServicePort) []Family {
	var out []Family
	has4, has6 := sp.Families()
	if has4 {
		out = append(out, IPv4)
	}
	if has6 {
		out = append(out, IPv6)
	}
	return out
}
