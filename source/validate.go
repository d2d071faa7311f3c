package source

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// This file checks, for objects read from a file, what the API server
// would have checked before the proxy saw them, limited to the fields the
// proxy relies on. Names are checked too: they end up in log lines and in
// iptables comments.

// finding is one validation result: an error, or a warning when the object
// is usable but may not do what its author expects.
type finding struct {
	field   string
	err     error
	warning bool
}

type findings []finding

func (fs *findings) errorf(p *field.Path, format string, args ...any) {
	*fs = append(*fs, finding{field: pathString(p), err: fmt.Errorf(format, args...)})
}

func (fs *findings) warnf(p *field.Path, format string, args ...any) {
	*fs = append(*fs, finding{field: pathString(p), err: fmt.Errorf(format, args...), warning: true})
}

// pathString is p as text; a nil p (the whole object) is "".
func pathString(p *field.Path) string {
	if p == nil {
		return ""
	}
	return p.String()
}

// format checks value with one of apimachinery's validation functions.
func (fs *findings) format(p *field.Path, value string, check func(string) []string) {
	if msgs := check(value); len(msgs) > 0 {
		fs.errorf(p, "%q is invalid: %s", value, strings.Join(msgs, "; "))
	}
}

func (fs *findings) portRange(p *field.Path, port int32, zeroOK bool) {
	if port == 0 && zeroOK {
		return
	}
	if port < 1 || port > 65535 {
		fs.errorf(p, "%d is out of range 1-65535", port)
	}
}

func (fs *findings) protocol(p *field.Path, proto corev1.Protocol) {
	if _, err := protocol(string(proto)); err != nil {
		fs.errorf(p, "%s", err)
	}
}

// ip checks a textual IP address; family, if not empty, is the family it
// must have.
func (fs *findings) ip(p *field.Path, s string, family discoveryv1.AddressType) {
	ip, err := parseIP(s)
	_, strictErr := netip.ParseAddr(s)
	switch {
	case err != nil:
		fs.errorf(p, "%s", err)
	case strictErr != nil: // parseIP reads leading zeros for objects stored long ago
		fs.errorf(p, "%q has leading zeros, which the API server refuses (write %s)", s, ip)
	case family == discoveryv1.AddressTypeIPv6 && ip.Is4In6():
		// The API server's family check (k8s.io/utils/net.IsIPv6String)
		// counts it as IPv4.
		fs.errorf(p, "%s is an IPv4-mapped address, not an IPv6 address: the API server refuses it here (write %s in an IPv4 EndpointSlice)", s, ip.Unmap())
	case ip.Is4In6():
		// IPv4 to the family check (IsIPv4String), but refused since
		// 1.36 (StrictIPCIDRValidation), as leading zeros are, in every
		// address field the proxy reads.
		fs.errorf(p, "%s is an IPv4-mapped IPv6 address, which the API server refuses (write %s)", s, ip.Unmap())
	case family == discoveryv1.AddressTypeIPv4 && !ip.Is4(), family == discoveryv1.AddressTypeIPv6 && !ip.Is6():
		fs.errorf(p, "%s is not an %s address", s, family)
	}
}

// canonicalIPv6 warns of an IPv6 address not written in its canonical
// form (RFC 5952), as the API server warns of one in spec.clusterIPs and
// spec.externalIPs. The proxy reads it all the same.
func (fs *findings) canonicalIPv6(p *field.Path, s string) {
	if ip, err := netip.ParseAddr(s); err == nil && ip.Is6() && !ip.Is4In6() && ip.String() != s {
		fs.warnf(p, "%s is an IPv6 address not in its canonical form: the API server takes it with a warning (write %s)", s, ip)
	}
}

func (fs *findings) metadata(name, namespace string, nameCheck func(string) []string) {
	p := field.NewPath("metadata")
	if name == "" {
		fs.errorf(p.Child("name"), "is required")
	} else {
		fs.format(p.Child("name"), name, nameCheck)
	}
	fs.format(p.Child("namespace"), namespace, validation.IsDNS1123Label)
}

func validateService(svc *corev1.Service) []finding {
	var fs findings
	fs.metadata(svc.Name, svc.Namespace, validation.IsDNS1035Label)
	spec := field.NewPath("spec")

	var (
		headless     = isHeadless(svc)
		externalName = svc.Spec.Type == corev1.ServiceTypeExternalName
		nodePorts    = false
	)
	switch svc.Spec.Type {
	case "", corev1.ServiceTypeClusterIP, corev1.ServiceTypeExternalName:
	case corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
		nodePorts = true
	default:
		fs.errorf(spec.Child("type"), "unknown type %q (want ClusterIP, NodePort, LoadBalancer or ExternalName)", svc.Spec.Type)
	}

	validateClusterIPs(&fs, svc)
	validateIPFamilies(&fs, svc)
	validateIPFamilyPolicy(&fs, svc)
	for i, s := range svc.Spec.ExternalIPs {
		fs.ip(spec.Child("externalIPs").Index(i), s, "")
		fs.canonicalIPv6(spec.Child("externalIPs").Index(i), s)
	}
	if ranges := svc.Spec.LoadBalancerSourceRanges; len(ranges) > 0 {
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			fs.errorf(spec.Child("loadBalancerSourceRanges"), "may be set only when type is LoadBalancer")
		}
		for i, s := range ranges {
			// The API server still serves objects it stored before it
			// turned strict (1.36 refuses host bits), which the proxy
			// reads leniently; a new object must be canonical.
			p := spec.Child("loadBalancerSourceRanges").Index(i)
			pfx, err := parseSourceRange(s)
			switch strict, serr := netip.ParsePrefix(strings.TrimSpace(s)); {
			case err != nil:
				fs.errorf(p, "%s (want an address range such as 203.0.113.0/24)", err)
			case serr != nil:
				fs.errorf(p, "%q has leading zeros (write %s)", s, pfx)
			case strict != pfx:
				fs.errorf(p, "%q has bits set beyond the prefix length (write %s)", s, pfx)
			}
		}
	}

	if len(svc.Spec.Ports) == 0 && !headless && !externalName {
		fs.errorf(spec.Child("ports"), "at least one port is required")
	}
	names := make(map[string]int)
	portProtos := make(map[string]int)
	for i, p := range svc.Spec.Ports {
		pp := spec.Child("ports").Index(i)
		switch {
		case p.Name == "" && len(svc.Spec.Ports) > 1:
			fs.errorf(pp.Child("name"), "is required when a Service has more than one port")
		case p.Name != "":
			fs.format(pp.Child("name"), p.Name, validation.IsValidPortName)
			if j, dup := names[p.Name]; dup {
				fs.errorf(pp.Child("name"), "duplicate name %q (also spec.ports[%d])", p.Name, j)
			} else {
				names[p.Name] = i
			}
		}
		fs.protocol(pp.Child("protocol"), p.Protocol)
		fs.portRange(pp.Child("port"), p.Port, false)
		key := fmt.Sprintf("%d/%s", p.Port, orTCP(p.Protocol))
		if j, dup := portProtos[key]; dup {
			fs.errorf(pp, "duplicate port %s (also spec.ports[%d])", key, j)
		} else {
			portProtos[key] = i
		}
		fs.portRange(pp.Child("nodePort"), p.NodePort, true)
		switch {
		case p.NodePort != 0 && !nodePorts:
			fs.errorf(pp.Child("nodePort"), "may be set only when type is NodePort or LoadBalancer")
		case p.NodePort == 0 && nodePorts:
			fs.warnf(pp.Child("nodePort"), "not set: no node port is served for it (in manifest mode nothing allocates one)")
		case p.NodePort != 0 && (p.NodePort < defaultNodePortMin || p.NodePort > defaultNodePortMax):
			fs.warnf(pp.Child("nodePort"), "%d is outside %d-%d, the default --service-node-port-range: a cluster with that range would refuse it (served here all the same)",
				p.NodePort, defaultNodePortMin, defaultNodePortMax)
		}
	}

	switch v, err := proxyProtocol(svc); {
	case err != nil:
		fs.errorf(field.NewPath("metadata", "annotations").Key(AnnotationProxyProtocol), "%s", err)
	case v != state.ProxyProtocolNone:
		for i, p := range svc.Spec.Ports {
			if proto := orTCP(p.Protocol); proto != corev1.ProtocolTCP {
				fs.warnf(spec.Child("ports").Index(i).Child("protocol"), "the PROXY protocol header (annotation %s) is sent on TCP ports only: this %s port is served without it",
					AnnotationProxyProtocol, proto)
			}
		}
	}

	switch svc.Spec.SessionAffinity {
	case "", corev1.ServiceAffinityNone, corev1.ServiceAffinityClientIP:
	default:
		fs.errorf(spec.Child("sessionAffinity"), "unknown affinity %q (want None or ClientIP)", svc.Spec.SessionAffinity)
	}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		if t := *c.ClientIP.TimeoutSeconds; t < 1 || t > maxAffinitySeconds {
			fs.errorf(spec.Child("sessionAffinityConfig", "clientIP", "timeoutSeconds"), "%d is out of range 1-%d", t, maxAffinitySeconds)
		}
	}
	switch p := svc.Spec.ExternalTrafficPolicy; p {
	case "", corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal:
	default:
		fs.errorf(spec.Child("externalTrafficPolicy"), "unknown policy %q (want Cluster or Local)", p)
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		switch *p {
		case corev1.ServiceInternalTrafficPolicyCluster, corev1.ServiceInternalTrafficPolicyLocal:
		default:
			fs.errorf(spec.Child("internalTrafficPolicy"), "unknown policy %q (want Cluster or Local)", *p)
		}
	}
	fs.portRange(spec.Child("healthCheckNodePort"), svc.Spec.HealthCheckNodePort, true)
	if hc := svc.Spec.HealthCheckNodePort; hc >= 1 && hc <= 65535 && servedHealthCheckNodePort(svc) == 0 {
		fs.warnf(spec.Child("healthCheckNodePort"), "%d is served only for a LoadBalancer with externalTrafficPolicy: Local, so it is ignored here (a cluster would refuse it)", hc)
	}

	ingress := field.NewPath("status", "loadBalancer", "ingress")
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP != "" {
			fs.ip(ingress.Index(i).Child("ip"), ing.IP, "")
		}
		if m := ing.IPMode; m != nil && *m != corev1.LoadBalancerIPModeVIP && *m != corev1.LoadBalancerIPModeProxy {
			fs.errorf(ingress.Index(i).Child("ipMode"), "unknown mode %q (want VIP or Proxy)", *m)
		}
	}

	// Manifest mode has no proxy name of its own.
	if onLabels, why := skipReason(svc, ""); why != "" {
		var at *field.Path
		if onLabels {
			at = field.NewPath("metadata", "labels")
		}
		fs.warnf(at, "%s", why)
	}
	return fs
}

// servedHealthCheckNodePort is the spec.healthCheckNodePort of svc when
// BuildSnapshot serves it (a LoadBalancer with externalTrafficPolicy:
// Local, as kube-proxy's NeedsHealthCheck), else 0. An out-of-range port
// is 0: validateService reports it.
func servedHealthCheckNodePort(svc *corev1.Service) int32 {
	hc := svc.Spec.HealthCheckNodePort
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
		hc < 1 || hc > 65535 {
		return 0
	}
	return hc
}

// The API server's default --service-node-port-range.
const (
	defaultNodePortMin = 30000
	defaultNodePortMax = 32767
)

func orTCP(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// validateClusterIPs checks spec.clusterIP and spec.clusterIPs as the API
// server does: empty, None, or one IP per family, clusterIPs[0] being
// clusterIP.
func validateClusterIPs(fs *findings, svc *corev1.Service) {
	spec := field.NewPath("spec")
	ips := svc.Spec.ClusterIPs
	if ip := svc.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
		fs.ip(spec.Child("clusterIP"), ip, "")
		if len(ips) == 0 { // else clusterIPs[0] is warned of
			fs.canonicalIPv6(spec.Child("clusterIP"), ip)
		}
	}
	if len(ips) == 0 {
		return
	}
	p := spec.Child("clusterIPs")
	if svc.Spec.ClusterIP != "" && ips[0] != svc.Spec.ClusterIP {
		fs.errorf(p.Index(0), "%q must equal spec.clusterIP %q", ips[0], svc.Spec.ClusterIP)
	}
	if len(ips) > 2 {
		fs.errorf(p, "at most two addresses (one per IP family) are allowed, got %d", len(ips))
		return
	}
	for i, s := range ips {
		if s == corev1.ClusterIPNone {
			if len(ips) > 1 {
				fs.errorf(p.Index(i), "None must be the only entry")
			}
			continue
		}
		fs.ip(p.Index(i), s, "")
		fs.canonicalIPv6(p.Index(i), s)
	}
	if len(ips) == 2 {
		a, errA := parseIP(ips[0])
		b, errB := parseIP(ips[1])
		if errA == nil && errB == nil && a.Is4() == b.Is4() {
			fs.errorf(p, "the two addresses must be of different IP families")
		}
	}
}

// validateIPFamilies checks spec.ipFamilies as the API server does: IPv4
// or IPv6, each at most once, in the order of the cluster IPs' families.
func validateIPFamilies(fs *findings, svc *corev1.Service) {
	p := field.NewPath("spec", "ipFamilies")
	fams := svc.Spec.IPFamilies
	if len(fams) > 2 {
		fs.errorf(p, "at most two families are allowed, got %d", len(fams))
		return
	}
	for i, f := range fams {
		switch {
		case f != corev1.IPv4Protocol && f != corev1.IPv6Protocol:
			fs.errorf(p.Index(i), "unknown IP family %q (want IPv4 or IPv6)", f)
		case i == 1 && f == fams[0]:
			fs.errorf(p.Index(i), "%s is given twice", f)
		}
	}
	ips, name := rawClusterIPs(svc)
	ipsPath := field.NewPath(name)
	for i, s := range ips {
		ip, err := parseIP(s)
		if i >= len(fams) || err != nil { // None, or reported with the cluster IPs
			continue
		}
		want := corev1.IPv6Protocol
		if ip.Unmap().Is4() {
			want = corev1.IPv4Protocol
		}
		if fams[i] != want {
			at := ipsPath
			if len(svc.Spec.ClusterIPs) > 0 {
				at = ipsPath.Index(i)
			}
			fs.errorf(p.Index(i), "%s does not match %s %s, an %s address", fams[i], at, s, want)
		}
	}
}

// validateIPFamilyPolicy checks spec.ipFamilyPolicy against the cluster
// IPs, as the API server does when it stores a Service. It allocates the
// missing cluster IP of a RequireDualStack Service, or refuses the Service
// where it cannot (a single-stack cluster); no allocator runs for a
// manifest, so the Service is refused: served in one family, it would
// ignore its other family's EndpointSlices.
func validateIPFamilyPolicy(fs *findings, svc *corev1.Service) {
	if svc.Spec.IPFamilyPolicy == nil {
		return
	}
	p := field.NewPath("spec", "ipFamilyPolicy")
	ips, name := rawClusterIPs(svc)
	switch policy := *svc.Spec.IPFamilyPolicy; policy {
	case corev1.IPFamilyPolicySingleStack:
		if len(ips) == 2 {
			fs.errorf(p, "SingleStack allows one cluster IP, and spec.clusterIPs has two (write PreferDualStack or RequireDualStack)")
		}
	case corev1.IPFamilyPolicyPreferDualStack:
	case corev1.IPFamilyPolicyRequireDualStack:
		if len(ips) != 1 || ips[0] == corev1.ClusterIPNone {
			return
		}
		ip, err := parseIP(ips[0])
		if err != nil {
			return // reported with the cluster IPs
		}
		other := corev1.IPv4Protocol
		if ip.Unmap().Is4() {
			other = corev1.IPv6Protocol
		}
		fs.errorf(field.NewPath(name), "ipFamilyPolicy RequireDualStack needs a cluster IP of each family, and there is no %s one: the API server would allocate it (or refuse the Service, in a single-stack cluster); nothing allocates one for a manifest, so add it to spec.clusterIPs", other)
	default:
		fs.errorf(p, "unknown policy %q (want SingleStack, PreferDualStack or RequireDualStack)", policy)
	}
}

func validateSlice(s *discoveryv1.EndpointSlice) []finding {
	var fs findings
	fs.metadata(s.Name, s.Namespace, validation.IsDNS1123Subdomain)
	// The API server takes a slice without the label: it belongs to no
	// Service, and kube-proxy ignores it. So does the proxy, with a word.
	if s.Labels[discoveryv1.LabelServiceName] == "" {
		fs.warnf(field.NewPath("metadata", "labels"),
			"no %s label, which names the Service a slice belongs to; ignored", discoveryv1.LabelServiceName)
	}

	family := s.AddressType
	switch family {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
	case discoveryv1.AddressTypeFQDN:
		fs.warnf(field.NewPath("addressType"), "FQDN slices are not served by the proxy; skipped")
	case "":
		fs.errorf(field.NewPath("addressType"), "is required (IPv4 or IPv6)")
	default:
		fs.errorf(field.NewPath("addressType"), "unknown address type %q (want IPv4 or IPv6)", family)
	}
	ipFamily := family == discoveryv1.AddressTypeIPv4 || family == discoveryv1.AddressTypeIPv6
	for i, ep := range s.Endpoints {
		p := field.NewPath("endpoints").Index(i).Child("addresses")
		if len(ep.Addresses) == 0 {
			fs.errorf(p, "at least one address is required")
		}
		for j, a := range ep.Addresses {
			switch {
			case ipFamily:
				fs.ip(p.Index(j), a, family)
			case family == discoveryv1.AddressTypeFQDN:
				fs.format(p.Index(j), a, validation.IsDNS1123Subdomain)
			}
		}
		if len(ep.Addresses) > 1 {
			fs.warnf(p, "only the first address is used, as kube-proxy does")
		}
	}

	names := make(map[string]int)
	for i, port := range s.Ports {
		p := field.NewPath("ports").Index(i)
		name := ""
		if port.Name != nil {
			name = *port.Name
		}
		if name != "" {
			fs.format(p.Child("name"), name, validation.IsValidPortName)
		}
		if j, dup := names[name]; dup {
			fs.errorf(p.Child("name"), "duplicate name %q (also ports[%d])", name, j)
		} else {
			names[name] = i
		}
		if port.Protocol != nil {
			fs.protocol(p.Child("protocol"), *port.Protocol)
		}
		if port.Port == nil {
			// Valid to the API server ("any port"), but kube-proxy skips
			// such a port, and so does the proxy.
			fs.warnf(p.Child("port"), "not set: the port is skipped, as kube-proxy skips it")
		} else {
			fs.portRange(p.Child("port"), *port.Port, false)
		}
	}
	return fs
}

// crossCheck looks at the objects of a file together: node ports and
// health-check node ports must not collide (in a cluster one allocator
// gives each its own), and slices should name Services and ports that
// exist.
func (m *manifest) crossCheck() {
	type nodePort struct {
		port  int32
		proto corev1.Protocol
	}
	// portUser is who holds a node port: a Service's spec.ports[index],
	// or its health check (index -1).
	type portUser struct {
		ref   objectRef
		index int
	}
	nodePorts := make(map[nodePort]portUser)
	// numbers holds the first Service to use each node port number, with
	// the protocol: a cluster's allocator gives a number to one Service,
	// whose ports of different protocols may share it.
	type numberUser struct {
		ref  objectRef
		what string // "a UDP node port", "the health check node port"
	}
	numbers := make(map[int32]numberUser)
	shared := func(at origin, ref objectRef, field string, port int32, what string, healthCheck bool) {
		other, dup := numbers[port]
		if !dup {
			numbers[port] = numberUser{ref, what}
			return
		}
		switch {
		case other.ref != ref:
			m.warnings = append(m.warnings, m.problem(at, "Service", ref, field,
				fmt.Errorf("node port %d is also %s of Service %s/%s (%s): a cluster gives each node port number to one Service, whatever the protocol, and would refuse it (served here all the same)",
					port, other.what, other.ref.namespace, other.ref.name, m.origins[objectKey{"Service", other.ref}])))
		case healthCheck:
			// A Service's ports of several protocols may share a number;
			// its health check port is allocated a number of its own.
			m.warnings = append(m.warnings, m.problem(at, "Service", ref, field,
				fmt.Errorf("health check node port %d is also %s of this Service: a cluster allocates the health check port a number of its own, and would refuse it (served here all the same)", port, other.what)))
		}
	}
	ports := make(map[objectRef]map[string]bool) // "name/PROTO" of each port
	for _, svc := range m.services {
		ref := objectRef{svc.Namespace, svc.Name}
		at := m.origins[objectKey{"Service", ref}]
		problem := func(field string, err error) {
			m.errs = append(m.errs, m.problem(at, "Service", ref, field, err))
		}
		// usedBy names the port other holds, in a Service earlier in the
		// file or in this one.
		usedBy := func(other portUser) string {
			by := fmt.Sprintf("Service %s/%s (%s)", other.ref.namespace, other.ref.name, m.origins[objectKey{"Service", other.ref}])
			if other.ref == ref {
				by = "this Service"
			}
			if other.index < 0 {
				return "the health check node port of " + by
			}
			return fmt.Sprintf("spec.ports[%d].nodePort of %s", other.index, by)
		}
		ports[ref] = make(map[string]bool)
		for i, p := range svc.Spec.Ports {
			ports[ref][portKey(p.Name, orTCP(p.Protocol))] = true
			if p.NodePort == 0 {
				continue
			}
			key := nodePort{p.NodePort, orTCP(p.Protocol)}
			if other, dup := nodePorts[key]; dup {
				what := fmt.Sprintf("used by Service %s/%s (%s)", other.ref.namespace, other.ref.name, m.origins[objectKey{"Service", other.ref}])
				if other.index < 0 {
					what = usedBy(other)
				}
				problem(fmt.Sprintf("spec.ports[%d].nodePort", i), fmt.Errorf("node port %d/%s is also %s", key.port, key.proto, what))
				continue
			}
			nodePorts[key] = portUser{ref, i}
			shared(at, ref, fmt.Sprintf("spec.ports[%d].nodePort", i), p.NodePort, "a "+string(key.proto)+" node port", false)
		}
		// The health check listens on TCP, whatever the Service's
		// protocols: a UDP or SCTP node port of the same number is no
		// collision here (as two node ports of different protocols are
		// not).
		if hc := servedHealthCheckNodePort(svc); hc != 0 {
			key := nodePort{hc, corev1.ProtocolTCP}
			if other, dup := nodePorts[key]; dup {
				problem("spec.healthCheckNodePort", fmt.Errorf("health check node port %d is also %s", hc, usedBy(other)))
			} else {
				nodePorts[key] = portUser{ref, -1}
				shared(at, ref, "spec.healthCheckNodePort", hc, "the health check node port", true)
			}
		}
	}

	m.clusterIPsShared()

	named := make(map[objectRef]bool) // Services some slice names
	for _, s := range m.slices {
		named[objectRef{s.Namespace, s.Labels[discoveryv1.LabelServiceName]}] = true
	}
	for _, svc := range m.services {
		ref := objectRef{svc.Namespace, svc.Name}
		if _, skipped := skipReason(svc, ""); named[ref] || len(svc.Spec.Selector) == 0 || skipped != "" {
			continue
		}
		at := m.origins[objectKey{"Service", ref}]
		m.warnings = append(m.warnings, m.problem(at, "Service", ref, "spec.selector",
			fmt.Errorf("selects pods, which only a cluster has, and no EndpointSlice in the file has label %s: %s; it has no endpoints, and its connections are reset",
				discoveryv1.LabelServiceName, ref.name)))
	}

	for _, s := range m.slices {
		ref := objectRef{s.Namespace, s.Name}
		at := m.origins[objectKey{"EndpointSlice", ref}]
		warn := func(field string, err error) {
			m.warnings = append(m.warnings, m.problem(at, "EndpointSlice", ref, field, err))
		}
		svcName := s.Labels[discoveryv1.LabelServiceName]
		if s.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		svcPorts, found := ports[objectRef{s.Namespace, svcName}]
		if !found {
			warn("metadata.labels", fmt.Errorf("names Service %s/%s, which is not in the file", s.Namespace, svcName))
			continue
		}
		for i, p := range s.Ports {
			if p.Port == nil {
				continue // warned about already
			}
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = orTCP(*p.Protocol)
			}
			if field, err := portMismatch(svcPorts, name, proto, s.Namespace, svcName); err != nil {
				warn(fmt.Sprintf("ports[%d]%s", i, field), err)
			}
		}
	}
}

// portKey is how portMismatch finds a port: its name and protocol.
func portKey(name string, proto corev1.Protocol) string {
	return name + "/" + string(proto)
}

// portMismatch says why an EndpointSlice port named name with protocol
// proto feeds no port of Service ns/svc, whose spec.ports have the keys
// svcPorts (see portKey), or returns nil when it matches one. field is
// what to append to the slice port's path. Manifest checks and
// BuildSnapshot (for the objects of an API server) report it alike.
func portMismatch(svcPorts map[string]bool, name string, proto corev1.Protocol, ns, svc string) (field string, err error) {
	if svcPorts[portKey(name, proto)] {
		return "", nil
	}
	for _, pr := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP} {
		if pr != proto && svcPorts[portKey(name, pr)] {
			return ".protocol", fmt.Errorf("port %q is %s here but %s in Service %s/%s, so it matches nothing (a slice port without a protocol is TCP)",
				name, proto, pr, ns, svc)
		}
	}
	return "", fmt.Errorf("port name %q with protocol %s matches no port of Service %s/%s (ports are matched by name; an unnamed port is \"\")",
		name, proto, ns, svc)
}

// clusterIPsShared reports cluster IPs given to more than one Service. In a
// cluster the allocator gives each Service its own. Two Services with the
// same address and a port and protocol in common cannot both be served
// there: that is an error. Sharing the address alone works here, but a
// cluster would refuse the second Service, so it is a warning.
func (m *manifest) clusterIPsShared() {
	type frontend struct {
		ip    netip.Addr
		port  int32
		proto corev1.Protocol
	}
	owners := make(map[netip.Addr]objectRef)
	frontends := make(map[frontend]objectRef)
	for _, svc := range m.services {
		ref := objectRef{svc.Namespace, svc.Name}
		at := m.origins[objectKey{"Service", ref}]
		problem := func(field string, err error) *ObjectError { return m.problem(at, "Service", ref, field, err) }
		raw, _ := rawClusterIPs(svc)
		if isHeadless(svc) {
			raw = nil
		}
		for _, s := range raw {
			ip, err := parseIP(s)
			if err != nil {
				continue // reported by validateService
			}
			ip = ip.Unmap()
			conflict := false
			for i, p := range svc.Spec.Ports {
				key := frontend{ip, p.Port, orTCP(p.Protocol)}
				if other, dup := frontends[key]; dup {
					m.errs = append(m.errs, problem(fmt.Sprintf("spec.ports[%d]", i),
						fmt.Errorf("%s is also served by Service %s/%s (%s): cluster IP %s is given to both",
							net.JoinHostPort(ip.String(), strconv.Itoa(int(p.Port)))+"/"+string(key.proto),
							other.namespace, other.name, m.origins[objectKey{"Service", other}], ip)))
					conflict = true
					continue
				}
				frontends[key] = ref
			}
			if other, dup := owners[ip]; dup && !conflict {
				m.warnings = append(m.warnings, problem("spec.clusterIP",
					fmt.Errorf("%s is also the cluster IP of Service %s/%s (%s); a cluster gives each Service its own",
						ip, other.namespace, other.name, m.origins[objectKey{"Service", other}])))
			} else if !dup {
				owners[ip] = ref
			}
		}
	}
}
