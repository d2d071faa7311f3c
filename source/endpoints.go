package source

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// endpointInfo is an endpoint with the topology hints it carries.
type endpointInfo struct {
	state.Endpoint
	zoneHints []string
	nodeHints []string
}

// target is one service port a slice port feeds, with the port number the
// endpoints listen on.
type target struct {
	index int // into the ports slice
	port  uint16
}

// attachEndpoints fills ClusterEndpoints and LocalEndpoints of ports from
// the EndpointSlices of their Services (pkg/proxy/endpointslicecache.go and
// topology.go in kube-proxy).
func (b *builder) attachEndpoints(ports []state.ServicePort, bySvc map[objectRef][]int, all []*discoveryv1.EndpointSlice) {
	sorted := make([]*discoveryv1.EndpointSlice, 0, len(all))
	for _, s := range all {
		if s != nil {
			sorted = append(sorted, s)
		}
	}
	// A fixed order makes "the first" of duplicate endpoints well defined.
	slices.SortStableFunc(sorted, func(a, c *discoveryv1.EndpointSlice) int {
		return objectRef{a.Namespace, a.Name}.compare(objectRef{c.Namespace, c.Name})
	})

	captured := b.capturedBy(ports)
	sets := make([]map[netip.AddrPort]endpointInfo, len(ports))
	for _, s := range sorted {
		ref := objectRef{s.Namespace, s.Name}
		svcName := s.Labels[discoveryv1.LabelServiceName]
		if svcName == "" {
			b.report("EndpointSlice", ref, "metadata.labels",
				fmt.Errorf("no %s label, so it belongs to no Service; ignored", discoveryv1.LabelServiceName))
			continue
		}
		indexes := bySvc[objectRef{s.Namespace, svcName}]
		if len(indexes) == 0 {
			continue // the Service is absent or not served
		}
		fam := state.IPv4
		switch s.AddressType {
		case discoveryv1.AddressTypeIPv4:
		case discoveryv1.AddressTypeIPv6:
			fam = state.IPv6
		case discoveryv1.AddressTypeFQDN:
			continue // kube-proxy ignores FQDN slices
		default:
			b.report("EndpointSlice", ref, "addressType", fmt.Errorf("unknown address type %q; ignored", s.AddressType))
			continue
		}
		// kube-proxy runs a proxier per family, and each reads the slices
		// of its own: an IPv6 slice of an IPv4-only Service is not used.
		if !servesFamily(&ports[indexes[0]], fam) {
			b.report("EndpointSlice", ref, "addressType", fmt.Errorf("%s is not an IP family of Service %s/%s; ignored, as kube-proxy does", fam, s.Namespace, svcName))
			continue
		}
		targets := b.targets(s, ref, ports, indexes)
		if len(targets) == 0 {
			continue
		}
		for i := range s.Endpoints {
			info, ok := b.endpoint(s, ref, i)
			if !ok {
				continue
			}
			for _, t := range targets {
				if sets[t.index] == nil {
					// Sized for this slice: most ports have one.
					sets[t.index] = make(map[netip.AddrPort]endpointInfo, len(s.Endpoints))
				}
				info.Addr = netip.AddrPortFrom(info.Addr.Addr(), t.port)
				if why := captured(ports[t.index].Name, info.Addr); why != "" {
					// A connection to it would be captured again, and
					// loop through the proxy until descriptors run out
					// (kube-proxy translates a connection once).
					b.report("EndpointSlice", ref, fmt.Sprintf("endpoints[%d].addresses[0]", i),
						fmt.Errorf("%s is %s; the proxy would capture its own connection to it; ignored", info.Addr, why))
					continue
				}
				// The same address may appear in two slices while a pod
				// moves between them, or while a new pod reuses the IP of
				// a terminating one: keep the first unless the newcomer is
				// the one not terminating or, both alike, the one on this
				// node (kube-proxy favours a local copy).
				if cur, dup := sets[t.index][info.Addr]; !dup || cur.Terminating && !info.Terminating ||
					cur.Terminating == info.Terminating && info.Local && !cur.Local {
					sets[t.index][info.Addr] = info
				}
			}
		}
	}

	for i := range ports {
		eps := make([]endpointInfo, 0, len(sets[i]))
		for _, e := range sets[i] {
			eps = append(eps, e)
		}
		sets[i] = nil // done with: the snapshot's ports grow as the sets go
		slices.SortFunc(eps, func(a, c endpointInfo) int { return a.Addr.Compare(c.Addr) })
		// kube-proxy runs a proxier per family, and each picks from its
		// own family's endpoints: readiness fallback and hints are
		// decided per family.
		v4 := filter(eps, func(e *endpointInfo) bool { return e.Addr.Addr().Is4() })
		v6 := filter(eps, func(e *endpointInfo) bool { return !e.Addr.Addr().Is4() })
		cluster4, why4 := b.clusterEndpoints(v4)
		cluster6, why6 := b.clusterEndpoints(v6)
		ports[i].ClusterEndpoints = joinFamilies(cluster4, cluster6)
		if usesClusterEndpoints(&ports[i]) {
			ports[i].TopologyHintsIgnored = joinReasons(why4, why6, len(v4) > 0 && len(v6) > 0)
		}
		ports[i].LocalEndpoints = joinFamilies(localEndpoints(v4), localEndpoints(v6))
		ports[i].ServingEndpoints = servingEndpoints(eps)
	}
}

// frontKey is a protocol and an address and port a connection can be made
// to.
type frontKey struct {
	proto state.Protocol
	addr  netip.AddrPort
}

// frontIndex is what of the proxy's own can capture a connection: the
// frontends of service ports (cluster, external and load-balancer IPs and
// ports), and their node ports (the address 0.0.0.0 or :: standing for
// the family they are served in), each with its owner.
type frontIndex struct {
	fronts    map[frontKey]state.ServicePortName
	nodePorts map[frontKey]state.ServicePortName
}

func newFrontIndex() *frontIndex {
	return &frontIndex{fronts: make(map[frontKey]state.ServicePortName), nodePorts: make(map[frontKey]state.ServicePortName)}
}

// add indexes the frontends and node ports of sp.
func (x *frontIndex) add(sp *state.ServicePort) {
	for _, f := range sp.Frontends() {
		x.fronts[frontKey{sp.Name.Protocol, netip.AddrPortFrom(f.Addr().Unmap(), f.Port())}] = sp.Name
	}
	if sp.NodePort == 0 {
		return
	}
	v4, v6 := sp.Families()
	if v4 || !v6 { // a node port with no frontend family is served on IPv4
		x.nodePorts[frontKey{sp.Name.Protocol, netip.AddrPortFrom(netip.IPv4Unspecified(), sp.NodePort)}] = sp.Name
	}
	if v6 {
		x.nodePorts[frontKey{sp.Name.Protocol, netip.AddrPortFrom(netip.IPv6Unspecified(), sp.NodePort)}] = sp.Name
	}
}

// lookup returns the owner of the frontend at k, or of the node port k
// would reach on an address of this host, and which of the two it is.
func (x *frontIndex) lookup(k frontKey) (owner state.ServicePortName, nodePort, ok bool) {
	if x == nil {
		return owner, false, false
	}
	if owner, ok = x.fronts[k]; ok {
		return owner, false, true
	}
	owner, ok = x.nodePorts[frontKey{k.proto, netip.AddrPortFrom(familyAny(k.addr.Addr()), k.addr.Port())}]
	return owner, ok, ok
}

// familyAny is the unspecified address of a's family.
func familyAny(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

// changed returns the keys whose owner differs between x and y (either may
// be nil): frontends and node ports that came, went or changed hands.
func (x *frontIndex) changed(y *frontIndex) *frontIndex {
	out := newFrontIndex()
	diff := func(dst, a, b map[frontKey]state.ServicePortName) {
		for k, o := range a {
			if p, ok := b[k]; !ok || p != o {
				dst[k] = o
			}
		}
	}
	var xf, xn, yf, yn map[frontKey]state.ServicePortName
	if x != nil {
		xf, xn = x.fronts, x.nodePorts
	}
	if y != nil {
		yf, yn = y.fronts, y.nodePorts
	}
	diff(out.fronts, xf, yf)
	diff(out.fronts, yf, xf)
	diff(out.nodePorts, xn, yn)
	diff(out.nodePorts, yn, xn)
	return out
}

func (x *frontIndex) empty() bool { return len(x.fronts) == 0 && len(x.nodePorts) == 0 }

// capturedBy returns a function that says, for an endpoint of service
// port name, what of the proxy's own would capture a connection to it: a
// Service's frontend (cluster, external or load-balancer IP and port), or
// a node port on an address of this host; "" if nothing would. It looks
// at ports and, when the caller builds one Service at a time (the
// informer source), at every other Service's (Options.others).
func (b *builder) capturedBy(ports []state.ServicePort) func(name state.ServicePortName, ep netip.AddrPort) string {
	own := newFrontIndex()
	for i := range ports {
		own.add(&ports[i])
	}
	var host map[netip.Addr]bool // read on first need
	return func(name state.ServicePortName, ep netip.AddrPort) string {
		k := frontKey{name.Protocol, netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port())}
		owner, nodePort, ok := own.lookup(k)
		if !ok || nodePort {
			// A frontend of another Service comes before a node port.
			if o, np, found := b.opts.others.lookup(k); found && (!np || !ok) {
				owner, nodePort, ok = o, np, true
			}
		}
		if !ok {
			return ""
		}
		if !nodePort {
			if owner == name {
				return "Service " + owner.String() + "'s own frontend"
			}
			return "Service " + owner.String() + "'s frontend"
		}
		ep = k.addr
		if b.opts.HostAddrs == nil {
			return ""
		}
		if !state.InNodePortCIDRs(b.opts.NodePortAddresses, ep.Addr()) {
			return "" // node ports are not served there
		}
		if host == nil {
			host = make(map[netip.Addr]bool)
			addrs, err := b.opts.HostAddrs()
			if err != nil {
				return "" // cannot tell: keep it
			}
			for _, a := range addrs {
				host[a.Unmap()] = true
			}
		}
		if host[ep.Addr()] || ep.Addr().Is4() && ep.Addr().IsLoopback() { // all of 127/8 is this host's
			return fmt.Sprintf("an address of this host with Service %s's node port", owner)
		}
		return ""
	}
}

// servesFamily reports whether sp is served in IP family fam (see
// ServicePort.Families). A Service that states neither ipFamilies nor a
// cluster IP (a manifest may leave both out) takes endpoints of either
// family.
func servesFamily(sp *state.ServicePort, fam state.IPFamily) bool {
	if len(sp.IPFamilies) == 0 && len(sp.ClusterIPs) == 0 {
		return true
	}
	v4, v6 := sp.Families()
	return fam == state.IPv4 && v4 || fam == state.IPv6 && v6
}

// targets matches the ports of slice s to the service ports of its Service
// by name and protocol. Ports with a nil name, or a nil or zero number (the
// API's "all ports", which no proxy can serve), are skipped and reported,
// as kube-proxy skips them and logs "Ignoring invalid endpoint port"; an
// unnamed port has the name "".
func (b *builder) targets(s *discoveryv1.EndpointSlice, ref objectRef, ports []state.ServicePort, indexes []int) []target {
	var out []target
	seen := make(map[state.ServicePortName]bool, len(s.Ports))
	for i, p := range s.Ports {
		path := fmt.Sprintf("ports[%d]", i)
		switch {
		case p.Name == nil:
			// The API server defaults it to "": only an object written
			// around it (straight into etcd) lacks one.
			b.report("EndpointSlice", ref, path+".name", errors.New("not set: the port is skipped, as kube-proxy skips it"))
			continue
		case p.Port == nil:
			// The text of the manifest check of the same (validate.go), so
			// that a manifest says it once.
			b.report("EndpointSlice", ref, path+".port", errors.New("not set: the port is skipped, as kube-proxy skips it"))
			continue
		case *p.Port == 0:
			b.report("EndpointSlice", ref, path+".port", errors.New("0 (all ports): the port is skipped, as kube-proxy skips it"))
			continue
		}
		if *p.Port < 0 || *p.Port > 65535 {
			b.report("EndpointSlice", ref, path+".port", fmt.Errorf("%d is out of range 1-65535", *p.Port))
			continue
		}
		proto := state.TCP
		if p.Protocol != nil {
			var err error
			if proto, err = protocol(string(*p.Protocol)); err != nil {
				b.report("EndpointSlice", ref, path+".protocol", err)
				continue
			}
		}
		matched := false
		for _, idx := range indexes {
			name := ports[idx].Name
			if name.Port != *p.Name || name.Protocol != proto {
				continue
			}
			matched = true
			if seen[name] {
				b.report("EndpointSlice", ref, path, fmt.Errorf("duplicate port %q/%s; the first one is used", *p.Name, proto))
				break
			}
			seen[name] = true
			out = append(out, target{index: idx, port: uint16(*p.Port)})
		}
		if !matched {
			// As in kube-proxy, the slice port feeds nothing; say so,
			// as the manifest checks do. A port of the Service that is
			// not served was reported with the Service.
			svc := objectRef{s.Namespace, s.Labels[discoveryv1.LabelServiceName]}
			if field, err := portMismatch(b.specPorts[svc], *p.Name, corev1.Protocol(proto), svc.namespace, svc.name); err != nil {
				b.report("EndpointSlice", ref, path+field, err)
			}
		}
	}
	return out
}

// endpoint reads endpoint i of slice s: its first address, checked and
// normalised, its conditions with the API's nil defaults, and its hints.
func (b *builder) endpoint(s *discoveryv1.EndpointSlice, ref objectRef, i int) (endpointInfo, bool) {
	ep := &s.Endpoints[i]
	path := fmt.Sprintf("endpoints[%d].addresses", i)
	if len(ep.Addresses) == 0 {
		b.report("EndpointSlice", ref, path, errors.New("no address; endpoint ignored"))
		return endpointInfo{}, false
	}
	path += "[0]"
	ip, err := parseIP(ep.Addresses[0])
	if err != nil {
		b.report("EndpointSlice", ref, path, err)
		return endpointInfo{}, false
	}
	// Families as the API server tells them (k8s.io/utils/net.IsIPv4String,
	// IsIPv6String): an IPv4-mapped address is IPv4, which an IPv4 slice
	// stored before 1.36 (StrictIPCIDRValidation) may hold, and no IPv6
	// slice may.
	switch {
	case s.AddressType == discoveryv1.AddressTypeIPv6 && ip.Is4In6():
		b.report("EndpointSlice", ref, path, fmt.Errorf("%s is an IPv4-mapped address, not an IPv6 address; endpoint ignored", ip))
		return endpointInfo{}, false
	case s.AddressType == discoveryv1.AddressTypeIPv4 && !ip.Unmap().Is4() || s.AddressType == discoveryv1.AddressTypeIPv6 && !ip.Is6():
		b.report("EndpointSlice", ref, path, fmt.Errorf("%s is not an %s address", ip, s.AddressType))
		return endpointInfo{}, false
	}
	ip = ip.Unmap()
	if err := checkAddr(ip, b.opts.AllowLoopback); err != nil {
		b.report("EndpointSlice", ref, path, err)
		return endpointInfo{}, false
	}

	c := ep.Conditions
	info := endpointInfo{Endpoint: state.Endpoint{
		Addr:        netip.AddrPortFrom(ip, 0),
		Ready:       c.Ready == nil || *c.Ready,
		Serving:     c.Serving == nil || *c.Serving,
		Terminating: c.Terminating != nil && *c.Terminating,
	}}
	if ep.NodeName != nil {
		info.NodeName = *ep.NodeName
		info.Local = info.NodeName != "" && info.NodeName == b.opts.NodeName
	}
	if h := ep.Hints; h != nil {
		for _, z := range h.ForZones {
			info.zoneHints = append(info.zoneHints, z.Name)
		}
		for _, n := range h.ForNodes {
			info.nodeHints = append(info.nodeHints, n.Name)
		}
	}
	return info, true
}

// clusterEndpoints picks the endpoints for cluster-wide traffic: the ready
// ones allowed by topology hints, or, when none is ready, every one that is
// serving and terminating, so that connections still succeed while a
// Deployment rolls (KEP-1669). It also says why hints the ready endpoints
// carry are ignored, as kube-proxy logs it (pkg/proxy/topology.go); ""
// when none are, or none were given.
func (b *builder) clusterEndpoints(eps []endpointInfo) ([]state.Endpoint, string) {
	ready := filter(eps, func(e *endpointInfo) bool { return e.Ready })
	if len(ready) == 0 {
		return endpoints(filter(eps, func(e *endpointInfo) bool { return e.Serving && e.Terminating })), ""
	}
	// Hints are all or nothing: a single ready endpoint without one means
	// the EndpointSlice controller is not (or not yet) hinting this
	// Service, and honouring part of them would overload some endpoints.
	// Node hints come first; zone hints are the fallback.
	var hint string
	var ignored []string
	node := b.opts.NodeName
	why := unusableHints(ready, "node", node, "this proxy has no node name", func(e *endpointInfo) []string { return e.nodeHints })
	if why == "" {
		ready, hint = filter(ready, func(e *endpointInfo) bool { return slices.Contains(e.nodeHints, node) }), "node "+node
	} else {
		if why != noHints {
			ignored = append(ignored, why)
		}
		noZone := "this node's zone is not known (no " + corev1.LabelTopologyZone + " label on its Node; with --manifests there is no Node, so zone hints never apply there, node hints do)"
		why = unusableHints(ready, "zone", b.zone, noZone, func(e *endpointInfo) []string { return e.zoneHints })
		switch why {
		case "":
			ready, hint = filter(ready, func(e *endpointInfo) bool { return slices.Contains(e.zoneHints, b.zone) }), "zone "+b.zone
		case noHints:
		default:
			ignored = append(ignored, why)
		}
	}
	out := endpoints(ready)
	for i := range out {
		out[i].Topology = hint
	}
	return out, strings.Join(ignored, "; ")
}

// noHints is what unusableHints says of endpoints that carry no hint of
// the kind asked: there is nothing to ignore.
const noHints = "-"

// unusableHints says why the hints of one kind ("node" or "zone") that
// eps carry cannot narrow them to those hinted for want: "" when they
// can, which is when every endpoint carries such a hint and at least one
// names want; noHints when none carries one. noWant says why want is
// empty.
func unusableHints(eps []endpointInfo, kind, want, noWant string, hints func(*endpointInfo) []string) string {
	with, found := 0, false
	for i := range eps {
		if h := hints(&eps[i]); len(h) > 0 {
			with++
			found = found || want != "" && slices.Contains(h, want)
		}
	}
	switch {
	case with == 0:
		return noHints
	case with < len(eps):
		return fmt.Sprintf("%s hints ignored: only %d of %d ready endpoints carry one", kind, with, len(eps))
	case want == "":
		return kind + " hints ignored: " + noWant
	case !found:
		return fmt.Sprintf("%s hints ignored: none is for %s %s", kind, kind, want)
	}
	return ""
}

// usesClusterEndpoints reports whether sp sends any traffic to its
// ClusterEndpoints (kube-proxy's UsesClusterEndpoints): its cluster IP's
// under internalTrafficPolicy: Cluster, and, when it is reachable from
// outside, node-port and external traffic from this node and pods.
func usesClusterEndpoints(sp *state.ServicePort) bool {
	return !sp.InternalLocal || sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// joinReasons joins why the hints of a port's IPv4 and IPv6 endpoints
// are ignored, naming the family when the port has endpoints of both and
// the two differ.
func joinReasons(v4, v6 string, dual bool) string {
	if v4 == v6 || !dual {
		return cmp.Or(v4, v6)
	}
	var out []string
	if v4 != "" {
		out = append(out, "IPv4 "+v4)
	}
	if v6 != "" {
		out = append(out, "IPv6 "+v6)
	}
	return strings.Join(out, "; ")
}

// localEndpoints picks this node's ready endpoints, or, when none is ready,
// its serving and terminating ones.
func localEndpoints(eps []endpointInfo) []state.Endpoint {
	local := filter(eps, func(e *endpointInfo) bool { return e.Local })
	if ready := filter(local, func(e *endpointInfo) bool { return e.Ready }); len(ready) > 0 {
		return endpoints(ready)
	}
	return endpoints(filter(local, func(e *endpointInfo) bool { return e.Serving && e.Terminating }))
}

// servingEndpoints lists the addresses of every endpoint that is serving,
// ready or terminating, whatever its node or hints (see
// state.ServicePort.ServingEndpoints); nil when none is.
func servingEndpoints(eps []endpointInfo) []netip.AddrPort {
	var out []netip.AddrPort
	for _, e := range eps {
		if e.Ready || e.Serving {
			out = append(out, e.Addr)
		}
	}
	return out
}

func filter(eps []endpointInfo, keep func(*endpointInfo) bool) []endpointInfo {
	n := 0
	for i := range eps {
		if keep(&eps[i]) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]endpointInfo, 0, n) // not grown: a port may have thousands
	for i := range eps {
		if keep(&eps[i]) {
			out = append(out, eps[i])
		}
	}
	return out
}

// joinFamilies returns the endpoints of both families, IPv4 first; nil
// when there are none.
func joinFamilies(v4, v6 []state.Endpoint) []state.Endpoint {
	if len(v6) == 0 {
		return v4
	}
	return append(v4, v6...)
}

// endpoints strips the hints; nil when there are none.
func endpoints(eps []endpointInfo) []state.Endpoint {
	if len(eps) == 0 {
		return nil
	}
	out := make([]state.Endpoint, len(eps))
	for i := range eps {
		out[i] = eps[i].Endpoint
	}
	return out
}
