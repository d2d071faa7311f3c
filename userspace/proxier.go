package userspace

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-multierror"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// Defaults for the zero values of Config.
const (
	DefaultUDPIdleTimeout      = 250 * time.Millisecond
	DefaultUDPReplyTimeout     = 5 * time.Second
	DefaultUDPMaxSessions      = 4096
	DefaultTCPHalfCloseTimeout = 5 * time.Minute
	DefaultEndpointPenalty     = 2 * time.Second
)

// DefaultDialTimeouts are the per-attempt timeouts of connect-time failover,
// as in the legacy proxier: at most four attempts, 3.75 s in all.
var DefaultDialTimeouts = []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

// Config configures a Proxier. Its zero value serves every service port on a
// kernel-chosen proxy port on the wildcard address of each IP family.
type Config struct {
	// BindAddress is the address proxy ports listen on. If it is invalid or
	// unspecified (0.0.0.0 or ::), each service port listens on the
	// wildcard address of every IP family among its frontends (IPv4 when
	// it has none). A specific address is used for every service port.
	BindAddress netip.Addr
	// PortRange is where proxy ports come from. If zero, the kernel
	// chooses.
	PortRange PortRange
	// DisableProxyPorts stops the proxier from opening proxy ports, for
	// portals that bind service addresses directly.
	DisableProxyPorts bool
	// ServeNodePorts makes the proxier listen on each NodePort itself, at
	// NodePortAddresses, for portals that do not redirect node ports.
	ServeNodePorts bool
	// NodePortAddresses restricts the node addresses NodePorts are served
	// on. If empty, the wildcard address of each IP family is used.
	NodePortAddresses []netip.Prefix
	// NoLocalhostNodePorts keeps node ports off loopback addresses
	// (kube-proxy's --iptables-localhost-nodeports=false): they are not
	// listened on there, and a wildcard listener refuses what reaches it
	// there. If false, they are served there too.
	NoLocalhostNodePorts bool
	// ServeFrontends makes the proxier listen on every ClusterIP,
	// ExternalIP and load-balancer IP at the service port, for the bind
	// portal.
	ServeFrontends bool
	// NodeAddrs, with ServeFrontends, returns this host's own addresses
	// (not the service addresses the portal added): node ports are served
	// on those even when a Service uses one as a frontend (an external IP
	// that is the node's). Nil counts every frontend as the portal's.
	NodeAddrs func() (map[netip.Addr]bool, error)
	// UnservedFrontends, with ServeFrontends, returns the service
	// addresses the portal leaves off this host (the IPv6 ones where IPv6
	// is turned off): nothing listens on them, as nothing could. Nil
	// means every frontend is served.
	UnservedFrontends func() map[netip.Addr]bool
	// PortalRefuses says the portal turns away, before they reach the
	// proxy, new connections to a service port with no endpoint for them,
	// as kube-proxy's filter rules do (the iptables portal): it refuses
	// them (REJECT) when the port has no endpoint of their IP family at
	// all, and drops them (DROP) when it has some, but none that a Local
	// traffic policy lets it use. It changes only what the log says. If
	// false, the proxy turns them away itself: it resets TCP connections,
	// aborts SCTP associations and drops datagrams.
	PortalRefuses bool
	// ClusterCIDRs are the pods' addresses (kube-proxy's --cluster-cidr).
	// A pod's traffic to a node port, external IP or load-balancer IP of
	// a Service with externalTrafficPolicy: Local goes to all its
	// endpoints, as this host's own traffic does and as kube-proxy
	// routes it: the policy is for traffic from outside the cluster. If
	// empty, only this host's traffic is told apart.
	ClusterCIDRs []netip.Prefix

	// UDPIdleTimeout ends a UDP session after this long without traffic
	// once its endpoint has answered. If zero, DefaultUDPIdleTimeout.
	UDPIdleTimeout time.Duration
	// UDPReplyTimeout is how long a session waits for an answer to a
	// client's datagram, when longer than UDPIdleTimeout, so a slow first
	// reply is never lost to the idle timeout. If zero,
	// DefaultUDPReplyTimeout.
	UDPReplyTimeout time.Duration
	// UDPMaxSessions caps the UDP sessions of one service port; datagrams
	// from new clients beyond it are dropped and counted. If zero,
	// DefaultUDPMaxSessions. Negative means no cap.
	UDPMaxSessions int

	// DialTimeouts are the per-attempt timeouts of TCP connect-time
	// failover; each failed attempt moves to another endpoint. If nil,
	// DefaultDialTimeouts.
	DialTimeouts []time.Duration
	// EndpointPenalty is how long new connections pass over an endpoint
	// after a dial to it failed, while other endpoints remain. If zero,
	// DefaultEndpointPenalty.
	EndpointPenalty time.Duration
	// TCPHalfCloseTimeout bounds how long a connection stays open after one
	// side has finished sending while the other is silent. If zero,
	// DefaultTCPHalfCloseTimeout.
	TCPHalfCloseTimeout time.Duration

	// PreferredProxyPort, if set, names the proxy port service port sp had
	// before (for example in the rules a previous run left), so a restarted
	// proxy keeps serving its redirections without a gap. external asks for
	// the port of redirected external traffic. The port is used when it is
	// free (and inside PortRange, if one is set); 0 means no preference.
	PreferredProxyPort func(sp *state.ServicePort, external bool) uint16
	// HoldReleasedPorts keeps a proxy port that one service port gave up
	// from any other until PortalSynced says the portal no longer
	// redirects to it: until then, traffic for the old Service would reach
	// the new one's endpoints. Its sockets stay open meanwhile, serving
	// the service port as before, so that what the portal still sends
	// there is not refused; they close at PortalSynced (a failed sync
	// leaves the old rules redirecting to them), or when more than
	// maxReleased wait. For redirecting portals.
	HoldReleasedPorts bool
	// PreviousProxyPorts are the proxy ports a previous run's portal
	// still redirects to, and whose they were: held from other service
	// ports until the first PortalSynced (see HoldReleasedPorts).
	PreviousProxyPorts map[uint16]state.ServicePortName

	// Clock is used for session-affinity expiry. If nil, the real clock.
	Clock Clock
	// LocalAddrs lists this host's addresses, to match NodePortAddresses;
	// node ports listen on those that match, so an IPv6 link-local one
	// needs its zone. If nil, NodeAddrs: the usable addresses of every
	// interface.
	LocalAddrs func() ([]netip.Addr, error)
}

func (c *Config) setDefaults() {
	if c.UDPIdleTimeout <= 0 {
		c.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if c.UDPReplyTimeout <= 0 {
		c.UDPReplyTimeout = DefaultUDPReplyTimeout
	}
	if c.UDPMaxSessions == 0 {
		c.UDPMaxSessions = DefaultUDPMaxSessions
	}
	if len(c.DialTimeouts) == 0 {
		c.DialTimeouts = DefaultDialTimeouts
	}
	if c.EndpointPenalty <= 0 {
		c.EndpointPenalty = DefaultEndpointPenalty
	}
	if c.TCPHalfCloseTimeout <= 0 {
		c.TCPHalfCloseTimeout = DefaultTCPHalfCloseTimeout
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.LocalAddrs == nil {
		c.LocalAddrs = NodeAddrs
	}
}

// Proxier serves a Snapshot: one listener per service port, load balancing
// new connections and UDP sessions across the endpoints.
type Proxier struct {
	cfg   Config
	ports *portAllocator
	shed  *shedder
	fds   fdCeilings // the descriptors the data plane may keep (fdreserve.go)
	// fdLimit reads RLIMIT_NOFILE (see readFDLimit).
	fdLimit func() uint64
	stats   Stats
	ctx     context.Context // cancelled by Close; bounds dials
	cancel  context.CancelFunc
	wg      sync.WaitGroup // every goroutine the proxier starts

	mu       sync.Mutex // guards the fields below; held for a whole Apply
	services map[state.ServicePortName]*servicePort
	skipped  map[state.ServicePortName]error // reported as unsupported, and why
	sctpOff  bool                            // SCTP unavailability has been logged
	closed   bool
	// noNodePortAddrs: no local address matches NodePortAddresses, and
	// that has been logged.
	noNodePortAddrs bool
	// held maps the proxy ports given up since the portal last synced to
	// the service port that had them (see Config.HoldReleasedPorts);
	// waiting says a service port went without a proxy port for it.
	held    map[uint16]state.ServicePortName
	waiting bool
	// released are the proxy-port sockets given up since the portal last
	// synced, with HoldReleasedPorts: the portal may still redirect to
	// them, so they serve on until it has (see closeReleased). deleted
	// are their service ports that Apply removed: their balancers empty
	// when the sockets close.
	released []releasedSocket
	deleted  []*servicePort
	// externalMoved are the service ports whose external traffic the
	// portal is to move off their proxy port, to the external proxy port
	// opened since it last synced: the endpoints of the proxy port's UDP
	// sessions are remembered at Apply and again once it has (see
	// movedSessions).
	externalMoved map[*servicePort]bool

	// moved are the endpoints of the UDP sessions whose proxy port moved,
	// for their clients' next sessions; it has a lock of its own.
	moved movedSessions

	// hostAddrs are this host's addresses, read on Apply while a service
	// port has a Local external traffic policy (see servicePort.balancer).
	hostAddrs atomic.Pointer[map[netip.Addr]bool]
	// frontendAddrs, with ServeFrontends, are the service addresses the
	// portal put on this host: node ports are not served on them (as
	// kube-proxy's IPVS mode leaves its dummy interface's addresses out),
	// or LB-IP:nodePort would get round loadBalancerSourceRanges.
	frontendAddrs atomic.Pointer[map[netip.Addr]bool]

	conns  connTracker // live TCP connections, where goroutines serve them
	assocs sctpTracker // live SCTP associations

	loopSet // the event loops, where they serve the sockets (Linux)
}

// New returns a Proxier serving nothing. Call Apply to serve a Snapshot and
// Close to stop.
func New(cfg Config) *Proxier {
	cfg.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxier{
		cfg:      cfg,
		ports:    newPortAllocator(cfg.PortRange, cfg.Clock.Now),
		shed:     newShedder(),
		ctx:      ctx,
		cancel:   cancel,
		services: make(map[state.ServicePortName]*servicePort),
		skipped:  make(map[state.ServicePortName]error),
		held:     maps.Clone(cfg.PreviousProxyPorts),
	}
	p.readFDLimit()
	return p
}

// Stats returns the proxier's counters.
func (p *Proxier) Stats() *Stats { return &p.stats }

// Apply makes the proxier serve snap. Service ports that are gone are closed;
// new ones get listeners; changed ones get their endpoints and affinity
// swapped in place and only the sockets whose addresses changed are opened
// or closed. Connections of unchanged service ports are not touched. Apply
// carries on past a service port it cannot serve and returns every such
// failure; calling it again retries them.
func (p *Proxier) Apply(snap state.Snapshot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("userspace: apply: proxier is closed")
	}
	var errs *multierror.Error
	p.waiting = false
	p.moved.sweep(p.cfg.Clock.Now())
	for name, sp := range p.services {
		if snap.Get(name) == nil {
			klog.V(2).InfoS("Stopping service port", "service", name)
			sp.close()
			delete(p.services, name)
		}
	}
	for name := range p.skipped {
		if snap.Get(name) == nil {
			delete(p.skipped, name)
		}
	}
	// What the snapshot asks of the host, in one pass: the ports this host
	// serves itself are never proxy ports, even when --proxy-port-range
	// overlaps the node-port range (a node port the proxier listens on,
	// and a health-check node port, which has a listener of its own
	// whatever the portal).
	var externalLocal, sourceRanges bool
	var nodePorts [2]bool // the families of Services with node ports: IPv4, IPv6
	hostPorts := make(map[uint16]bool)
	for spec := range snap.All {
		if spec.NodePort != 0 {
			for _, f := range families(spec) {
				nodePorts[f.index()] = true
			}
		}
		externalLocal = externalLocal || spec.ExternalLocal
		sourceRanges = sourceRanges || len(spec.LoadBalancerSourceRanges) > 0 && len(spec.LoadBalancerIPs) > 0
		if spec.NodePort != 0 && p.cfg.ServeNodePorts {
			hostPorts[spec.NodePort] = true
		}
		if spec.HealthCheckNodePort != 0 {
			hostPorts[spec.HealthCheckNodePort] = true
		}
	}
	var localAddrs []netip.Addr
	if p.cfg.ServeNodePorts && len(p.cfg.NodePortAddresses) > 0 {
		var err error
		if localAddrs, err = p.cfg.LocalAddrs(); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("userspace: list local addresses for node ports: %w", err))
		} else {
			p.checkNodePortAddrs(nodePorts, localAddrs)
		}
	}
	p.readHostAddrs(externalLocal || sourceRanges, localAddrs)
	var hostAddrs []netip.Addr // only source ranges read them here
	if sourceRanges {
		hostAddrs = p.hostAddrList()
	}
	var unserved map[netip.Addr]bool // frontends the portal leaves off the host
	if p.cfg.ServeFrontends {
		var node map[netip.Addr]bool
		if p.cfg.NodeAddrs != nil {
			var err error
			if node, err = p.cfg.NodeAddrs(); err != nil {
				errs = multierror.Append(errs, fmt.Errorf("userspace: list this host's addresses: %w", err))
			}
		}
		fronts := frontendsOf(snap)
		for a := range node {
			delete(fronts, a)
		}
		if p.cfg.UnservedFrontends != nil {
			unserved = p.cfg.UnservedFrontends()
			for a := range unserved {
				delete(fronts, a)
			}
		}
		p.frontendAddrs.Store(&fronts)
	}
	p.ports.reserve(hostPorts)
	type work struct {
		sp    *servicePort
		extra []sockKey
	}
	var todo []work
	for spec := range snap.All {
		sp, ok := p.services[spec.Name]
		if !ok {
			if err := p.supported(spec.Name.Protocol); err != nil {
				p.unsupported(spec, err)
				continue
			}
			sp = newServicePort(p, spec)
			p.services[spec.Name] = sp
			klog.V(2).InfoS("Starting service port", "service", spec.Name)
		} else if !sp.spec.Equal(spec) {
			sp.update(spec)
		} else {
			sp.sweep() // unchanged: only drop expired affinity
		}
		sp.setSources(spec, hostAddrs) // the host's addresses may have changed
		todo = append(todo, work{sp, p.desiredSockets(sp, spec, localAddrs, unserved)})
	}
	// Close what every service port no longer wants before opening
	// anything, so that a port passed from one service port to another
	// (two Services swapping node ports) is free when it is opened.
	for _, w := range todo {
		w.sp.prune(w.extra)
	}
	for _, w := range todo {
		if err := w.sp.reconcile(w.extra); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	return errs.ErrorOrNil()
}

// supported reports whether this proxier can serve a protocol here.
func (p *Proxier) supported(proto state.Protocol) error {
	switch proto {
	case state.TCP, state.UDP:
		return nil
	case state.SCTP:
		return sctpAvailable()
	}
	return fmt.Errorf("unknown protocol %q", proto)
}

// unsupported reports, once per service port, a protocol this proxier
// cannot serve; that SCTP is unavailable is logged once in all. It is not
// an Apply error: retrying cannot help, and the other service ports are
// served as usual.
func (p *Proxier) unsupported(spec *state.ServicePort, why error) {
	if _, ok := p.skipped[spec.Name]; ok {
		return
	}
	p.skipped[spec.Name] = why
	if spec.Name.Protocol == state.SCTP {
		if !p.sctpOff {
			p.sctpOff = true
			klog.InfoS("SCTP is not available; SCTP service ports are not served, others are", "err", why)
		}
		klog.V(2).InfoS("Skipping SCTP service port", "service", spec.Name)
		return
	}
	klog.InfoS("Skipping service port: its protocol is not supported here", "service", spec.Name, "proto", spec.Name.Protocol, "err", why)
}

// Close stops every listener and connection and waits for all of the
// proxier's goroutines to end. It is safe to call more than once.
func (p *Proxier) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.cancel()
		for name, sp := range p.services {
			sp.close()
			delete(p.services, name)
		}
		p.closeReleased()
		p.moved.forget()
		p.conns.abortAll()
		p.assocs.abortAll()
		p.shed.close()
		p.stopLoops()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// desiredSockets lists the addresses a service port should listen on, other
// than its proxy port, which the service port manages itself; none of the
// frontends in unserved (see Config.UnservedFrontends).
func (p *Proxier) desiredSockets(sp *servicePort, spec *state.ServicePort, localAddrs []netip.Addr, unserved map[netip.Addr]bool) []sockKey {
	var want []sockKey
	fams := families(spec)
	if p.cfg.ServeNodePorts && spec.NodePort != 0 {
		// Each family serves its own Services, as kube-proxy's proxier
		// of that family does: an IPv4 Service has no node port on the
		// host's IPv6 addresses. A family whose node ports are served
		// everywhere listens on its wildcard address.
		for _, f := range fams {
			if state.NodePortsEverywhere(p.cfg.NodePortAddresses, f == familyIPv6) {
				want = append(want, sockKey{netip.AddrPortFrom(wildcard(f), spec.NodePort), roleNodePort})
				continue
			}
			for _, a := range localAddrs {
				if familyOf(a) == f && InNodePortAddresses(p.cfg.NodePortAddresses, a) && !p.isFrontendAddr(a) &&
					!(p.cfg.NoLocalhostNodePorts && a.Unmap().IsLoopback()) {
					want = append(want, sockKey{netip.AddrPortFrom(a, spec.NodePort), roleNodePort})
				}
			}
		}
	}
	if p.cfg.ServeFrontends {
		for _, ip := range spec.ClusterIPs {
			if !unserved[ip.Unmap()] {
				want = append(want, sockKey{netip.AddrPortFrom(ip, spec.Port), roleFrontend})
			}
		}
		for _, ip := range slices.Concat(spec.ExternalIPs, spec.LoadBalancerIPs) {
			if !unserved[ip.Unmap()] {
				want = append(want, sockKey{netip.AddrPortFrom(ip, spec.Port), roleExternalFrontend})
			}
		}
	}
	return want
}

// proxyPortAddrs returns the addresses a service port's proxy port listens
// on, one per IP family.
func (p *Proxier) proxyPortAddrs(spec *state.ServicePort) []netip.Addr {
	if b := p.cfg.BindAddress; b.IsValid() && !b.IsUnspecified() {
		return []netip.Addr{b.Unmap()}
	}
	var out []netip.Addr
	for _, f := range families(spec) {
		out = append(out, wildcard(f))
	}
	return out
}
