package userspace

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// The edges of the balancer's rules that the broader tests in
// balancer_test.go pass over: the exact instant affinity expires, a
// sticky client's endpoint in its penalty, updates that change nothing,
// a lone endpoint's penalty, and the affinity a moved UDP session leaves.

// TestBalancerAffinityExpiresAtExactlyTheTimeout: with no sweep between
// picks, a client's affinity holds at its timeout less a nanosecond and
// is gone at exactly the timeout, as kube-proxy's, which expires an entry
// once the time since its last use is >= the timeout.
func TestBalancerAffinityExpiresAtExactlyTheTimeout(t *testing.T) {
	clock := newFakeClock()
	b := newBalancer(clock, eps(ep1, ep2), sticky)
	ep, _ := b.pick(c1, nil)
	clock.Step(sticky.TTL() - time.Nanosecond)
	if again, why, _ := b.choose(c1, nil); again != ep || why != pickedAffinity {
		t.Fatalf("at the timeout less 1ns: %s (%v), want %s by affinity", again, why, ep)
	}
	// That pick renewed the entry: the full timeout runs from it.
	clock.Step(sticky.TTL())
	if again, why, _ := b.choose(c1, nil); again == ep || why == pickedAffinity {
		t.Fatalf("at exactly the timeout: %s (%v), want the next in turn, not %s", again, why, ep)
	}
}

// TestBalancerStickyClientLeavesAnEndpointInItsPenalty: a client pinned
// to an endpoint whose dial just failed goes, while its penalty lasts, to
// another, and stays there.
func TestBalancerStickyClientLeavesAnEndpointInItsPenalty(t *testing.T) {
	b := newBalancer(newFakeClock(), eps(ep1, ep2), sticky)
	pinned, _ := b.pick(c1, nil)
	if again, _ := b.pick(c1, nil); again != pinned {
		t.Fatalf("client not pinned: %s, then %s", pinned, again)
	}
	b.penalize(pinned, time.Minute)
	moved, why, _ := b.choose(c1, nil)
	if moved == pinned || why == pickedAffinity {
		t.Fatalf("pinned client sent to %s (%v) during its penalty", moved, why)
	}
	if again, why, _ := b.choose(c1, nil); again != moved || why != pickedAffinity {
		t.Fatalf("after leaving %s: %s (%v), want %s by affinity", pinned, again, why, moved)
	}
}

// TestBalancerUpdateKeepsPenalties: an update that leaves the endpoints
// as they were (every resync) keeps their penalties; only a changed set
// starts afresh.
func TestBalancerUpdateKeepsPenalties(t *testing.T) {
	for _, aff := range []state.Affinity{{}, sticky} {
		t.Run(string(aff.Type), func(t *testing.T) {
			b := newBalancer(newFakeClock(), eps(ep1, ep2), aff)
			b.penalize(ep1, time.Minute)
			b.update(eps(ep1, ep2), aff)
			for i := range 4 {
				c := netip.AddrFrom4([4]byte{198, 19, 1, byte(i)})
				if ep, _ := b.pick(c, nil); ep != ep2 {
					t.Fatalf("pick %d after an update with the same endpoints went to %s, in its penalty", i, ep)
				}
			}
			if b.mayKeep(c1, ep1) {
				t.Fatalf("mayKeep %s after an update with the same endpoints, in its penalty", ep1)
			}
		})
	}
}

// TestBalancerLoneEndpointHasNoPenalty: a penalty passes an endpoint
// over only while others remain: a Service's only endpoint keeps taking
// sessions, moved ones too.
func TestBalancerLoneEndpointHasNoPenalty(t *testing.T) {
	b := newBalancer(newFakeClock(), eps(ep1), sticky)
	b.penalize(ep1, time.Minute)
	if !b.mayKeep(c1, ep1) {
		t.Fatalf("mayKeep refused %s, the only endpoint, in its penalty", ep1)
	}
	if ep, err := b.pick(c1, nil); err != nil || ep != ep1 {
		t.Fatalf("pick = %s, %v; want %s", ep, err, ep1)
	}
	if again, why, _ := b.choose(c1, nil); again != ep1 || why != pickedAffinity {
		t.Fatalf("second pick: %s (%v), want %s by affinity", again, why, ep1)
	}
}

// TestMovedUDPSessionPinsItsClient: on a ClientIP Service, a session
// that kept its endpoint when its proxy port moved points its client's
// affinity at that endpoint, so the client's next sessions (from other
// source ports, or after it idles out) go there too, as kube-proxy's
// affinity, which the move does not touch, keeps them; not wherever the
// new port's balancer's turn is.
func TestMovedUDPSessionPinsItsClient(t *testing.T) {
	clock := newFakeClock()
	p := &Proxier{cfg: Config{Clock: clock}}
	name := spn("ren", "domain", state.UDP)
	sp := &servicePort{p: p, name: name, proto: state.UDP}
	const from, to = 40001, 40002
	client := netip.AddrPortFrom(c1, 5353)
	p.moved.remember(spn("ren", "dns", state.UDP), []liveSession{{client: client, endpoint: ep2, left: time.Minute}}, from, clock.Now())

	b := newBalancer(clock, eps(ep1, ep2, ep3), sticky)
	b.next[0].Store(0) // round robin's next is ep1
	ep, why, err := sp.chooseUDP(b, to, client)
	if err != nil || ep != ep2 || why != pickedMoved {
		t.Fatalf("moved session: %s (%v), %v; want %s kept", ep, why, err, ep2)
	}
	other := netip.AddrPortFrom(c1, 5354)
	if ep, why, _ := sp.chooseUDP(b, to, other); ep != ep2 || why != pickedAffinity {
		t.Fatalf("the client's next session: %s (%v), want %s by affinity", ep, why, ep2)
	}
	if n := b.affinityClients(); n != 1 {
		t.Fatalf("%d clients remembered, want 1", n)
	}
}
