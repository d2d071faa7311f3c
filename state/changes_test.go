package state

import (
	"net/netip"
	"reflect"
	"testing"
)

func TestChangesBetween(t *testing.T) {
	port := func(svc, name string, mods ...func(*ServicePort)) ServicePort {
		sp := ServicePort{Name: ServicePortName{Namespace: "ns", Name: svc, Port: name, Protocol: TCP}, Port: 80,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.10")}}
		for _, m := range mods {
			m(&sp)
		}
		return sp
	}
	withEndpoint := func(addr string) func(*ServicePort) {
		return func(sp *ServicePort) {
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, Endpoint{Addr: netip.MustParseAddrPort(addr), Ready: true})
		}
	}
	affinity := func(sp *ServicePort) { sp.Affinity = Affinity{Type: AffinityClientIP} }
	names := func(n ...string) []ServiceName {
		var out []ServiceName
		for _, s := range n {
			out = append(out, ServiceName{Namespace: "ns", Name: s})
		}
		return out
	}
	base := []ServicePort{port("a", "http", withEndpoint("198.18.1.1:8080")), port("b", "http")}
	for _, tc := range []struct {
		name string
		old  []ServicePort
		cur  []ServicePort
		want Changes
	}{
		{name: "unchanged", old: base, cur: base},
		{name: "from nothing", cur: base, want: Changes{Services: names("a", "b"), Endpoints: names("a")}},
		{name: "to nothing", old: base, want: Changes{Services: names("a", "b"), Endpoints: names("a")}},
		{name: "an endpoint more", old: base,
			cur:  []ServicePort{port("a", "http", withEndpoint("198.18.1.1:8080"), withEndpoint("198.18.1.2:8080")), port("b", "http")},
			want: Changes{Endpoints: names("a")}},
		{name: "an endpoint stops serving, out of the endpoints new connections use already", old: base,
			cur: []ServicePort{port("a", "http", withEndpoint("198.18.1.1:8080"), func(sp *ServicePort) {
				sp.ServingEndpoints = []netip.AddrPort{netip.MustParseAddrPort("198.18.1.1:8080")}
			}), port("b", "http")},
			want: Changes{Endpoints: names("a")}},
		{name: "why its topology hints are ignored, endpoints alike: the slices' hints changed", old: base,
			cur: []ServicePort{port("a", "http", withEndpoint("198.18.1.1:8080"), func(sp *ServicePort) {
				sp.TopologyHintsIgnored = "zone hints ignored: none is for zone zone-a"
			}), port("b", "http")},
			want: Changes{Endpoints: names("a")}},
		{name: "affinity", old: base,
			cur:  []ServicePort{port("a", "http", withEndpoint("198.18.1.1:8080")), port("b", "http", affinity)},
			want: Changes{Services: names("b")}},
		{name: "a port more, without endpoints", old: base,
			cur:  append([]ServicePort{port("b", "metrics")}, base...),
			want: Changes{Services: names("b")}},
		{name: "a port gone, with its endpoints", old: append([]ServicePort{port("a", "admin", withEndpoint("198.18.1.1:9090"))}, base...),
			cur:  base,
			want: Changes{Services: names("a"), Endpoints: names("a")}},
		{name: "both at once", old: base,
			cur:  []ServicePort{port("a", "http", withEndpoint("198.18.1.3:8080"), affinity), port("b", "http", withEndpoint("198.18.1.4:8080"))},
			want: Changes{Services: names("a"), Endpoints: names("a", "b")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ChangesBetween(NewSnapshot(tc.old), NewSnapshot(tc.cur))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if got.Empty() != (tc.want.Services == nil && tc.want.Endpoints == nil) {
				t.Errorf("Empty() = %v", got.Empty())
			}
		})
	}
}
