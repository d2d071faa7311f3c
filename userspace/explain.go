package userspace

import (
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// explainPick logs, at -v=4, why a new connection or UDP session from
// client went to endpoint ep: which of the Service's endpoints b picks
// from (its traffic policies), how it chose among them (round robin,
// ClientIP affinity, failover past endpoints that just failed) and what
// made ep eligible (readiness, topology hints). attempt counts the
// connection's dials so far, this one included. It is what a person
// learning Service networking asks first ("why did my request land on
// that pod?"), answered from the balancer's own state.
func (sp *servicePort) explainPick(b *balancer, client, ep netip.AddrPort, why pickWhy, attempt int) {
	set, _ := b.setOf(client.Addr())
	aff := b.aff.Load()
	var how []string
	switch why {
	case pickedAffinity:
		how = append(how, fmt.Sprintf("ClientIP session affinity: the endpoint this client was sent to before, kept while it comes back within %v", aff.TTL()))
	default:
		rr := fmt.Sprintf("round robin: next in turn of %d", len(set.addrs))
		if why == pickedPastFailures {
			rr += ", passing over endpoints whose connections failed just now"
		}
		how = append(how, rr)
		if aff.Sticky() && client.Addr().IsValid() {
			how = append(how, fmt.Sprintf("ClientIP session affinity sends this client here from now on, while it comes back within %v", aff.TTL()))
		}
	}
	if attempt > 1 {
		how = append(how, fmt.Sprintf("attempt %d: the %d before failed to connect", attempt, attempt-1))
	}
	if i, ok := set.index[ep]; ok {
		how = append(how, eligible(set.eps[i])...)
	}
	pool := "the Service's endpoints"
	if p := b.pool.Load(); p != nil {
		pool = *p
	}
	klog.InfoS("Chose endpoint", "service", sp.name, "client", client, "endpoint", ep, "from", pool, "why", strings.Join(how, "; "))
}

// eligible says what made e one of the endpoints picked from, where that
// is not plain readiness.
func eligible(e state.Endpoint) []string {
	var out []string
	if !e.Ready {
		out = append(out, "it is terminating but still serving, and no ready endpoint is left (KEP-1669)")
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
	say := func(b *balancer, s string) {
		if b != nil {
			b.pool.Store(&s)
		}
	}
	external, fromHost := sp.external.Load(), sp.fromHost.Load()
	switch {
	case spec.InternalLocal && spec.ExternalLocal:
		say(sp.internal, "this node's endpoints (internalTrafficPolicy and externalTrafficPolicy: Local)")
	case spec.InternalLocal:
		say(sp.internal, "this node's endpoints (internalTrafficPolicy: Local)")
	default:
		say(sp.internal, "the Service's endpoints")
	}
	if external != sp.internal {
		if spec.ExternalLocal {
			say(external, "this node's endpoints (externalTrafficPolicy: Local)")
		} else {
			say(external, "the Service's endpoints (internalTrafficPolicy: Local is for cluster IPs only)")
		}
	}
	if fromHost != nil && fromHost != sp.internal {
		say(fromHost, "the Service's endpoints: externalTrafficPolicy: Local does not apply to traffic from this node or its pods")
	}
}
