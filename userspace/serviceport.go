package userspace

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-multierror"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// socketRole says why a socket exists and which endpoint set it uses.
type socketRole int

const (
	roleProxyPort         socketRole = iota // redirected traffic; internal endpoints
	roleExternalProxyPort                   // redirected external traffic when its endpoints differ; external endpoints
	roleNodePort                            // node port served directly; external endpoints
	roleFrontend                            // ClusterIP bound directly; internal endpoints
	roleExternalFrontend                    // ExternalIP or LB IP bound directly; external endpoints
)

func (r socketRole) String() string {
	switch r {
	case roleProxyPort:
		return "proxy-port"
	case roleExternalProxyPort:
		return "external-proxy-port"
	case roleNodePort:
		return "node-port"
	case roleFrontend:
		return "frontend"
	default:
		return "external-frontend"
	}
}

func (r socketRole) external() bool {
	return r == roleNodePort || r == roleExternalFrontend || r == roleExternalProxyPort
}

type sockKey struct {
	addr netip.AddrPort
	role socketRole
}

// socket is a listening TCP or UDP socket with its serving goroutine.
type socket interface {
	// close stops the socket. TCP connections it accepted keep running;
	// UDP sessions end.
	close()
}

// sourceFilterer is a socket the kernel can keep from sources that admits
// would refuse (a socket filter, in the event-loop build on Linux).
type sourceFilterer interface {
	// filterSources has the kernel drop packets from sources outside
	// ranges; nil admits every source.
	filterSources(ranges []netip.Prefix) error
}

// servicePort is the live state of one service port: its balancers and the
// sockets that feed them. Its fields are guarded by the Proxier's mu.
type servicePort struct {
	p     *Proxier
	name  state.ServicePortName
	proto state.Protocol

	internal *balancer
	// external is the balancer for node-port and external traffic; it is
	// internal itself unless the traffic policies give the two different
	// endpoint sets.
	external atomic.Pointer[balancer]
	// fromHost balances external traffic that starts on this host or in a
	// pod (Config.ClusterCIDRs), under externalTrafficPolicy: Local (else
	// it is nil): over the cluster endpoints, as kube-proxy routes it, so
	// that the policy does not cut the cluster off from its own Service.
	// It is internal itself unless internalTrafficPolicy is Local too.
	fromHost atomic.Pointer[balancer]
	// udpSessions counts live UDP sessions across the port's sockets.
	udpSessions atomic.Int64
	// For Activity: TCP connections (or SCTP associations) proxied so far
	// and open now, and UDP sessions opened so far.
	connsProxied atomic.Uint64
	connsActive  atomic.Int64
	connsGaveUp  atomic.Uint64 // connections reset after every dial attempt failed
	udpOpened    atomic.Uint64
	capLog       logThrottle // datagrams the UDP session cap dropped
	giveUpLog    logThrottle // connections reset after every dial failed

	// sources maps each load-balancer IP whose loadBalancerSourceRanges
	// keep some sources out to the sources it admits; nil when none does.
	// Only sockets bound to a load-balancer IP check it.
	sources atomic.Pointer[map[netip.Addr][]netip.Prefix]
	// proxyProtocol is the state.ProxyProtocol new TCP connections send
	// their endpoint ahead of the client's data; always none on UDP and
	// SCTP ports.
	proxyProtocol atomic.Uint32

	spec      *state.ServicePort
	proxyPort uint16
	// extProxyPort takes redirected node-port, external-IP and
	// load-balancer traffic when a Local traffic policy gives it other
	// endpoints than cluster traffic; 0 when one proxy port serves all.
	extProxyPort uint16
	sockets      map[sockKey]socket
}

func newServicePort(p *Proxier, spec *state.ServicePort) *servicePort {
	sp := &servicePort{
		p:       p,
		name:    spec.Name,
		proto:   spec.Name.Protocol,
		sockets: make(map[sockKey]socket),
	}
	sp.internal = newBalancer(p.cfg.Clock, spec.InternalEndpoints(), spec.Affinity)
	sp.setExternal(spec)
	sp.describePools(spec)
	sp.setProxyProtocol(state.ProxyProtocolNone, spec.ProxyProtocol)
	sp.spec = spec
	return sp
}

// setProxyProtocol makes new connections send the PROXY protocol header
// of version v (old is the one asked for before). Only TCP connections
// send one: a UDP or SCTP port says so once, when asked for one.
func (sp *servicePort) setProxyProtocol(old, v state.ProxyProtocol) {
	if sp.proto != state.TCP && v != state.ProxyProtocolNone {
		if old == state.ProxyProtocolNone {
			klog.InfoS("The PROXY protocol is sent on TCP ports only; this port is served without it", "service", sp.name, "proxyProtocol", v)
		}
		v = state.ProxyProtocolNone
	}
	sp.proxyProtocol.Store(uint32(v))
}

func (sp *servicePort) setExternal(spec *state.ServicePort) {
	sp.external.Store(sp.separate(sp.external.Load(), spec.InternalLocal != spec.ExternalLocal, spec.ExternalEndpoints(), spec))
	if !spec.ExternalLocal {
		sp.fromHost.Store(nil)
		return
	}
	sp.fromHost.Store(sp.separate(sp.fromHost.Load(), spec.InternalLocal, spec.ClusterEndpoints, spec))
}

// separate returns, when own, a balancer of its own over eps (b, updated,
// when b is one already); else the internal balancer.
func (sp *servicePort) separate(b *balancer, own bool, eps []state.Endpoint, spec *state.ServicePort) *balancer {
	switch {
	case !own:
		return sp.internal
	case b != nil && b != sp.internal:
		b.update(eps, spec.Affinity)
		return b
	}
	return newBalancer(sp.p.cfg.Clock, eps, spec.Affinity)
}

// update swaps in a new spec: endpoints, affinity and the PROXY protocol
// header take effect for the next connection.
func (sp *servicePort) update(spec *state.ServicePort) {
	old := sp.spec
	internal := spec.InternalEndpoints()
	before := old.InternalEndpoints()
	if !slices.EqualFunc(before, internal, func(a, b state.Endpoint) bool { return a.Addr == b.Addr }) {
		sp.logEndpoints(spec, before, internal)
	}
	// Node-port and external traffic uses this node's endpoints only. When
	// the port has no endpoint anywhere, the line above said so for all its
	// traffic.
	if spec.ExternalLocal && spec.ExternalLocal != spec.InternalLocal && (spec.HasEndpoints() || len(before) == 0) {
		sp.sayOutage(old.ExternalEndpoints(), spec.ExternalEndpoints(),
			"Service port has no endpoints on this node now; its external traffic (externalTrafficPolicy: Local) "+sp.fromOutside(),
			"Service port has endpoints on this node now, for its external traffic")
	}
	sp.internal.update(internal, spec.Affinity)
	sp.setExternal(spec)
	sp.describePools(spec)
	if spec.ProxyProtocol != old.ProxyProtocol {
		sp.setProxyProtocol(old.ProxyProtocol, spec.ProxyProtocol)
		if sp.proto == state.TCP {
			klog.V(2).InfoS("PROXY protocol header for new connections changed", "service", sp.name, "proxyProtocol", spec.ProxyProtocol)
		}
	}
	sp.spec = spec
	if sp.proto == state.UDP && (!slices.Equal(old.ClusterEndpoints, spec.ClusterEndpoints) || !slices.Equal(old.LocalEndpoints, spec.LocalEndpoints) ||
		!slices.Equal(old.ServingEndpoints, spec.ServingEndpoints)) {
		// A UDP session has no end the client shows us: one to an endpoint
		// that is gone would carry on into the void until it idles out.
		// End it, so the client's next datagram picks a live endpoint (what
		// conntrack cleanup does for the kernel proxies). As there, only
		// an endpoint that is gone or no longer serving ends its sessions:
		// one that is terminating but still serving drains them (KEP-1669),
		// and readiness, topology or traffic policies move new sessions
		// only.
		serving := servingSet(spec)
		for _, s := range sp.sockets {
			if u, ok := s.(interface {
				dropStale(serving func(netip.AddrPort) bool) int
			}); ok {
				if n := u.dropStale(serving); n > 0 {
					klog.V(2).InfoS("Ended UDP sessions to endpoints removed or no longer serving", "service", sp.name, "sessions", n)
				}
			}
		}
	}
}

// servingSet reports whether an endpoint of spec is serving (see
// state.ServicePort.ServingEndpoints): its sessions may go on.
func servingSet(spec *state.ServicePort) func(netip.AddrPort) bool {
	set := make(map[netip.AddrPort]bool, len(spec.ServingEndpoints)+len(spec.ClusterEndpoints))
	for _, a := range spec.ServingEndpoints {
		set[a] = true
	}
	for _, eps := range [][]state.Endpoint{spec.ClusterEndpoints, spec.LocalEndpoints} {
		for _, e := range eps {
			set[e.Addr] = true
		}
	}
	return func(a netip.AddrPort) bool { return set[a] }
}

// logEndpoints says how the endpoints that new connections use changed: at
// -v=2 each change, and at every verbosity when the last one goes (an
// outage should not be silent), saying what becomes of new connections
// (see turnedAway), or the first one comes back.
func (sp *servicePort) logEndpoints(spec *state.ServicePort, before, after []state.Endpoint) {
	gone := "Service port has no endpoints now; " + sp.turnedAway(false)
	if spec.HasEndpoints() { // only on other nodes
		gone = "Service port has no endpoints on this node now; its internal traffic (internalTrafficPolicy: Local): " + sp.turnedAway(true)
	}
	sp.sayOutage(before, after, gone, "Service port has endpoints now")
	if klog.V(2).Enabled() {
		const shown = 10
		addrs := make([]string, 0, min(len(after), shown+1))
		for _, e := range after[:min(len(after), shown)] {
			addrs = append(addrs, e.Addr.String())
		}
		if len(after) > shown {
			addrs = append(addrs, fmt.Sprintf("and %d more", len(after)-shown))
		}
		klog.InfoS("Endpoints changed", "service", sp.name, "endpoints", addrs)
	}
}

// turnedAway says what becomes of the port's new connections that have no
// endpoint to go to (see TurnedAway).
func (sp *servicePort) turnedAway(elsewhere bool) string {
	return TurnedAway(sp.proto, sp.p.cfg.PortalRefuses, elsewhere)
}

// TurnedAway says what becomes of new connections (datagrams, associations)
// of protocol proto that have no endpoint to go to: with a portal that
// refuses them (Config.PortalRefuses), refused (REJECT) when the service
// port has no endpoint for them at all, or dropped (DROP) when it has some
// on other nodes only (elsewhere), as kube-proxy's rules do; else reset,
// aborted or dropped by the proxy. For the log and /debug/services.
func TurnedAway(proto state.Protocol, portalRefuses, elsewhere bool) string {
	what := "new connections are"
	switch proto {
	case state.UDP:
		what = "datagrams are"
	case state.SCTP:
		what = "new associations are"
	}
	switch {
	case portalRefuses && elsewhere:
		return what + " dropped (the portal's DROP rule), as kube-proxy drops them"
	case portalRefuses:
		return what + " refused (the portal's REJECT rule), as kube-proxy refuses them"
	case proto == state.UDP:
		return what + " dropped by the proxy"
	case proto == state.SCTP:
		return what + " aborted by the proxy"
	}
	return what + " reset by the proxy"
}

// fromOutside completes "its external traffic (externalTrafficPolicy:
// Local)" for a port with endpoints on other nodes only: what becomes of
// the external traffic from other hosts, and of that from this host and
// from pods, which goes to every endpoint.
func (sp *servicePort) fromOutside() string {
	s := "from other hosts: " + sp.turnedAway(true) + "; from this node"
	if len(sp.p.cfg.ClusterCIDRs) > 0 {
		s += " and from pods (--cluster-cidr)"
	}
	return s + " it goes to every endpoint"
}

// sayOutage logs, at every verbosity, when a set of endpoints empties
// (gone) or fills again (back).
func (sp *servicePort) sayOutage(before, after []state.Endpoint, gone, back string) {
	switch {
	case len(before) > 0 && len(after) == 0:
		klog.InfoS(gone, "service", sp.name)
	case len(before) == 0 && len(after) > 0:
		klog.InfoS(back, "service", sp.name, "endpoints", len(after))
	}
}

// admitUDP decides whether a datagram from client to frontend, through a
// socket on port, may open a new session, and picks its endpoint from the
// balancer of the socket's role (see chooseUDP). It reports false, and
// counts why, when the source is refused, the port's session cap is
// reached or it has no endpoint. On true the new
// session holds one place under the cap (udpSessions), taken here so that
// sockets read by different goroutines cannot together pass the cap; a
// session that then fails to open gives it back with releaseUDP, and one
// that opens gives it back when it ends.
func (sp *servicePort) admitUDP(role socketRole, frontend netip.Addr, port uint16, client netip.AddrPort) (*balancer, netip.AddrPort, bool) {
	p := sp.p
	if !sp.admits(role, frontend, client) {
		return nil, netip.AddrPort{}, false
	}
	n := sp.udpSessions.Add(1)
	if max := p.cfg.UDPMaxSessions; max > 0 && n > int64(max) {
		sp.releaseUDP()
		p.stats.UDPSessionsRejected.Add(1)
		sp.capReached(max)
		return nil, netip.AddrPort{}, false
	}
	b := sp.balancer(role, client.Addr())
	ep, why, err := sp.chooseUDP(b, port, client)
	if err != nil {
		sp.releaseUDP()
		p.stats.UDPNoEndpoints.Add(1)
		if klog.V(4).Enabled() {
			klog.InfoS("No endpoints; dropping datagram", "service", sp.name, "client", client)
		}
		return nil, netip.AddrPort{}, false
	}
	if klog.V(4).Enabled() {
		sp.explainPick(b, role, client, ep, why, 1)
	}
	return b, ep, true
}

// setSources builds the load-balancer IPs' source filter of spec;
// hostAddrs are this host's addresses (see state.ServicePort.SourceRanges).
func (sp *servicePort) setSources(spec *state.ServicePort, hostAddrs []netip.Addr) {
	var m map[netip.Addr][]netip.Prefix
	if len(spec.LoadBalancerSourceRanges) > 0 {
		for _, ip := range spec.LoadBalancerIPs {
			if ranges := spec.SourceRanges(ip, hostAddrs); ranges != nil {
				if m == nil {
					m = make(map[netip.Addr][]netip.Prefix)
				}
				m[ip.Unmap()] = ranges
			}
		}
	}
	if m == nil {
		sp.sources.Store(nil)
		return
	}
	sp.sources.Store(&m)
}

// rangesOf returns the sources the load-balancer IP frontend admits, or
// nil when it admits every source (or is no load-balancer IP).
func (sp *servicePort) rangesOf(frontend netip.Addr) []netip.Prefix {
	if m := sp.sources.Load(); m != nil {
		return (*m)[frontend.Unmap()]
	}
	return nil
}

// admits reports whether client may use the service through frontend, an
// address a socket of role r listens on: a load-balancer IP admits only the
// sources of its loadBalancerSourceRanges. Redirected traffic is filtered
// by the iptables portal instead, before it reaches a proxy port.
func (sp *servicePort) admits(r socketRole, frontend netip.Addr, client netip.AddrPort) bool {
	if r != roleExternalFrontend {
		return true
	}
	ranges := sp.rangesOf(frontend)
	if ranges == nil {
		return true
	}
	src := client.Addr().Unmap()
	if slices.ContainsFunc(ranges, func(p netip.Prefix) bool { return p.Contains(src) }) {
		return true
	}
	sp.p.stats.SourceRefused.Add(1)
	if klog.V(4).Enabled() {
		klog.InfoS("Source not in loadBalancerSourceRanges; refused", "service", sp.name, "client", client, "frontend", frontend)
	}
	return false
}

// connOpened and connClosed count a proxied connection or association of
// the port, and in active, the proxier's count of its protocol.
func (sp *servicePort) connOpened(active *atomic.Int64) {
	active.Add(1)
	sp.connsProxied.Add(1)
	sp.connsActive.Add(1)
}

func (sp *servicePort) connClosed(active *atomic.Int64) {
	active.Add(-1)
	sp.connsActive.Add(-1)
}

// sayAgainAfter is how long a service port waits before it says again that
// it is at its UDP session cap, or that every dial fails.
const sayAgainAfter = time.Minute

// capReached counts a datagram the session cap dropped, and logs it the
// first time and then at most once every sayAgainAfter, with the count of
// datagrams dropped since the last line.
func (sp *servicePort) capReached(max int) {
	if n, ok := sp.capLog.note(sayAgainAfter); ok {
		klog.InfoS("UDP session cap reached; datagrams from new clients are dropped (see --udp-max-sessions); said at most once a minute",
			"service", sp.name, "maxSessions", max, "droppedSinceLastSaid", n)
	}
}

// dialGaveUp says, at most once a minute, that connections are being
// reset because every dial failed: the -v=2 line for each is off by
// default, and an outage should not be silent.
func (sp *servicePort) dialGaveUp(err error) {
	sp.connsGaveUp.Add(1)
	if n, ok := sp.giveUpLog.note(sayAgainAfter); ok {
		klog.ErrorS(err, "Every dial attempt failed; connections are reset (each is logged at -v=2); said at most once a minute",
			"service", sp.name, "resetSinceLastSaid", n)
	}
}

// udpRefused handles an endpoint that refused a session with ICMP port
// unreachable: the client's affinity to it is forgotten, so its next
// datagram tries another endpoint, and new sessions pass over it for a
// moment, as TCP passes over an endpoint that refused a dial.
func (sp *servicePort) udpRefused(b *balancer, client, ep netip.AddrPort) {
	sp.p.stats.UDPRefused.Add(1)
	b.forget(client.Addr(), ep)
	b.penalize(ep, sp.p.cfg.EndpointPenalty)
	klog.V(3).InfoS("UDP endpoint refused a session; new sessions pass over it for a moment", "service", sp.name, "endpoint", ep, "client", client)
}

// releaseUDP gives back the place under the cap that admitUDP took.
func (sp *servicePort) releaseUDP() { sp.udpSessions.Add(-1) }

// udpDialFailed counts or logs a failed dial of a new session's endpoint
// and gives back the session's place under the cap.
func (sp *servicePort) udpDialFailed(ep netip.AddrPort, err error) {
	if isResourceExhausted(err) {
		sp.p.stats.Shed.Add(1)
		sp.p.shed.log(err, sp.name.String())
	} else {
		klog.V(2).InfoS("UDP dial failed", "service", sp.name, "endpoint", ep, "err", err)
	}
	sp.releaseUDP()
}

// sweep drops expired affinity entries.
func (sp *servicePort) sweep() {
	sp.internal.sweep()
	for _, b := range []*balancer{sp.external.Load(), sp.fromHost.Load()} {
		if b != nil && b != sp.internal {
			b.sweep()
		}
	}
}

// balancer is the balancer for a connection or session from client on a
// socket of role r.
func (sp *servicePort) balancer(r socketRole, client netip.Addr) *balancer {
	if !r.external() {
		return sp.internal
	}
	if fh := sp.fromHost.Load(); fh != nil && (sp.p.isHostAddr(client) || sp.p.isPod(client)) {
		return fh
	}
	return sp.external.Load()
}

// wanted is every socket the service port should have: its proxy ports on
// the addresses of its families, and extra.
func (sp *servicePort) wanted(extra []sockKey) map[sockKey]bool {
	want := make(map[sockKey]bool, len(extra)+2)
	if !sp.p.cfg.DisableProxyPorts {
		// The families served can change with the frontends; every family
		// uses the same proxy port.
		for _, a := range sp.p.proxyPortAddrs(sp.spec) {
			if sp.proxyPort != 0 {
				want[sockKey{netip.AddrPortFrom(a, sp.proxyPort), roleProxyPort}] = true
			}
			if sp.extProxyPort != 0 {
				want[sockKey{netip.AddrPortFrom(a, sp.extProxyPort), roleExternalProxyPort}] = true
			}
		}
	}
	for _, k := range extra {
		want[k] = true
	}
	return want
}

// prune closes the sockets the service port no longer wants. A proxy port
// that a Service now has as its node port (or health-check node port) is
// given up, and reconcile opens another: the node port is what the Service
// asks for.
func (sp *servicePort) prune(extra []sockKey) {
	for _, port := range []*uint16{&sp.proxyPort, &sp.extProxyPort} {
		if *port != 0 && sp.p.ports.isReserved(*port) {
			klog.InfoS("Moving a proxy port: a Service has it as its node port", "service", sp.name, "proxyPort", *port)
			sp.giveUp(port)
		}
	}
	if sp.extProxyPort != 0 && !sp.separateExternal() {
		sp.giveUp(&sp.extProxyPort)
	}
	want := sp.wanted(extra)
	for k := range sp.sockets {
		if !want[k] {
			sp.release(k)
		}
	}
}

// separateExternal reports whether external traffic needs a proxy port of
// its own: the Service has a node port, external IPs or load-balancer IPs,
// and a Local traffic policy gives them other endpoints than internal
// traffic. With both policies Local the endpoints are the same, except
// for external traffic from this node or a pod, which goes to every
// endpoint: that exception needs the port too. A ClusterIP Service has no
// external traffic, so internalTrafficPolicy: Local alone opens no second
// port (one that balanced over every endpoint would get round the policy
// with --portal=none).
func (sp *servicePort) separateExternal() bool {
	spec := sp.spec
	external := spec.NodePort != 0 || len(spec.ExternalIPs) > 0 || len(spec.LoadBalancerIPs) > 0
	return external && (spec.InternalLocal || spec.ExternalLocal)
}

// reconcile closes unwanted sockets and opens missing ones. The proxy-port
// sockets are opened once and kept for the service port's lifetime (unless
// their port becomes a node port).
func (sp *servicePort) reconcile(extra []sockKey) error {
	sp.prune(extra)
	var errs *multierror.Error
	if !sp.p.cfg.DisableProxyPorts {
		roles := []socketRole{roleProxyPort}
		ports := []*uint16{&sp.proxyPort}
		if sp.separateExternal() {
			roles, ports = append(roles, roleExternalProxyPort), append(ports, &sp.extProxyPort)
		}
		served := sp.proxyPort != 0 // external traffic too, until now if it gets a port of its own
		for i, role := range roles {
			opened := *ports[i] == 0
			err := sp.ensureProxyPort(role, ports[i])
			if err == nil {
				err = sp.extendProxyPort(role, ports[i])
			}
			if opened && *ports[i] != 0 && role == roleExternalProxyPort && served {
				sp.externalMoved()
			}
			var held errPortHeld
			if errors.As(err, &held) {
				// Not a failure: the port comes free at this sync.
				sp.p.waiting = true
				klog.V(2).InfoS("Waiting for the portal to stop redirecting a proxy port to another service port before taking it", "service", sp.name, "role", role, "proxyPort", held.port, "heldFor", held.owner)
				continue
			}
			if err != nil {
				errs = multierror.Append(errs, err)
			}
		}
	}
	for k := range sp.wanted(extra) {
		if _, ok := sp.sockets[k]; ok {
			continue
		}
		s, err := sp.listen(k)
		if err != nil {
			errs = multierror.Append(errs, portErrorf(sp.name, "listen on %s (%s): %w", k.addr, k.role, err))
			continue
		}
		klog.V(3).InfoS("Listening", "service", sp.name, "addr", k.addr, "role", k.role)
		sp.sockets[k] = s
	}
	sp.filterSockets()
	return errs.ErrorOrNil()
}

// externalMoved remembers the endpoints of the UDP sessions on the proxy
// port, whose external clients the portal is to move to the external
// proxy port just opened, now and again once the portal has synced (see
// movedSessions). Sessions of cluster clients are remembered too, as the
// proxy port cannot tell them apart; they stay on the proxy port, where
// what it remembers is not used.
func (sp *servicePort) externalMoved() {
	p := sp.p
	if sp.proto != state.UDP || !p.cfg.HoldReleasedPorts {
		return
	}
	sp.rememberSessions(roleProxyPort)
	if p.externalMoved == nil {
		p.externalMoved = make(map[*servicePort]bool)
	}
	p.externalMoved[sp] = true
}

// rememberSessions remembers the endpoints of the UDP sessions on the
// sockets of role (see movedSessions).
func (sp *servicePort) rememberSessions(role socketRole) {
	for k, s := range sp.sockets {
		if k.role == role {
			sp.p.rememberSessions(sp, s, k.addr.Port())
		}
	}
}

// filterSockets gives each socket bound to a load-balancer IP the kernel
// filter of its source ranges, where the build has one. Without one, or if
// it cannot be set, admits refuses those sources instead.
func (sp *servicePort) filterSockets() {
	for k, s := range sp.sockets {
		f, ok := s.(sourceFilterer)
		if !ok || k.role != roleExternalFrontend {
			continue
		}
		if err := f.filterSources(sp.rangesOf(k.addr.Addr())); err != nil {
			klog.ErrorS(err, "Cannot have the kernel drop the traffic of sources outside loadBalancerSourceRanges; the proxy refuses it itself (a TCP client is reset, a datagram dropped)",
				"service", sp.name, "addr", k.addr)
		}
	}
}

func (sp *servicePort) listen(k sockKey) (socket, error) {
	switch sp.proto {
	case state.TCP:
		return listenTCP(sp, k)
	case state.UDP:
		return listenUDP(sp, k)
	case state.SCTP:
		return listenSCTP(sp, k)
	}
	return nil, fmt.Errorf("protocol %s is not supported", sp.proto)
}

// close stops every socket of the service port, empties its balancers and
// returns its proxy port. The proxy-port sockets the portal may still
// redirect to serve on until it no longer does (see release), with the
// endpoints they had: the portal's rules, like kube-proxy's until its
// iptables-restore, still send the Service's clients there (a renamed
// port's clients among them, whose new service port waits for the rules).
// The balancers empty when those sockets close.
func (sp *servicePort) close() {
	deferred := false
	for k := range sp.sockets {
		deferred = sp.release(k) || deferred
	}
	if deferred {
		sp.p.deleted = append(sp.p.deleted, sp)
	} else {
		sp.drain()
	}
	for _, port := range []*uint16{&sp.proxyPort, &sp.extProxyPort} {
		if *port != 0 {
			sp.giveUp(port)
		}
	}
}

// drain empties the balancers of a service port that is gone: its
// connections still dialing make no further attempt, as when the
// endpoints go: those already connecting keep their time (see
// tcpConn.keepRacing), and with none the client is reset.
func (sp *servicePort) drain() {
	for _, b := range []*balancer{sp.internal, sp.external.Load(), sp.fromHost.Load()} {
		if b != nil {
			b.update(nil, *b.aff.Load())
		}
	}
}
