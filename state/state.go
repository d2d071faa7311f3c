package state

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Protocol is the transport protocol of a service port.
type Protocol string

// The protocols a Service port may use.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// ParseProtocol accepts TCP, UDP or SCTP in any case.
func ParseProtocol(s string) (Protocol, error) {
	switch p := Protocol(strings.ToUpper(s)); p {
	case TCP, UDP, SCTP:
		return p, nil
	}
	return "", fmt.Errorf("unknown protocol %q (want TCP, UDP or SCTP)", s)
}

// IPFamily is an IP family, as a Service's spec.ipFamilies names it.
type IPFamily string

// The IP families.
const (
	IPv4 IPFamily = "IPv4"
	IPv6 IPFamily = "IPv6"
)

// ServicePortName names one port of one Service, the unit the proxy serves.
type ServicePortName struct {
	Namespace string
	Name      string
	// Port is the port's name; empty for the single unnamed port of a Service.
	Port     string
	Protocol Protocol
}

// String returns "namespace/name:port/PROTOCOL", or "namespace/name/PROTOCOL"
// for an unnamed port.
func (n ServicePortName) String() string {
	var b strings.Builder
	b.WriteString(n.Namespace)
	b.WriteByte('/')
	b.WriteString(n.Name)
	if n.Port != "" {
		b.WriteByte(':')
		b.WriteString(n.Port)
	}
	b.WriteByte('/')
	b.WriteString(string(n.Protocol))
	return b.String()
}

// Service names the Service the port belongs to.
func (n ServicePortName) Service() ServiceName { return ServiceName{n.Namespace, n.Name} }

// ServiceName names a Service.
type ServiceName struct {
	Namespace string
	Name      string
}

// String returns "namespace/name".
func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// Comment returns the form used in iptables comments and logs that follow
// kube-proxy: "namespace/name:port" (or "namespace/name").
func (n ServicePortName) Comment() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// Compare orders names by namespace, name, port name and protocol.
func (n ServicePortName) Compare(o ServicePortName) int {
	if c := strings.Compare(n.Namespace, o.Namespace); c != 0 {
		return c
	}
	if c := strings.Compare(n.Name, o.Name); c != 0 {
		return c
	}
	if c := strings.Compare(n.Port, o.Port); c != 0 {
		return c
	}
	return strings.Compare(string(n.Protocol), string(o.Protocol))
}

// AffinityType is a Service's sessionAffinity.
type AffinityType string

// The session affinity types Kubernetes defines.
const (
	AffinityNone     AffinityType = "None"
	AffinityClientIP AffinityType = "ClientIP"
)

// DefaultAffinityTimeout is Kubernetes' default
// sessionAffinityConfig.clientIP.timeoutSeconds (10800 s).
const DefaultAffinityTimeout = 10800 * time.Second

// Affinity is a service port's session affinity.
type Affinity struct {
	// Type is None or ClientIP. The zero value means None.
	Type AffinityType
	// Timeout is how long a client stays with its endpoint after its last
	// new connection or session. It is only read for ClientIP; if zero,
	// DefaultAffinityTimeout.
	Timeout time.Duration
}

// Sticky reports whether the affinity pins clients to endpoints.
func (a Affinity) Sticky() bool { return a.Type == AffinityClientIP }

// TTL returns the effective timeout of a sticky affinity.
func (a Affinity) TTL() time.Duration {
	if a.Timeout <= 0 {
		return DefaultAffinityTimeout
	}
	return a.Timeout
}

// ProxyProtocol is the PROXY protocol header the proxy sends an endpoint
// ahead of a TCP connection's data, to tell it the client's address
// (https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt).
type ProxyProtocol uint8

// The PROXY protocol versions. The zero value sends no header.
const (
	ProxyProtocolNone ProxyProtocol = iota
	ProxyProtocolV1                 // the text header, "PROXY TCP4 ..."
	ProxyProtocolV2                 // the binary header
)

// String returns "v1", "v2", or "none".
func (v ProxyProtocol) String() string {
	switch v {
	case ProxyProtocolV1:
		return "v1"
	case ProxyProtocolV2:
		return "v2"
	case ProxyProtocolNone:
		return "none"
	}
	return fmt.Sprintf("ProxyProtocol(%d)", uint8(v))
}

// Endpoint is one backend address of a service port.
type Endpoint struct {
	Addr netip.AddrPort
	// Ready, Serving and Terminating are the EndpointSlice conditions, with
	// Kubernetes' nil defaults already applied.
	Ready       bool
	Serving     bool
	Terminating bool
	// NodeName is the node the endpoint runs on, if known.
	NodeName string
	// Local reports whether the endpoint runs on this node.
	Local bool
	// Topology names the topology hint that let the endpoint into a
	// port's ClusterEndpoints, "zone <name>" or "node <name>", when hints
	// narrowed them to those for this node; empty when they did not.
	Topology string
}

func (e Endpoint) String() string { return e.Addr.String() }

// ServicePort is everything the proxy needs to serve one service port.
type ServicePort struct {
	Name ServicePortName
	// Port is the service port number clients connect to on ClusterIPs,
	// ExternalIPs and load-balancer IPs.
	Port uint16
	// ClusterIPs are the service's cluster IPs; none in manifest mode when
	// the author gave none.
	ClusterIPs []netip.Addr
	// NodePort is the node port, or 0.
	NodePort uint16
	// ExternalIPs are spec.externalIPs.
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are the status.loadBalancer ingress IPs whose ipMode
	// is VIP (or unset).
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges are spec.loadBalancerSourceRanges, masked:
	// the sources the load-balancer IPs admit. Empty admits every source;
	// SourceRanges says which apply to one load-balancer IP.
	LoadBalancerSourceRanges []netip.Prefix
	// IPFamilies are the Service's spec.ipFamilies. They decide the
	// families of a port with no frontends (a manifest without cluster
	// IPs); otherwise the frontends do.
	IPFamilies []IPFamily
	Affinity   Affinity
	// InternalLocal is internalTrafficPolicy: Local; ExternalLocal is
	// externalTrafficPolicy: Local on an externally reachable service.
	InternalLocal bool
	ExternalLocal bool
	// HealthCheckNodePort is spec.healthCheckNodePort, or 0.
	HealthCheckNodePort uint16
	// ProxyProtocol is the PROXY protocol header sent to endpoints at the
	// start of every connection, as the Service's annotation asks. The
	// data plane sends it on TCP ports only. The zero value sends none.
	ProxyProtocol ProxyProtocol

	// ClusterEndpoints are the endpoints for traffic that may go anywhere in
	// the cluster: the ready ones allowed by topology, else the serving and
	// terminating ones. LocalEndpoints are the same choice made among this
	// node's endpoints only. Both are sorted by address.
	ClusterEndpoints []Endpoint
	LocalEndpoints   []Endpoint
	// TopologyHintsIgnored says why topology hints that the port's ready
	// endpoints carry are not used for its ClusterEndpoints, as kube-proxy
	// logs it ("zone hints ignored: none is for zone zone-a"); node hints
	// may be ignored while zone hints are used (see Endpoint.Topology).
	// Empty when every kind of hint given is used, or none is given.
	TopologyHintsIgnored string
	// ServingEndpoints are every endpoint of the port that is serving
	// (ready, or terminating and still serving), whatever its node, its
	// topology hints or the traffic policies, sorted: those an existing
	// UDP session may stay on. As kube-proxy's conntrack cleanup keeps
	// such flows, a change to the Service (readiness, hints, policies,
	// termination) moves only new connections; a session ends when its
	// endpoint is gone or stops serving. The endpoints of ClusterEndpoints
	// and LocalEndpoints count as serving too, so a source that leaves
	// this nil (a test's hand-made port) ends the sessions of those it
	// drops.
	ServingEndpoints []netip.AddrPort
}

// HasEndpoints reports whether the port has any endpoint to send traffic
// to, here or on another node; without one it refuses every client.
func (sp *ServicePort) HasEndpoints() bool {
	return len(sp.ClusterEndpoints) > 0 || len(sp.LocalEndpoints) > 0
}

// InternalEndpoints are the endpoints for traffic to ClusterIPs.
func (sp *ServicePort) InternalEndpoints() []Endpoint {
	if sp.InternalLocal {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

// ExternalEndpoints are the endpoints for traffic to the NodePort,
// ExternalIPs and load-balancer IPs.
func (sp *ServicePort) ExternalEndpoints() []Endpoint {
	if sp.ExternalLocal {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

// Frontends lists every address clients may use for this port other than
// the node port: ClusterIPs, ExternalIPs and load-balancer IPs, each with
// the service port.
func (sp *ServicePort) Frontends() []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(sp.ClusterIPs)+len(sp.ExternalIPs)+len(sp.LoadBalancerIPs))
	for _, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, ip := range list {
			out = append(out, netip.AddrPortFrom(ip, sp.Port))
		}
	}
	return out
}

// Families reports which IP families the port's frontends (ClusterIPs,
// ExternalIPs, load-balancer IPs) use. A port with no frontends has those
// of IPFamilies, or IPv4 when that is empty too: the families it is served
// on then.
func (sp *ServicePort) Families() (ipv4, ipv6 bool) {
	for _, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, ip := range list {
			if ip.Unmap().Is4() {
				ipv4 = true
			} else {
				ipv6 = true
			}
		}
	}
	if !ipv4 && !ipv6 {
		ipv4, ipv6 = slices.Contains(sp.IPFamilies, IPv4), slices.Contains(sp.IPFamilies, IPv6)
	}
	return ipv4 || !ipv6, ipv6
}

// SourceRanges returns the sources that traffic to the load-balancer IP
// lbIP may come from, or nil when any source may. As in kube-proxy, only
// the ranges of lbIP's family count, and a family with none, or with a /0
// range, admits every source. When a range holds one of hostAddrs (this
// node's addresses), the service's load-balancer IPs of that family are
// admitted as sources too: a cloud that puts the VIP on the node itself
// makes it the source of the node's own traffic to it (kube-proxy allows
// them when a range holds its node IP).
func (sp *ServicePort) SourceRanges(lbIP netip.Addr, hostAddrs []netip.Addr) []netip.Prefix {
	is4 := lbIP.Unmap().Is4()
	var out []netip.Prefix
	for _, r := range sp.LoadBalancerSourceRanges {
		if r.Addr().Is4() != is4 {
			continue
		}
		if r.Bits() == 0 {
			return nil
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil
	}
	nodeAdmitted := slices.ContainsFunc(hostAddrs, func(a netip.Addr) bool {
		a = a.Unmap()
		return slices.ContainsFunc(out, func(r netip.Prefix) bool { return r.Contains(a) })
	})
	if nodeAdmitted {
		for _, ip := range sp.LoadBalancerIPs {
			if ip = ip.Unmap(); ip.Is4() == is4 {
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out
}

// Equal reports whether two service ports are identical.
func (sp *ServicePort) Equal(o *ServicePort) bool {
	return sp.Name == o.Name && sp.Port == o.Port && sp.NodePort == o.NodePort &&
		slices.Equal(sp.ClusterIPs, o.ClusterIPs) &&
		slices.Equal(sp.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(sp.LoadBalancerIPs, o.LoadBalancerIPs) &&
		slices.Equal(sp.LoadBalancerSourceRanges, o.LoadBalancerSourceRanges) &&
		slices.Equal(sp.IPFamilies, o.IPFamilies) &&
		sp.Affinity == o.Affinity &&
		sp.InternalLocal == o.InternalLocal && sp.ExternalLocal == o.ExternalLocal &&
		sp.HealthCheckNodePort == o.HealthCheckNodePort &&
		sp.ProxyProtocol == o.ProxyProtocol &&
		slices.Equal(sp.ClusterEndpoints, o.ClusterEndpoints) &&
		slices.Equal(sp.LocalEndpoints, o.LocalEndpoints) &&
		slices.Equal(sp.ServingEndpoints, o.ServingEndpoints) &&
		sp.TopologyHintsIgnored == o.TopologyHintsIgnored
}

// Snapshot is the full desired state at one moment. It must not be
// modified once built.
type Snapshot struct {
	ports map[ServicePortName]*ServicePort
	names []ServicePortName // sorted

	// ChangeTriggers are when the changes this snapshot brings were
	// triggered, for the network programming latency kube-proxy reports.
	// They do not take part in comparisons.
	ChangeTriggers []ChangeTrigger
	// Changes names the Services whose change this snapshot brings, for
	// the change counts kube-proxy reports. They do not take part in
	// comparisons.
	Changes Changes
}

// ChangeTrigger is when a change of one IP family's endpoints was
// triggered: an EndpointSlice's endpoints.kubernetes.io/
// last-change-trigger-time, and the slice's address type. kube-proxy
// observes the latency in the proxier of that family alone.
type ChangeTrigger struct {
	At     time.Time
	Family IPFamily
}

// NewSnapshot builds a Snapshot from service ports. A later port with the
// same name replaces an earlier one.
func NewSnapshot(ports []ServicePort) Snapshot {
	s := Snapshot{ports: make(map[ServicePortName]*ServicePort, len(ports))}
	for i := range ports {
		sp := ports[i]
		if _, dup := s.ports[sp.Name]; !dup {
			s.names = append(s.names, sp.Name)
		}
		s.ports[sp.Name] = &sp
	}
	slices.SortFunc(s.names, ServicePortName.Compare)
	return s
}

// Len is the number of service ports.
func (s Snapshot) Len() int { return len(s.names) }

// Get returns the named service port, or nil.
func (s Snapshot) Get(n ServicePortName) *ServicePort { return s.ports[n] }

// Names returns the service port names in sorted order. The caller must not
// modify the slice.
func (s Snapshot) Names() []ServicePortName { return s.names }

// All calls yield for every service port in name order.
func (s Snapshot) All(yield func(*ServicePort) bool) {
	for _, n := range s.names {
		if !yield(s.ports[n]) {
			return
		}
	}
}
