package source

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// Building each Service alone, as Run's loop does, gives what
// BuildSnapshot gives for all objects at once, problems included.
func TestServedMatchesBuildSnapshot(t *testing.T) {
	svcs := []*corev1.Service{
		service("web"),
		service("api", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		}),
		service("bad", func(s *corev1.Service) { s.Spec.Ports[0].Port = 70000 }),
		service("other", func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "x"} }),
	}
	owned := func(svc string) func(*discoveryv1.EndpointSlice) {
		return func(s *discoveryv1.EndpointSlice) { s.Labels[discoveryv1.LabelServiceName] = svc }
	}
	eps := []*discoveryv1.EndpointSlice{
		endpointSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.0.1"), endpoint("169.254.169.254")}),
		endpointSlice("web-2", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.0.1", terminatingServing), endpoint("10.0.0.2")}),
		endpointSlice("api-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.1.1", onNode("node-a")), endpoint("10.0.1.2", onNode("node-b"))}, owned("api")),
		endpointSlice("orphan-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.2.1")}, owned("gone")),
		endpointSlice("nolabel-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.0.3.1")}, func(s *discoveryv1.EndpointSlice) {
			delete(s.Labels, discoveryv1.LabelServiceName)
		}),
	}
	opts := Options{NodeName: "node-a"}
	want, wantProblems := BuildSnapshot(svcs, eps, opts)

	view := indexerView{
		services: cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil),
		slices:   cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{serviceIndex: sliceServiceIndex}),
	}
	for _, s := range svcs {
		if err := view.services.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range eps {
		if err := view.slices.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	cur := newServed()
	var changes state.ChangeSet
	if err := cur.update(view, cur.keys(view), opts, &changes); err != nil {
		t.Fatalf("update: %v", err)
	}
	// Every Service served is new: web and api, both with endpoints.
	web, api := state.ServiceName{Namespace: "demo", Name: "web"}, state.ServiceName{Namespace: "demo", Name: "api"}
	if got, want := changes.Changes(), (state.Changes{Services: []state.ServiceName{api, web}, Endpoints: []state.ServiceName{api, web}}); !reflect.DeepEqual(got, want) {
		t.Errorf("first build changes %v, want %v", got, want)
	}
	if got := cur.snapshot(); !sameSnapshot(got, want) {
		t.Errorf("snapshot differs:\ngot  %v\nwant %v", got.Names(), want.Names())
	}
	var wantMsgs []string
	for _, p := range wantProblems {
		wantMsgs = append(wantMsgs, p.Error())
	}
	checkProblems(t, cur.problemList(), wantMsgs)

	// Gone from the caches, gone from what is served.
	if err := view.services.Delete(svcs[0]); err != nil {
		t.Fatal(err)
	}
	changes = state.ChangeSet{}
	err := cur.update(view, map[objectRef]bool{{"demo", "web"}: true}, opts, &changes)
	if got := changes.Changes(); err != nil || !reflect.DeepEqual(got, state.Changes{Services: []state.ServiceName{web}, Endpoints: []state.ServiceName{web}}) || cur.snapshot().Get(webHTTP) != nil {
		t.Errorf("after deleting web: changes %v, %v, web served: %v", got, err, cur.snapshot().Get(webHTTP) != nil)
	}
}

// TestServedCatchesEndpointsAtOtherServices: built one Service at a time,
// as the informer source builds them, an endpoint at another Service's
// frontend, or at this host's address with another Service's node port,
// is still ignored, whichever of the two Services came first; and it is
// served again once that Service goes. Two Services whose endpoints are
// each other's frontends looped through the proxy until its descriptors
// ran out.
func TestServedCatchesEndpointsAtOtherServices(t *testing.T) {
	withIP := func(ip string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip} }
	}
	owned := func(svc string, port int32) func(*discoveryv1.EndpointSlice) {
		return func(s *discoveryv1.EndpointSlice) {
			s.Labels[discoveryv1.LabelServiceName] = svc
			s.Ports = []discoveryv1.EndpointPort{slicePort("http", port)}
		}
	}
	a := service("a", withIP("10.96.0.1"))
	b := service("b", withIP("10.96.0.2"))
	c := service("c", withIP("10.96.0.3"), func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 31000
	})
	aSlice := endpointSlice("a-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.96.0.2"), endpoint("10.0.0.1")}, owned("a", 80))
	bSlice := endpointSlice("b-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("10.96.0.1")}, owned("b", 80))
	dSlice := endpointSlice("d-1", discoveryv1.AddressTypeIPv4, []discoveryv1.Endpoint{endpoint("192.0.2.9"), endpoint("10.0.0.4")}, owned("d", 31000))
	d := service("d", withIP("10.96.0.4"))
	opts := Options{HostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.9")}, nil }}

	view := indexerView{
		services: cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil),
		slices:   cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{serviceIndex: sliceServiceIndex}),
	}
	cur := newServed()
	// step adds (or, with del, deletes) objects and rebuilds only the
	// Services they belong to, as the tracker marks them; the result must
	// be what BuildSnapshot makes of everything at once.
	step := func(name string, del bool, objs ...any) {
		t.Helper()
		refs := make(map[objectRef]bool)
		for _, o := range objs {
			var store cache.Indexer
			switch o := o.(type) {
			case *corev1.Service:
				store, refs[objectRef{o.Namespace, o.Name}] = view.services, true
			case *discoveryv1.EndpointSlice:
				store, refs[sliceOwner(o)] = view.slices, true
			}
			op := store.Add
			if del {
				op = store.Delete
			}
			if err := op(o); err != nil {
				t.Fatal(err)
			}
		}
		if err := cur.update(view, refs, opts, new(state.ChangeSet)); err != nil {
			t.Fatal(err)
		}
		var svcs []*corev1.Service
		for _, o := range view.services.List() {
			svcs = append(svcs, o.(*corev1.Service))
		}
		var eps []*discoveryv1.EndpointSlice
		for _, o := range view.slices.List() {
			eps = append(eps, o.(*discoveryv1.EndpointSlice))
		}
		want, wantProblems := BuildSnapshot(svcs, eps, opts)
		if got := cur.snapshot(); !sameSnapshot(got, want) {
			t.Errorf("%s: snapshot differs from BuildSnapshot of everything", name)
		}
		var wantMsgs []string
		for _, p := range wantProblems {
			wantMsgs = append(wantMsgs, p.Error())
		}
		checkProblems(t, cur.problemList(), wantMsgs)
	}
	endpointsOf := func(name string) []string {
		var out []string
		if sp := cur.snapshot().Get(state.ServicePortName{Namespace: "demo", Name: name, Port: "http", Protocol: state.TCP}); sp != nil {
			for _, e := range sp.ClusterEndpoints {
				out = append(out, e.Addr.String())
			}
		}
		return out
	}

	step("a first", false, a, aSlice)
	if got := endpointsOf("a"); !slices.Equal(got, []string{"10.0.0.1:80", "10.96.0.2:80"}) {
		t.Fatalf("a alone serves %v", got)
	}
	step("then b, whose frontend is a's endpoint", false, b, bSlice)
	if got := endpointsOf("a"); !slices.Equal(got, []string{"10.0.0.1:80"}) {
		t.Errorf("a serves %v; want b's frontend ignored", got)
	}
	if got := endpointsOf("b"); len(got) != 0 {
		t.Errorf("b serves %v; want a's frontend ignored", got)
	}
	step("d, at this host's address with port 31000", false, d, dSlice)
	step("then c, with node port 31000", false, c)
	if got := endpointsOf("d"); !slices.Equal(got, []string{"10.0.0.4:31000"}) {
		t.Errorf("d serves %v; want 192.0.2.9:31000 ignored once c's node port is 31000", got)
	}
	step("b goes", true, b, bSlice)
	if got := endpointsOf("a"); !slices.Equal(got, []string{"10.0.0.1:80", "10.96.0.2:80"}) {
		t.Errorf("a serves %v once b is gone; want its endpoint back", got)
	}
	step("c goes", true, c)
	if got := endpointsOf("d"); !slices.Equal(got, []string{"10.0.0.4:31000", "192.0.2.9:31000"}) {
		t.Errorf("d serves %v once c is gone; want its endpoint back", got)
	}
}
