package proxyserver

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// debugView answers /debug/services: for every service port, what the
// proxy serves and how traffic reaches it, as plain text for people
// learning or debugging Service networking. It shows the last snapshot
// applied, the listeners, and the portals that steer traffic to them.
type debugView struct {
	p       *userspace.Proxier
	portals func(state.Snapshot) []portal.Portal // the portals a snapshot gives; nil when no portal redirects
	dnat    func(portal.Family) netip.Addr       // the iptables portal's DNAT target (see dnatTargets); nil for others
	mode    string                               // the portal mode
	cluster bool                                 // the source is an API server, not a manifest file
	pods    []netip.Prefix                       // --cluster-cidr

	last   atomic.Pointer[debugSnapshot]
	source atomic.Pointer[sourceStatus]
}

// sourceStatus is what came of the source's last read.
type sourceStatus struct {
	at       time.Time
	rejected error   // why the manifest file was refused; nil when it was taken
	warnings []error // the manifest file's warnings
	ignored  []error // what of the objects read is left unused
}

// sourceRead records what came of the source's read: of the manifest
// file (source.Manifests.Status), where a refusal stays shown until the
// file is taken again, or of the API server's objects (through
// clusterRead).
func (d *debugView) sourceRead(rejected error, warnings, ignored []error) {
	d.source.Store(&sourceStatus{at: time.Now(), rejected: rejected, warnings: warnings, ignored: ignored})
}

// clusterRead records what of the API server's objects is left unused
// (see source.Cluster.Ignored).
func (d *debugView) clusterRead(ignored []error) { d.sourceRead(nil, nil, ignored) }

type debugSnapshot struct {
	snap state.Snapshot
	at   time.Time
	err  error     // what the sync reported
	good time.Time // when the last sync that worked ended; zero if none has
}

// applied records the snapshot a sync applied, and its errors.
func (d *debugView) applied(s state.Snapshot, err error) {
	now := time.Now()
	last := &debugSnapshot{snap: s, at: now, err: err, good: now}
	if err != nil {
		last.good = time.Time{}
		if prev := d.last.Load(); prev != nil {
			last.good = prev.good
		}
	}
	d.last.Store(last)
}

func (d *debugView) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	last := d.last.Load()
	if last == nil {
		fmt.Fprintln(w, "Nothing applied yet: the source has not synced.")
		return
	}
	d.write(w, last)
}

func (d *debugView) write(w io.Writer, last *debugSnapshot) {
	activity := d.p.Activity()
	listeners := map[state.ServicePortName][]userspace.Listener{}
	for _, l := range d.p.Listeners() {
		listeners[l.Service] = append(listeners[l.Service], l)
	}
	portals := map[state.ServicePortName][]portal.Portal{}
	if d.portals != nil {
		for _, pt := range d.portals(last.snap) {
			portals[pt.Service] = append(portals[pt.Service], pt)
		}
	}
	var portalFailed bool
	if last.err == nil {
		fmt.Fprintf(w, "%d service ports, portal %s, applied %s\n", last.snap.Len(), d.mode, last.at.Format(time.RFC3339))
	} else {
		good := "none has yet"
		if !last.good.IsZero() {
			good = "the last that did ended " + last.good.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%d service ports, portal %s, last sync %s failed (%s)\n", last.snap.Len(), d.mode, last.at.Format(time.RFC3339), good)
		fmt.Fprintf(w, "The last sync failed, and is retried: %v\n", last.err)
		portalFailed = errors.As(last.err, new(kernelError))
	}
	if st := d.source.Load(); st != nil {
		problems := func(errs ...error) {
			for i, e := range errs {
				if i == 20 {
					fmt.Fprintf(w, "  ... and %d more (see the log)\n", len(errs)-i)
					break
				}
				for line := range strings.SplitSeq(e.Error(), "\n") {
					fmt.Fprintf(w, "  %s\n", line)
				}
			}
		}
		if st.rejected != nil {
			fmt.Fprintf(w, "The manifest file's last edit was rejected (%s); the last good state below still serves:\n", st.at.Format(time.RFC3339))
			problems(st.rejected)
		} else {
			// As the log has them: warnings, some of which say what
			// they skip, then what is left unused.
			if len(st.warnings) > 0 {
				fmt.Fprintln(w, "Warnings about the manifest file:")
				problems(st.warnings...)
			}
			if len(st.ignored) > 0 {
				if d.cluster {
					fmt.Fprintln(w, "Parts of objects from the API server are ignored:")
				} else {
					fmt.Fprintln(w, "Parts of the manifest file are ignored:")
				}
				problems(st.ignored...)
			}
		}
	}
	failed := failuresByPort(last.err)
	var hostAddrs []netip.Addr // for the sources a load-balancer IP admits
	for sp := range last.snap.All {
		if len(sp.LoadBalancerSourceRanges) > 0 {
			hostAddrs, _ = userspace.HostAddrs()
			break
		}
	}
	for sp := range last.snap.All {
		fmt.Fprintf(w, "\n%s\n", sp.Name)
		line := func(what, format string, args ...any) {
			fmt.Fprintf(w, "  %-13s %s\n", what+":", fmt.Sprintf(format, args...))
		}
		var fronts []string
		for _, f := range sp.Frontends() {
			fronts = append(fronts, f.String())
		}
		if sp.NodePort != 0 {
			fronts = append(fronts, fmt.Sprintf("node port %d", sp.NodePort))
		}
		line("frontends", "%s", orNone(fronts))
		if d.mode == PortalNone && len(sp.Frontends()) > 0 {
			line("note", "portal none captures no frontend address: clients use the proxy port (or the node port)")
		}
		if len(sp.LoadBalancerIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0 {
			for _, ip := range sp.LoadBalancerIPs {
				if r := sp.SourceRanges(ip, hostAddrs); r != nil {
					line("sources", "%s admits only %s", ip, joinPrefixes(r))
				}
			}
		}
		if sp.Affinity.Sticky() {
			line("affinity", "ClientIP, %v", sp.Affinity.TTL())
		} else {
			line("affinity", "none: round robin")
		}
		switch {
		case sp.ProxyProtocol == state.ProxyProtocolNone:
		case sp.Name.Protocol == state.TCP:
			line("proxy header", "PROXY protocol %s: each connection to an endpoint starts with one, naming the client and the frontend it addressed", sp.ProxyProtocol)
		default:
			line("proxy header", "PROXY protocol %s asked for, not sent: it is sent on TCP ports only", sp.ProxyProtocol)
		}
		policy := func(local bool) string {
			if local {
				return "Local"
			}
			return "Cluster"
		}
		line("policies", "internal %s, external %s", policy(sp.InternalLocal), policy(sp.ExternalLocal))
		external := sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
		line("endpoints", "%s", d.endpointList(sp, sp.InternalEndpoints(), external && sp.ExternalLocal && sp.InternalLocal))
		if why := sp.TopologyHintsIgnored; why != "" {
			if slices.ContainsFunc(sp.ClusterEndpoints, func(e state.Endpoint) bool { return e.Topology != "" }) {
				line("topology", "%s (other hints are used: see endpoints)", why)
			} else {
				line("topology", "hints present but not used, so every ready endpoint takes traffic: %s", why)
			}
		}
		if has4, has6 := sp.Families(); has4 && has6 {
			for _, note := range d.familyNotes(sp, external) {
				line("note", "%s", note)
			}
		}
		if external && sp.InternalLocal != sp.ExternalLocal {
			line("external to", "%s", d.endpointList(sp, sp.ExternalEndpoints(), sp.ExternalLocal))
		}
		if external && sp.ExternalLocal {
			if len(d.pods) > 0 {
				line("node & pods", "external traffic from this node or from pods (%s) goes to every endpoint: %s", joinPrefixes(d.pods), d.endpointList(sp, sp.ClusterEndpoints, false))
			} else {
				line("node & pods", "external traffic from this node goes to every endpoint (from pods too, given --cluster-cidr): %s", d.endpointList(sp, sp.ClusterEndpoints, false))
			}
		}
		if sp.HealthCheckNodePort != 0 {
			if d.portals != nil {
				line("health check", "node port %d (accepted in KUBE-NODEPORT-NON-LOCAL)", sp.HealthCheckNodePort)
			} else {
				line("health check", "node port %d", sp.HealthCheckNodePort)
			}
		}
		var ls []string
		for _, l := range listeners[sp.Name] {
			ls = append(ls, fmt.Sprintf("%s (%s)", l.Addr, l.Role))
		}
		if len(ls) == 0 {
			line("listening", "%s", d.notListening(sp.Name, failed))
		} else {
			line("listening", "%s", strings.Join(ls, ", "))
		}
		if a := activity[sp.Name]; sp.Name.Protocol == state.UDP {
			line("carried", "%s, %d open", count(a.UDPSessions, "UDP session"), a.OpenUDPSessions)
		} else if a.GaveUp > 0 {
			line("carried", "%s, %d open; %d reset after every dial attempt failed", count(a.Connections, "connection"), a.OpenConnections, a.GaveUp)
		} else {
			line("carried", "%s, %d open", count(a.Connections, "connection"), a.OpenConnections)
		}
		if d.portals != nil {
			var ps []string
			for _, pt := range portals[sp.Name] {
				if pt.ProxyPort == 0 {
					continue // no proxy port to redirect to: no rule
				}
				s := pt.String()
				if d.dnat != nil {
					if a := d.dnat(pt.Family); a.IsValid() {
						s = strings.Replace(s, fmt.Sprintf(" -> :%d", pt.ProxyPort), " -> "+netip.AddrPortFrom(a, pt.ProxyPort).String()+" (DNAT)", 1)
					}
				}
				if pt.SourceRanges != nil {
					s += " from " + joinPrefixes(pt.SourceRanges)
				}
				switch {
				case pt.Reject:
					s += " (refused: no " + pt.Family.String() + " endpoint)"
				case pt.NoLocal && pt.Kind == portal.ClusterIP:
					s += " (dropped: no " + pt.Family.String() + " endpoint on this node)"
				case pt.NoLocal && d.hasPods(pt.Family):
					s += " (dropped but from this node and pods: no " + pt.Family.String() + " endpoint on this node)"
				case pt.NoLocal:
					s += " (dropped but from this node: no " + pt.Family.String() + " endpoint on this node)"
				}
				ps = append(ps, s)
			}
			if portalFailed && len(ps) > 0 {
				line("redirects", "%s (wanted: the portal's last sync failed, so the kernel may still hold the rules of the last one that worked)", strings.Join(ps, ", "))
			} else {
				line("redirects", "%s", orNone(ps))
			}
		}
	}
	// Connections outlive the service port they came through (its
	// Service deleted, a port renamed): counted here, or the open figures
	// above would add up to less than tcp_connections_active.
	st := d.p.Stats()
	gone := st.TCPActive.Load() + st.SCTPActive.Load()
	for _, a := range activity {
		gone -= a.OpenConnections
	}
	if gone > 0 {
		fmt.Fprintf(w, "\n%s of service ports no longer served still open: they go on until either side closes, as under kube-proxy\n", count(gone, "connection"))
	}
}

// hasPods reports whether --cluster-cidr has a CIDR of family f.
func (d *debugView) hasPods(f portal.Family) bool {
	return slices.ContainsFunc(d.pods, func(p netip.Prefix) bool { return portal.FamilyOf(p.Addr()) == f })
}

// turnedAway says what becomes of sp's new connections that have no
// endpoint to go to, with this portal (see userspace.TurnedAway): elsewhere
// says sp has endpoints for them on other nodes only.
func (d *debugView) turnedAway(sp *state.ServicePort, elsewhere bool) string {
	return userspace.TurnedAway(sp.Name.Protocol, d.portals != nil, elsewhere)
}

// fromHere says where external traffic that starts on this node, or in a
// pod of family f (--cluster-cidr), goes under externalTrafficPolicy:
// Local.
func (d *debugView) fromHere(f portal.Family) string {
	if d.hasPods(f) {
		return "traffic from this node, and from pods (--cluster-cidr), to node and external addresses goes to every endpoint"
	}
	return "traffic from this node to node and external addresses goes to every endpoint (from pods too, given --cluster-cidr)"
}

// familyNotes says, for a dual-stack port, what becomes of the clients of
// an IP family that the endpoints their traffic may use lack (a client goes
// only to endpoints of its own family): refused when the port has none of
// that family, else, under a Local traffic policy, turned away as the
// policy's traffic is (internal: to the cluster IP; external: to node
// ports and external addresses, with external saying the port has those).
// A policy with no endpoints at all is said on its own line.
func (d *debugView) familyNotes(sp *state.ServicePort, external bool) []string {
	if !sp.HasEndpoints() {
		return nil
	}
	var out []string
	for _, f := range []portal.Family{portal.IPv4, portal.IPv6} {
		has := func(eps []state.Endpoint) bool {
			return slices.ContainsFunc(eps, func(e state.Endpoint) bool { return portal.FamilyOf(e.Addr.Addr()) == f })
		}
		lacks := func(eps []state.Endpoint) bool { return len(eps) > 0 && !has(eps) }
		internal, ext := lacks(sp.InternalEndpoints()), external && lacks(sp.ExternalEndpoints())
		switch {
		case !has(sp.ClusterEndpoints) && !has(sp.LocalEndpoints):
			out = append(out, fmt.Sprintf("no %s endpoint: from %s clients, %s (a client goes only to endpoints of its own IP family)", f, f, d.turnedAway(sp, false)))
		case internal && (ext || !external):
			s := fmt.Sprintf("no %s endpoint on this node: from %s clients, %s", f, f, d.turnedAway(sp, true))
			if external {
				s += " (" + d.fromHere(f) + ")"
			}
			out = append(out, s)
		case internal:
			out = append(out, fmt.Sprintf("no %s endpoint on this node: from %s clients of the cluster IP (internalTrafficPolicy: Local), %s; node-port and external traffic goes to every endpoint", f, f, d.turnedAway(sp, true)))
		case ext:
			out = append(out, fmt.Sprintf("no %s endpoint on this node: from %s clients of node ports and external addresses (externalTrafficPolicy: Local), %s (%s, as cluster-IP traffic does)", f, f, d.turnedAway(sp, true), d.fromHere(f)))
		}
	}
	return out
}

// endpointList describes eps, the endpoints sp sends some traffic to, or
// what happens to that traffic when there are none. external says eps are
// those of external traffic under externalTrafficPolicy: Local, of which
// what starts on this node or in a pod goes to every endpoint.
func (d *debugView) endpointList(sp *state.ServicePort, eps []state.Endpoint, external bool) string {
	if len(eps) == 0 {
		switch {
		case !sp.HasEndpoints():
			return "none: " + d.turnedAway(sp, false)
		case external && len(d.pods) > 0:
			return "none on this node: " + d.turnedAway(sp, true) + ", but external traffic from this node and from pods goes to every endpoint (see node & pods)"
		case external:
			return "none on this node: " + d.turnedAway(sp, true) + ", but external traffic from this node (from pods too, given --cluster-cidr) goes to every endpoint (see node & pods)"
		}
		return "none on this node: " + d.turnedAway(sp, true)
	}
	var out []string
	for _, e := range eps {
		s := e.Addr.String()
		var notes []string
		if e.Local {
			notes = append(notes, "this node")
		}
		if !e.Ready {
			notes = append(notes, "not ready: serving while terminating")
		}
		if e.Topology != "" {
			notes = append(notes, "hinted for "+e.Topology+": topology hints keep this node's traffic to those")
		}
		if len(notes) > 0 {
			s += " (" + strings.Join(notes, ", ") + ")"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

// notListening says why service port name has no socket: its protocol
// is not served here, or the last sync failed for it (failed, from
// failuresByPort).
func (d *debugView) notListening(name state.ServicePortName, failed map[state.ServicePortName]error) string {
	if why := d.p.Unsupported(name); why != nil {
		return fmt.Sprintf("none: its protocol is not served here (%v)", why)
	}
	if e, ok := failed[name]; ok {
		return fmt.Sprintf("none: the last sync failed for it, and is retried: %v", e)
	}
	return "none"
}

// failuresByPort maps each service port that a failure of the sync error
// err is about (a *userspace.PortError within it, however the failure is
// worded) to the first failure about it. It reads each failure once, so a
// view costs time in proportion to its size: looking each port up in
// every failure took (failing ports)² steps, 20 s of CPU for one request
// with 9,100 ports beyond a full --proxy-port-range (xa59).
func failuresByPort(err error) map[state.ServicePortName]error {
	if err == nil {
		return nil
	}
	out := map[state.ServicePortName]error{}
	for _, e := range splitErrors(err) {
		for _, n := range failedPorts(e, nil) {
			if _, seen := out[n]; !seen {
				out[n] = e
			}
		}
	}
	return out
}

// failedPorts appends to names the service ports of the *userspace.PortError
// values in err's tree, in the order errors.As meets them.
func failedPorts(err error, names []state.ServicePortName) []state.ServicePortName {
	for err != nil {
		if pe, ok := err.(*userspace.PortError); ok {
			names = append(names, pe.Name)
		}
		switch u := err.(type) {
		case *multierror.Error: // its Unwrap hides all but the first
			for _, e := range u.Errors {
				names = failedPorts(e, names)
			}
			return names
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				names = failedPorts(e, names)
			}
			return names
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		default:
			return names
		}
	}
	return names
}

func joinPrefixes(ps []netip.Prefix) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, ", ")
}

func orNone(items []string) string {
	if len(items) == 0 {
		return "none"
	}
	return strings.Join(items, ", ")
}

// count says how many of thing there are: "1 connection", "2 connections".
func count[N int | int64 | uint64](n N, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
