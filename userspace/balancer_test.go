package userspace

import (
	"errors"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

var (
	ep1 = netip.MustParseAddrPort("198.18.1.1:80")
	ep2 = netip.MustParseAddrPort("198.18.1.2:80")
	ep3 = netip.MustParseAddrPort("198.18.1.3:80")
	c1  = netip.MustParseAddr("198.19.0.1")
	c2  = netip.MustParseAddr("198.19.0.2")
	c3  = netip.MustParseAddr("198.19.0.3")
)

var sticky = state.Affinity{Type: state.AffinityClientIP, Timeout: 30 * time.Second}

func TestBalancerRoundRobin(t *testing.T) {
	tests := []struct {
		name string
		eps  []netip.AddrPort
		n    int
		want map[netip.AddrPort]int
	}{
		{name: "single", eps: []netip.AddrPort{ep1}, n: 5, want: map[netip.AddrPort]int{ep1: 5}},
		{name: "three even", eps: []netip.AddrPort{ep1, ep2, ep3}, n: 9, want: map[netip.AddrPort]int{ep1: 3, ep2: 3, ep3: 3}},
		{name: "duplicates collapse", eps: []netip.AddrPort{ep1, ep1, ep2}, n: 4, want: map[netip.AddrPort]int{ep1: 2, ep2: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBalancer(newFakeClock(), eps(tc.eps...), state.Affinity{})
			got := map[netip.AddrPort]int{}
			var prev netip.AddrPort
			for range tc.n {
				ep, err := b.pick(c1, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(tc.want) > 1 && ep == prev {
					t.Fatalf("round robin returned %s twice in a row", ep)
				}
				prev = ep
				got[ep]++
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// TestBalancerKeepsFamilies: clients of each family take turns over that
// family's endpoints only, each family in even rounds however the
// clients interleave; a failed endpoint is passed over within its family,
// and sticky clients keep to their family.
func TestBalancerKeepsFamilies(t *testing.T) {
	ep6a := netip.MustParseAddrPort("[fd5e:b1b5:1::1]:80")
	ep6b := netip.MustParseAddrPort("[fd5e:b1b5:1::2]:80")
	c6 := netip.MustParseAddr("fd5e:b1b5:2::1")
	mapped := netip.MustParseAddr("::ffff:198.19.0.9")
	b := newBalancer(newFakeClock(), eps(ep6a, ep1, ep6b, ep2), state.Affinity{})
	got := map[netip.AddrPort]int{}
	for range 4 {
		for _, c := range []netip.Addr{c1, c6, mapped} {
			ep, err := b.pick(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			if ep.Addr().Is4() != c.Unmap().Is4() {
				t.Fatalf("client %s sent to %s, of the other family", c, ep)
			}
			got[ep]++
		}
	}
	if got[ep1] != 4 || got[ep2] != 4 || got[ep6a] != 2 || got[ep6b] != 2 {
		t.Fatalf("picks %v, want 4 per IPv4 endpoint and 2 per IPv6 one", got)
	}

	b.penalize(ep6a, time.Minute)
	for range 3 {
		if ep, _ := b.pick(c6, nil); ep != ep6b {
			t.Fatalf("picked %s during %s's penalty, want %s", ep, ep6a, ep6b)
		}
	}

	b.update(eps(ep1), sticky)
	if _, err := b.pick(c6, nil); !errors.Is(err, ErrNoEndpoints) {
		t.Fatalf("IPv6 client with only IPv4 endpoints: %v, want ErrNoEndpoints", err)
	}
	b.update(eps(ep1, ep6a), sticky)
	if ep, _ := b.pick(c6, nil); ep != ep6a {
		t.Fatalf("IPv6 client sent to %s", ep)
	}
	if ep, _ := b.pick(c1, nil); ep != ep1 {
		t.Fatalf("IPv4 client sent to %s", ep)
	}
	if n := b.affinityClients(); n != 2 {
		t.Fatalf("%d clients remembered, want 2", n)
	}
	b.update(eps(ep1), sticky)
	if n := b.affinityClients(); n != 1 {
		t.Fatalf("%d clients remembered after the IPv6 endpoint left, want 1", n)
	}
}

func TestBalancerNoEndpoints(t *testing.T) {
	b := newBalancer(newFakeClock(), nil, sticky)
	if _, err := b.pick(c1, nil); !errors.Is(err, ErrNoEndpoints) {
		t.Fatalf("pick with no endpoints: %v, want ErrNoEndpoints", err)
	}
	b.update(eps(ep1), sticky)
	if ep, err := b.pick(c1, nil); err != nil || ep != ep1 {
		t.Fatalf("pick after update = %s, %v", ep, err)
	}
	b.update(nil, sticky)
	if _, err := b.pick(c1, nil); !errors.Is(err, ErrNoEndpoints) {
		t.Fatalf("pick after scale to zero: %v, want ErrNoEndpoints", err)
	}
}

func TestBalancerAffinity(t *testing.T) {
	clock := newFakeClock()
	b := newBalancer(clock, eps(ep1, ep2, ep3), sticky)
	first := map[netip.Addr]netip.AddrPort{}
	for _, c := range []netip.Addr{c1, c2, c3} {
		ep, _ := b.pick(c, nil)
		first[c] = ep
	}
	if first[c1] == first[c2] || first[c2] == first[c3] || first[c1] == first[c3] {
		t.Fatalf("new clients were not spread round robin: %v", first)
	}
	for range 10 {
		for _, c := range []netip.Addr{c1, c2, c3} {
			if ep, _ := b.pick(c, nil); ep != first[c] {
				t.Fatalf("client %s moved from %s to %s", c, first[c], ep)
			}
		}
	}

	t.Run("removing an endpoint rehomes only its clients", func(t *testing.T) {
		var keep []netip.AddrPort
		for _, e := range []netip.AddrPort{ep1, ep2, ep3} {
			if e != first[c1] {
				keep = append(keep, e)
			}
		}
		b.update(eps(keep...), sticky)
		moved, _ := b.pick(c1, nil)
		if moved == first[c1] {
			t.Fatalf("c1 still sent to removed endpoint %s", moved)
		}
		for _, c := range []netip.Addr{c2, c3} {
			if ep, _ := b.pick(c, nil); ep != first[c] {
				t.Fatalf("client %s moved from %s to %s after an unrelated removal", c, first[c], ep)
			}
		}
		b.update(eps(ep1, ep2, ep3), sticky)
		for _, c := range []netip.Addr{c2, c3} {
			if ep, _ := b.pick(c, nil); ep != first[c] {
				t.Fatalf("client %s moved after an endpoint was added", c)
			}
		}
		first[c1] = moved
	})

	t.Run("failed dial replaces affinity", func(t *testing.T) {
		dead := first[c2]
		ep, _ := b.pick(c2, []netip.AddrPort{dead})
		if ep == dead {
			t.Fatalf("failover picked the failed endpoint %s again", dead)
		}
		if again, _ := b.pick(c2, nil); again != ep {
			t.Fatalf("after failover c2 went to %s, want the new choice %s", again, ep)
		}
	})

	t.Run("expiry with an injected clock", func(t *testing.T) {
		b := newBalancer(clock, eps(ep1, ep2), sticky)
		ep, _ := b.pick(c1, nil)
		clock.Step(29 * time.Second)
		if again, _ := b.pick(c1, nil); again != ep {
			t.Fatal("affinity expired early")
		}
		// The timeout slides with use: 29 s later it still holds.
		clock.Step(29 * time.Second)
		if again, _ := b.pick(c1, nil); again != ep {
			t.Fatal("affinity did not slide with use")
		}
		clock.Step(30 * time.Second)
		b.sweep()
		if n := b.affinityClients(); n != 0 {
			t.Fatalf("sweep kept %d expired clients", n)
		}
		// Expired: the next pick is plain round robin, which moves on.
		next, _ := b.pick(c1, nil)
		if next == ep {
			t.Fatalf("client kept %s after its affinity expired", ep)
		}
	})

	t.Run("timeout change on a live service takes effect", func(t *testing.T) {
		b := newBalancer(clock, eps(ep1, ep2), state.Affinity{Type: state.AffinityClientIP, Timeout: 3 * time.Hour})
		ep, _ := b.pick(c1, nil)
		clock.Step(2 * time.Minute)
		if again, _ := b.pick(c1, nil); again != ep {
			t.Fatal("affinity lost under a 3h timeout")
		}
		b.update(eps(ep1, ep2), state.Affinity{Type: state.AffinityClientIP, Timeout: 10 * time.Second})
		clock.Step(11 * time.Second)
		if again, _ := b.pick(c1, nil); again == ep {
			t.Fatal("the shorter timeout set on the live service was ignored (kubernetes/kubernetes#107398)")
		}
	})

	t.Run("switching affinity off and on", func(t *testing.T) {
		b := newBalancer(clock, eps(ep1, ep2), sticky)
		ep, _ := b.pick(c1, nil)
		b.update(eps(ep1, ep2), state.Affinity{Type: state.AffinityNone})
		if n := b.affinityClients(); n != 0 {
			t.Fatalf("%d clients remembered under affinity None, want none", n)
		}
		a, _ := b.pick(c1, nil)
		bb, _ := b.pick(c1, nil)
		if a == bb {
			t.Fatalf("affinity None still pinned the client to %s", a)
		}
		// Switched back on, the client is pinned afresh, in turn: after
		// the three picks so far, to the endpoint it did not have.
		b.update(eps(ep1, ep2), sticky)
		pinned, why, _ := b.choose(c1, nil)
		if pinned == ep || why == pickedAffinity {
			t.Fatalf("affinity switched back on sent c1 to %s (%v), which it had before None; want the next in turn", pinned, why)
		}
		for range 5 {
			if again, _ := b.pick(c1, nil); again != pinned {
				t.Fatal("affinity switched back on does not pin")
			}
		}
	})
}

func TestBalancerConcurrentPicks(t *testing.T) {
	b := newBalancer(newFakeClock(), eps(ep1, ep2, ep3), sticky)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				c := netip.AddrFrom4([4]byte{198, 19, byte(g), byte(i)})
				if _, err := b.pick(c, nil); err != nil {
					t.Error(err)
					return
				}
				if i%100 == 0 {
					b.update(eps(ep1, ep2, ep3), sticky)
				}
			}
		}()
	}
	wg.Wait()
}

func BenchmarkNextEndpoint(b *testing.B) {
	for _, tc := range []struct {
		name string
		aff  state.Affinity
	}{{"roundrobin", state.Affinity{}}, {"affinity", sticky}} {
		b.Run(tc.name, func(b *testing.B) {
			bal := newBalancer(realClock{}, eps(ep1, ep2, ep3), tc.aff)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					c := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
					if _, err := bal.pick(c, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// TestBalancerSaysHowItChose: choose reports round robin, round robin past
// an endpoint whose dial just failed, and a client kept by affinity, as
// explainPick tells them.
func TestBalancerSaysHowItChose(t *testing.T) {
	clock := newFakeClock()
	b := newBalancer(clock, eps(ep1, ep2), state.Affinity{})
	if _, why, err := b.choose(c1, nil); err != nil || why != pickedInTurn {
		t.Fatalf("first pick: %v, %v; want in turn", why, err)
	}
	b.penalize(ep1, time.Minute)
	b.penalize(ep2, 0)
	seen := map[pickWhy]int{}
	for range 4 {
		ep, why, _ := b.choose(c1, nil)
		if ep != ep2 {
			t.Fatalf("picked %v, which is in its penalty", ep)
		}
		seen[why]++
	}
	if seen[pickedInTurn] != 2 || seen[pickedPastFailures] != 2 {
		t.Fatalf("four picks past a failed endpoint said %v; want two in turn and two past failures", seen)
	}
	b.update(eps(ep1, ep2), state.Affinity{Type: state.AffinityClientIP, Timeout: time.Hour})
	first, why, _ := b.choose(c2, nil)
	if why == pickedAffinity {
		t.Fatal("a new client's first pick said affinity")
	}
	if again, why, _ := b.choose(c2, nil); again != first || why != pickedAffinity {
		t.Fatalf("a sticky client's second pick: %v (%v); want %v by affinity", again, why, first)
	}
}

// TestEligibleSaysWhichPoolRanOutOfReadyEndpoints: a terminating endpoint
// is used when its pool has no ready one left: the Service's, or this
// node's alone under a Local traffic policy, while other nodes may still
// have ready ones.
func TestEligibleSaysWhichPoolRanOutOfReadyEndpoints(t *testing.T) {
	term := state.Endpoint{Addr: ep1, Serving: true, Terminating: true}
	if got := strings.Join(eligible(term, false), "; "); !strings.HasSuffix(got, "no ready endpoint is left (KEP-1669)") {
		t.Errorf("cluster-wide pool: %q", got)
	}
	if got := strings.Join(eligible(term, true), "; "); !strings.Contains(got, "no ready endpoint is left on this node") {
		t.Errorf("this node's pool: %q", got)
	}
	if got := eligible(state.Endpoint{Addr: ep1, Ready: true, Serving: true}, true); len(got) != 0 {
		t.Errorf("a ready endpoint without hints: %q", got)
	}
}

// TestBalancerSpreadsAFailedEndpointsTurns: while an endpoint is in its
// penalty, its turns are shared by the others, not all given to the one
// after it (which would double that endpoint's load while a crashed pod
// is still marked ready). With four endpoints and one failed, 300 picks
// go 100 to each of the other three; with two failed, side by side or
// apart, 200 picks go 100 to each of the other two.
func TestBalancerSpreadsAFailedEndpointsTurns(t *testing.T) {
	ep4 := netip.MustParseAddrPort("198.18.1.4:80")
	for _, tc := range []struct {
		failed []netip.AddrPort
		picks  int
		want   map[netip.AddrPort]int
	}{
		{[]netip.AddrPort{ep2}, 300, map[netip.AddrPort]int{ep1: 100, ep3: 100, ep4: 100}},
		{[]netip.AddrPort{ep2, ep3}, 200, map[netip.AddrPort]int{ep1: 100, ep4: 100}},
		{[]netip.AddrPort{ep1, ep3}, 200, map[netip.AddrPort]int{ep2: 100, ep4: 100}},
	} {
		b := newBalancer(newFakeClock(), eps(ep1, ep2, ep3, ep4), state.Affinity{})
		for _, ep := range tc.failed {
			b.penalize(ep, time.Minute)
		}
		got := map[netip.AddrPort]int{}
		for range tc.picks {
			ep, _, err := b.choose(c1, nil)
			if err != nil {
				t.Fatal(err)
			}
			got[ep]++
		}
		if !maps.Equal(got, tc.want) {
			t.Errorf("with %v failed, %d picks went %v; want %v", tc.failed, tc.picks, got, tc.want)
		}
	}
}

// When every endpoint is in its penalty, a connection's next attempt
// still goes to one it has not tried yet, whatever the turn: only when
// it has tried them all is the plain turn taken.
func TestBalancerPrefersUntriedWhenAllFailed(t *testing.T) {
	b := newBalancer(newFakeClock(), eps(ep1, ep2, ep3), state.Affinity{})
	for _, ep := range []netip.AddrPort{ep1, ep2, ep3} {
		b.penalize(ep, time.Minute)
	}
	got := map[netip.AddrPort]int{}
	for range 60 {
		ep, _, err := b.choose(c1, []netip.AddrPort{ep1})
		if err != nil {
			t.Fatal(err)
		}
		got[ep]++
	}
	if want := map[netip.AddrPort]int{ep2: 30, ep3: 30}; !maps.Equal(got, want) {
		t.Errorf("avoiding %v with all in their penalty, 60 picks went %v; want %v", ep1, got, want)
	}
	got = map[netip.AddrPort]int{}
	for range 60 {
		ep, _, err := b.choose(c1, []netip.AddrPort{ep1, ep2, ep3})
		if err != nil {
			t.Fatal(err)
		}
		got[ep]++
	}
	if want := map[netip.AddrPort]int{ep1: 20, ep2: 20, ep3: 20}; !maps.Equal(got, want) {
		t.Errorf("with every endpoint tried, 60 picks went %v; want the plain turns %v", got, want)
	}
}
