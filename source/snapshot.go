package source

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// LabelServiceProxyName marks a Service that a proxy other than the default
// one serves. kube-proxy defines it in pkg/proxy/apis; k8s.io/api does not.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// AnnotationProxyProtocol asks the proxy to send a Service's endpoints the
// PROXY protocol header ahead of every TCP connection, to tell them the
// client's address: "v1" for the text header, "v2" for the binary one.
// It is this proxy's own: kube-proxy knows nothing of it. Without it no
// header is sent.
const AnnotationProxyProtocol = "kube-userspace-proxy.io/proxy-protocol"

// proxyProtocolField is where AnnotationProxyProtocol is, as problems
// name it.
const proxyProtocolField = "metadata.annotations[" + AnnotationProxyProtocol + "]"

// proxyProtocol reads AnnotationProxyProtocol: none when it is absent, an
// error when its value is neither v1 nor v2.
func proxyProtocol(svc *corev1.Service) (state.ProxyProtocol, error) {
	v, ok := svc.Annotations[AnnotationProxyProtocol]
	switch {
	case !ok:
		return state.ProxyProtocolNone, nil
	case v == "v1":
		return state.ProxyProtocolV1, nil
	case v == "v2":
		return state.ProxyProtocolV2, nil
	}
	return state.ProxyProtocolNone, fmt.Errorf("unknown PROXY protocol version %q (want v1 or v2)", v)
}

// maxAffinitySeconds is the API server's upper bound on
// sessionAffinityConfig.clientIP.timeoutSeconds (one day).
const maxAffinitySeconds = 86400

// Options adapt BuildSnapshot to the node it runs on and to the mode the
// proxy runs in. The zero value is a cluster-mode proxy on an unnamed node.
type Options struct {
	// NodeName is the name of this node. Endpoints whose nodeName equals it
	// are local, and node hints naming it are honoured. If empty, no
	// endpoint is local, so ports with a Local traffic policy have no local
	// endpoints, and node hints are ignored.
	NodeName string
	// NodeLabels are this node's labels; topology hints use the zone in
	// topology.kubernetes.io/zone. If nil or without that label, zone hints
	// are ignored.
	NodeLabels map[string]string
	// ServiceProxyName, if set, makes this an alternative proxy: only
	// Services labelled service.kubernetes.io/service-proxy-name with this
	// value are served. If empty, Services carrying that label are skipped,
	// as kube-proxy does, since another proxy owns them.
	ServiceProxyName string
	// AllowLoopback accepts loopback endpoint and frontend addresses
	// (127.0.0.0/8, ::1 and IPv4-mapped loopback). If false they are refused
	// and reported: in a cluster they would reach the node's own daemons
	// (the API server refuses them too). Manifest mode sets it, because the
	// author owns the host.
	AllowLoopback bool
	// AllowNoClusterIP serves Services that have no cluster IP at all; they
	// are then reached through their node ports, external IPs and
	// load-balancer IPs only. If false such Services are skipped, as
	// kube-proxy does. Manifest mode sets it, because no cluster allocates
	// cluster IPs there. Headless Services (clusterIP: None) are skipped
	// either way.
	AllowNoClusterIP bool
	// HostAddrs, if set, lists this host's addresses: an endpoint at one of
	// them (or at any IPv4 loopback address) on a port that is some
	// Service's node port, in its IP family, would be captured by the
	// proxy's node port, and is ignored. Called only when an endpoint has
	// such a port.
	HostAddrs func() ([]netip.Addr, error)
	// NodePortAddresses, with HostAddrs, narrows those addresses to the
	// ones that serve node ports (--nodeport-addresses); empty means all.
	NodePortAddresses []netip.Prefix

	// others indexes the frontends and node ports of every Service, for
	// the capture check of endpoints when BuildSnapshot is given one
	// Service at a time (see served.update); nil when it is given all.
	others *frontIndex
}

// zone returns this node's topology zone, or "".
func (o *Options) zone() string { return o.NodeLabels[corev1.LabelTopologyZone] }

// BuildSnapshot turns Services and EndpointSlices into the state the proxy
// serves, with kube-proxy's semantics: skipped Services, one ServicePort per
// (service, port name, protocol), frontends, affinity, traffic policies, and
// endpoints filtered by readiness, topology hints and locality.
//
// It never fails as a whole: what it cannot use (a refused endpoint
// address, a slice without its service-name label, a malformed field) is
// left out and reported in the returned errors, each an *ObjectError naming
// the object and field. Nil entries in services and slices are ignored. The
// inputs are not modified. BuildSnapshot does no I/O and keeps no state, so
// both the manifest source and an informer-fed source can call it.
func BuildSnapshot(services []*corev1.Service, slices []*discoveryv1.EndpointSlice, opts Options) (state.Snapshot, []error) {
	b := &builder{opts: opts, zone: opts.zone()}
	ports, bySvc := b.servicePorts(services)
	b.attachEndpoints(ports, bySvc, slices)
	return state.NewSnapshot(ports), b.problems
}

// builder collects problems while BuildSnapshot works.
type builder struct {
	opts     Options
	zone     string
	problems []error
	// specPorts holds, per served Service, the name/protocol keys of all
	// its spec.ports (see portKey), served or not.
	specPorts map[objectRef]map[string]bool
}

// objectRef names one object: its namespace and name.
type objectRef struct{ namespace, name string }

func (r objectRef) compare(o objectRef) int {
	return cmp.Or(cmp.Compare(r.namespace, o.namespace), cmp.Compare(r.name, o.name))
}

func (b *builder) report(kind string, ref objectRef, field string, err error) {
	b.problems = append(b.problems, &ObjectError{
		Kind: kind, Namespace: ref.namespace, Name: ref.name, Field: field, Err: err,
	})
}

// servicePorts builds the service ports of every served Service, without
// endpoints, and indexes them by Service.
func (b *builder) servicePorts(services []*corev1.Service) ([]state.ServicePort, map[objectRef][]int) {
	sorted := make([]*corev1.Service, 0, len(services))
	for _, svc := range services {
		if svc != nil {
			sorted = append(sorted, svc)
		}
	}
	slices.SortStableFunc(sorted, func(a, c *corev1.Service) int { return serviceRef(a).compare(serviceRef(c)) })

	var ports []state.ServicePort
	bySvc := make(map[objectRef][]int)
	seen := make(map[objectRef]bool, len(sorted))
	for _, svc := range sorted {
		ref := serviceRef(svc)
		if seen[ref] {
			b.report("Service", ref, "", errors.New("duplicate Service; the first one is served"))
			continue
		}
		seen[ref] = true
		if b.specPorts == nil {
			b.specPorts = make(map[objectRef]map[string]bool)
		}
		keys := make(map[string]bool, len(svc.Spec.Ports))
		for _, p := range svc.Spec.Ports {
			keys[portKey(p.Name, orTCP(p.Protocol))] = true
		}
		b.specPorts[ref] = keys
		for _, sp := range b.service(svc) {
			bySvc[ref] = append(bySvc[ref], len(ports))
			ports = append(ports, sp)
		}
	}
	return ports, bySvc
}

func serviceRef(svc *corev1.Service) objectRef {
	return objectRef{svc.Namespace, svc.Name}
}

// skipped reports whether the proxy leaves svc alone.
func (b *builder) skipped(svc *corev1.Service) bool {
	_, why := skipReason(svc, b.opts.ServiceProxyName)
	return why != ""
}

// skipReason says why the proxy leaves svc alone, as kube-proxy's label
// selector and ShouldSkipService do, or "" when it serves it; onLabels
// says the reason is a label. proxyName is Options.ServiceProxyName.
// Manifest validation warns with the same words.
func skipReason(svc *corev1.Service, proxyName string) (onLabels bool, why string) {
	_, headlessLabel := svc.Labels[corev1.IsHeadlessService]
	name, labelled := svc.Labels[LabelServiceProxyName]
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return false, "type ExternalName is served by DNS, not by the proxy; skipped"
	case isHeadless(svc):
		return false, "headless (clusterIP: None) is served by DNS, not by the proxy; skipped"
	case headlessLabel:
		return true, fmt.Sprintf("label %s marks it headless; skipped, as kube-proxy does", corev1.IsHeadlessService)
	case proxyName == "" && labelled:
		return true, fmt.Sprintf("label %s=%q gives it to another proxy; skipped, as kube-proxy does", LabelServiceProxyName, name)
	case proxyName != "" && name != proxyName:
		return true, fmt.Sprintf("label %s is not %q, this proxy's name; skipped", LabelServiceProxyName, proxyName)
	}
	return false, ""
}

// sourceRanges returns spec.loadBalancerSourceRanges, masked. An entry
// that is not a CIDR is reported and left out, as kube-proxy leaves out
// what it cannot parse (the API server refuses such entries; the manifest
// checks refuse them too).
func (b *builder) sourceRanges(svc *corev1.Service, ref objectRef) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := parseSourceRange(s)
		if err != nil {
			b.report("Service", ref, fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), fmt.Errorf("%w; left out", err))
			continue
		}
		out = append(out, p)
	}
	return out
}

// parseSourceRange reads a loadBalancerSourceRanges entry as the API
// server accepts it: padded with spaces (a leftover of the annotation the
// field replaced), host bits set, and IPv4 octets with leading zeros,
// which it reads as decimal.
func parseSourceRange(s string) (netip.Prefix, error) {
	t := strings.TrimSpace(s)
	p, err := netip.ParsePrefix(t)
	if u, ok := withoutLeadingZeros(t); err != nil && ok {
		p, err = netip.ParsePrefix(u)
	}
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	return p.Masked(), nil
}

// isHeadless reports whether svc has clusterIP: None.
func isHeadless(svc *corev1.Service) bool {
	return svc.Spec.ClusterIP == corev1.ClusterIPNone || len(svc.Spec.ClusterIPs) > 0 && svc.Spec.ClusterIPs[0] == corev1.ClusterIPNone
}

// service returns the service ports of one Service, or none if it is
// skipped or unusable.
func (b *builder) service(svc *corev1.Service) []state.ServicePort {
	if b.skipped(svc) {
		return nil
	}
	ref := serviceRef(svc)
	clusterIPs, ok := b.clusterIPs(svc, ref)
	if !ok {
		return nil
	}
	if len(clusterIPs) == 0 && !b.opts.AllowNoClusterIP {
		return nil
	}
	families := b.ipFamilies(svc, ref)
	// The Service's families are those of its cluster IPs, else of its
	// ipFamilies (a manifest may give neither: then every address counts).
	// kube-proxy's proxier of a family the Service lacks skips it whole,
	// so an external or load-balancer IP of another family is not served.
	var own []state.IPFamily
	for _, ip := range clusterIPs {
		own = append(own, familyOf(ip))
	}
	if len(own) == 0 {
		own = families
	}
	var externalIPs, lbIPs []netip.Addr
	add := func(ips []netip.Addr, path, s string) []netip.Addr {
		out := b.appendFrontend(ips, ref, path, s)
		if len(out) == len(ips) || len(own) == 0 {
			return out // refused or repeated, or every family counts
		}
		if ip := out[len(out)-1]; !slices.Contains(own, familyOf(ip)) {
			b.report("Service", ref, path, fmt.Errorf("%s is %s, not an IP family of the Service (%v); ignored, as kube-proxy does", ip, familyOf(ip), own))
			return ips
		}
		return out
	}
	for i, s := range svc.Spec.ExternalIPs {
		externalIPs = add(externalIPs, fmt.Sprintf("spec.externalIPs[%d]", i), s)
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		// ipMode Proxy: the load balancer delivers to the node or pod
		// itself, so capturing its IP would break it (KEP-1860).
		if ing.IP == "" || ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP {
			continue
		}
		lbIPs = add(lbIPs, fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), ing.IP)
	}
	sourceRanges := b.sourceRanges(svc, ref)
	affinity := b.affinity(svc, ref)
	proxyProto, err := proxyProtocol(svc)
	if err != nil {
		b.report("Service", ref, proxyProtocolField, fmt.Errorf("%w; served without a PROXY protocol header", err))
	}

	internalLocal := false
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		switch *p {
		case corev1.ServiceInternalTrafficPolicyLocal:
			internalLocal = true
		case corev1.ServiceInternalTrafficPolicyCluster:
		default:
			b.report("Service", ref, "spec.internalTrafficPolicy", fmt.Errorf("unknown policy %q, using Cluster", *p))
		}
	}
	externalLocal := false
	switch p := svc.Spec.ExternalTrafficPolicy; p {
	case corev1.ServiceExternalTrafficPolicyLocal:
		externalLocal = true
	case "", corev1.ServiceExternalTrafficPolicyCluster:
	default:
		b.report("Service", ref, "spec.externalTrafficPolicy", fmt.Errorf("unknown policy %q, using Cluster", p))
	}
	var healthCheck uint16
	if hc := svc.Spec.HealthCheckNodePort; hc < 0 || hc > 65535 {
		b.report("Service", ref, "spec.healthCheckNodePort", fmt.Errorf("%d is out of range 1-65535", hc))
	} else {
		healthCheck = uint16(hc)
	}

	// As kube-proxy: external traffic is kept local for a Service that is
	// externally accessible (ExternallyAccessible: a LoadBalancer or a
	// NodePort, or a ClusterIP with external IPs), and a LoadBalancer's
	// health check node port is served (NeedsHealthCheck) whatever its
	// node ports and ingress: a cloud load balancer may probe it before
	// either exists, or reach the Service through a hostname or a
	// Proxy-mode IP the proxy does not capture.
	typ := svc.Spec.Type
	accessible := typ == corev1.ServiceTypeLoadBalancer || typ == corev1.ServiceTypeNodePort ||
		(typ == "" || typ == corev1.ServiceTypeClusterIP) && len(svc.Spec.ExternalIPs) > 0
	var out []state.ServicePort
	seen := make(map[state.ServicePortName]bool, len(svc.Spec.Ports))
	for i, p := range svc.Spec.Ports {
		path := fmt.Sprintf("spec.ports[%d]", i)
		proto, err := protocol(string(p.Protocol))
		if err != nil {
			b.report("Service", ref, path+".protocol", err)
			continue
		}
		if p.Port < 1 || p.Port > 65535 {
			b.report("Service", ref, path+".port", fmt.Errorf("%d is out of range 1-65535", p.Port))
			continue
		}
		if p.NodePort < 0 || p.NodePort > 65535 {
			b.report("Service", ref, path+".nodePort", fmt.Errorf("%d is out of range 1-65535", p.NodePort))
			continue
		}
		name := state.ServicePortName{Namespace: ref.namespace, Name: ref.name, Port: p.Name, Protocol: proto}
		if seen[name] {
			b.report("Service", ref, path, fmt.Errorf("duplicate port %s; the first one is served", name))
			continue
		}
		seen[name] = true
		sp := state.ServicePort{
			Name:            name,
			Port:            uint16(p.Port),
			ClusterIPs:      slices.Clone(clusterIPs),
			NodePort:        uint16(p.NodePort),
			ExternalIPs:     slices.Clone(externalIPs),
			LoadBalancerIPs: slices.Clone(lbIPs),
			// Shared by the Service's ports: nothing modifies it.
			LoadBalancerSourceRanges: sourceRanges,
			IPFamilies:               families,
			Affinity:                 affinity,
			InternalLocal:            internalLocal,
			ProxyProtocol:            proxyProto,
		}
		if externalLocal && accessible {
			sp.ExternalLocal = true
			if typ == corev1.ServiceTypeLoadBalancer {
				sp.HealthCheckNodePort = healthCheck
			}
		}
		out = append(out, sp)
	}
	return out
}

// ipFamilies returns spec.ipFamilies, without unknown or repeated entries
// (reported). Service ports share the slice: nothing modifies it.
func (b *builder) ipFamilies(svc *corev1.Service, ref objectRef) []state.IPFamily {
	var out []state.IPFamily
	for i, f := range svc.Spec.IPFamilies {
		fam := state.IPFamily(f)
		switch {
		case fam != state.IPv4 && fam != state.IPv6:
			b.report("Service", ref, fmt.Sprintf("spec.ipFamilies[%d]", i), fmt.Errorf("unknown IP family %q (want IPv4 or IPv6), ignored", f))
		case !slices.Contains(out, fam):
			out = append(out, fam)
		}
	}
	return out
}

// rawClusterIPs returns the Service's cluster IPs as written, and the field
// they come from: spec.clusterIPs, or spec.clusterIP for objects written
// before dual-stack.
func rawClusterIPs(svc *corev1.Service) (raw []string, field string) {
	if len(svc.Spec.ClusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		return []string{svc.Spec.ClusterIP}, "spec.clusterIP"
	}
	return svc.Spec.ClusterIPs, "spec.clusterIPs"
}

// clusterIPs returns the Service's cluster IPs (see rawClusterIPs). ok is false when
// one is malformed: a Service whose cluster IPs cannot be read is not
// served at all.
func (b *builder) clusterIPs(svc *corev1.Service, ref objectRef) (ips []netip.Addr, ok bool) {
	raw, field := rawClusterIPs(svc)
	for i, s := range raw {
		path := field
		if field == "spec.clusterIPs" {
			path = fmt.Sprintf("%s[%d]", field, i)
		}
		ip, err := parseIP(s)
		if err != nil {
			b.report("Service", ref, path, fmt.Errorf("%w; Service not served", err))
			return nil, false
		}
		ip = ip.Unmap()
		if err := checkAddr(ip, b.opts.AllowLoopback); err != nil {
			b.report("Service", ref, path, err)
			continue
		}
		if !slices.Contains(ips, ip) {
			ips = append(ips, ip)
		}
	}
	if len(raw) > 0 && len(ips) == 0 && !b.opts.AllowNoClusterIP {
		b.report("Service", ref, field, errors.New("no usable cluster IP; Service not served"))
	}
	return ips, true
}

// appendFrontend parses s and appends it to ips unless it is malformed,
// refused (both reported) or already there.
func (b *builder) appendFrontend(ips []netip.Addr, ref objectRef, path, s string) []netip.Addr {
	ip, err := parseIP(s)
	if err == nil {
		ip = ip.Unmap()
		err = checkAddr(ip, b.opts.AllowLoopback)
	}
	if err != nil {
		b.report("Service", ref, path, err)
		return ips
	}
	if slices.Contains(ips, ip) {
		return ips
	}
	return append(ips, ip)
}

// affinity reads sessionAffinity and its timeout. The API server defaults
// the timeout to 10800 s; objects from files have no defaults applied, so a
// missing timeout means the default here too.
func (b *builder) affinity(svc *corev1.Service, ref objectRef) state.Affinity {
	switch svc.Spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone:
		return state.Affinity{Type: state.AffinityNone}
	case corev1.ServiceAffinityClientIP:
	default:
		b.report("Service", ref, "spec.sessionAffinity", fmt.Errorf("unknown affinity %q, using None", svc.Spec.SessionAffinity))
		return state.Affinity{Type: state.AffinityNone}
	}
	a := state.Affinity{Type: state.AffinityClientIP, Timeout: state.DefaultAffinityTimeout}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		t := *c.ClientIP.TimeoutSeconds
		if t < 1 || t > maxAffinitySeconds {
			b.report("Service", ref, "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
				fmt.Errorf("%d is out of range 1-%d, using %d", t, maxAffinitySeconds, int(state.DefaultAffinityTimeout/time.Second)))
		} else {
			a.Timeout = time.Duration(t) * time.Second
		}
	}
	return a
}

// protocol maps an API protocol to ours; empty means TCP, the API default.
func protocol(p string) (state.Protocol, error) {
	switch state.Protocol(p) {
	case "":
		return state.TCP, nil
	case state.TCP, state.UDP, state.SCTP:
		return state.Protocol(p), nil
	}
	return "", fmt.Errorf("unsupported protocol %q (want TCP, UDP or SCTP)", p)
}

// familyOf is the IP family of ip.
func familyOf(ip netip.Addr) state.IPFamily {
	if ip.Unmap().Is4() {
		return state.IPv4
	}
	return state.IPv6
}
