package userspace

import (
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// endpointPool says which of a Service's endpoints a balancer picks from,
// as its traffic policies make them.
type endpointPool struct {
	desc  string
	local bool // this node's endpoints only
}

// fromHostPool is the pool of external traffic from this node or its pods
// to a Service with externalTrafficPolicy: Local.
var fromHostPool = endpointPool{desc: "the Service's endpoints: externalTrafficPolicy: Local does not apply to traffic from this node or its pods"}

// explainPick logs, at -v=4, why a new connection or UDP session from
// client, through a socket of role r, went to endpoint ep: which of the
// Service's endpoints b picks from (its traffic policies), how it chose
// among them (round robin, ClientIP affinity, failover past endpoints that
// just failed or refused) and what made ep eligible (readiness, topology
// hints). attempt counts the connection's dials (or the session's
// endpoints) so far, this one included. It is what a person learning
// Service networking asks first ("why did my request land on that pod?"),
// answered from the balancer's own state.
func (sp *servicePort) explainPick(b *balancer, r socketRole, client, ep netip.AddrPort, why pickWhy, attempt int) {
	set, _ := b.setOf(client.Addr())
	aff := b.aff.Load()
	failed := "failed to connect"
	if sp.proto == state.UDP {
		failed = "refused (ICMP port unreachable)"
	}
	var how []string
	switch why {
	case pickedAffinity:
		how = append(how, fmt.Sprintf("ClientIP session affinity: the endpoint this client was sent to before, kept while it comes back within %v", aff.TTL()))
	case pickedMoved:
		how = append(how, "kept the endpoint of the session this client had on the proxy port the service port moved from (a renamed port, or a changed traffic policy), as kube-proxy's conntrack entry keeps such a flow on its pod")
		if aff.Sticky() && client.Addr().IsValid() {
			how = append(how, fmt.Sprintf("ClientIP session affinity sends this client here from now on, while it comes back within %v", aff.TTL()))
		}
	default:
		rr := fmt.Sprintf("round robin: next in turn of %d", len(set.addrs))
		if why == pickedPastFailures {
			rr += ", passing over endpoints that " + failed + " just now"
		}
		how = append(how, rr)
		if aff.Sticky() && client.Addr().IsValid() {
			how = append(how, fmt.Sprintf("ClientIP session affinity sends this client here from now on, while it comes back within %v", aff.TTL()))
		}
	}
	if attempt > 1 {
		before := failed
		if sp.proto != state.UDP {
			// A dial whose time ran out goes on connecting (dialTimedOut).
			before += " or ran out of time (those still connecting race this one)"
		}
		how = append(how, fmt.Sprintf("attempt %d: the %d before %s", attempt, attempt-1, before))
	}
	pool := endpointPool{desc: "the Service's endpoints"}
	if p := b.pool.Load(); p != nil {
		pool = *p
	}
	if r.external() && b == sp.fromHost.Load() {
		pool = fromHostPool
	}
	if i, ok := set.index[ep]; ok {
		how = append(how, eligible(set.eps[i], pool.local)...)
	}
	klog.InfoS("Chose endpoint", "service", sp.name, "client", client, "endpoint", ep, "from", pool.desc, "why", strings.Join(how, "; "))
}

// eligible says what made e one of the endpoints of a pool (of this node's
// endpoints only, when local) picked from, where that is not plain
// readiness.
func eligible(e state.Endpoint, local bool) []string {
	var out []string
	if !e.Ready {
		left := "no ready endpoint is left"
		if local {
			left = "no ready endpoint is left on this node"
		}
		out = append(out, "it is terminating but still serving, and "+left+" (KEP-1669)")
	}
	if e.Topology != "" {
		out = append(out, "topology hints: only endpoints hinted for "+e.Topology+" are used here")
	}
	return out
}

// describePools tells each of sp's balancers, for explainPick, which of
// the Service's endpoints it picks from, as spec's traffic policies make
// them.
func (sp *servicePort) describePools(spec *state.ServicePort) {
	say := func(b *balancer, p endpointPool) {
		if b != nil {
			b.pool.Store(&p)
		}
	}
	external, fromHost := sp.external.Load(), sp.fromHost.Load()
	switch {
	case spec.InternalLocal && spec.ExternalLocal:
		say(sp.internal, endpointPool{"this node's endpoints (internalTrafficPolicy and externalTrafficPolicy: Local)", true})
	case spec.InternalLocal:
		say(sp.internal, endpointPool{"this node's endpoints (internalTrafficPolicy: Local)", true})
	default:
		say(sp.internal, endpointPool{"the Service's endpoints", false})
	}
	if external != sp.internal {
		if spec.ExternalLocal {
			say(external, endpointPool{"this node's endpoints (externalTrafficPolicy: Local)", true})
		} else {
			say(external, endpointPool{"the Service's endpoints (internalTrafficPolicy: Local is for cluster IPs only)", false})
		}
	}
	if fromHost != nil && fromHost != sp.internal {
		say(fromHost, fromHostPool)
	}
}
