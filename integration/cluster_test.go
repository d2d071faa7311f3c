//go:build integration && linux

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/source"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// These tests run source.Cluster against the real API server and assert on
// the snapshots it applies. No controller-manager runs, so the tests write
// the EndpointSlices the EndpointSlice controller would. Endpoint addresses
// are in 198.19.0.0/16 and are never dialed.

// testNode is the node the Cluster under test runs on.
const testNode = "kup-node-a"

// appliedSnapshots records the snapshots a Cluster applied, with when.
type appliedSnapshots struct {
	// keep, if positive, is how many of the last snapshots are kept;
	// older ones are replaced by empty ones, so that a test of thousands
	// of services does not hold hundreds of copies.
	keep int

	mu     sync.Mutex // guards the fields below
	snaps  []state.Snapshot
	times  []time.Time
	notify chan struct{} // closed and replaced on every apply
}

func (a *appliedSnapshots) apply(s state.Snapshot) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.snaps = append(a.snaps, s)
	a.times = append(a.times, time.Now())
	if old := len(a.snaps) - 1 - a.keep; a.keep > 0 && old >= 0 {
		a.snaps[old] = state.Snapshot{}
	}
	close(a.notify)
	a.notify = make(chan struct{})
}

func (a *appliedSnapshots) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.snaps)
}

// waitFor waits until a snapshot applied at index from or later satisfies
// cond, and returns its index and time.
func (a *appliedSnapshots) waitFor(t *testing.T, from int, what string, timeout time.Duration, cond func(state.Snapshot) bool) (int, time.Time) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		a.mu.Lock()
		for i := from; i < len(a.snaps); i++ {
			if cond(a.snaps[i]) {
				at := a.times[i]
				a.mu.Unlock()
				return i, at
			}
		}
		from = len(a.snaps)
		ch := a.notify
		a.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no snapshot with %s within %v", what, timeout)
		}
	}
}

// last returns the last snapshot applied.
func (a *appliedSnapshots) last() state.Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.snaps[len(a.snaps)-1]
}

// runCluster runs a source.Cluster on client until the test ends and
// waits for its first snapshot.
func runCluster(t *testing.T, client kubernetes.Interface, mods ...func(*source.Cluster)) *appliedSnapshots {
	t.Helper()
	return runClusterKeeping(t, client, 0, mods...)
}

// runClusterKeeping is runCluster keeping only the last keep snapshots
// (all if keep is 0).
func runClusterKeeping(t *testing.T, client kubernetes.Interface, keep int, mods ...func(*source.Cluster)) *appliedSnapshots {
	t.Helper()
	c := &source.Cluster{Client: client, NodeName: testNode}
	for _, m := range mods {
		m(c)
	}
	a := &appliedSnapshots{keep: keep, notify: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, a.apply) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Cluster.Run: %v", err)
		}
	})
	a.waitFor(t, 0, "the initial sync", 30*time.Second, func(state.Snapshot) bool { return true })
	return a
}

// testNamespace creates a namespace for one test. Without a controller-manager
// a deleted namespace is never emptied, so it is left behind with the
// test's objects; every test uses a fresh one.
func testNamespace(t *testing.T, client kubernetes.Interface) string {
	t.Helper()
	name := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	name = strings.NewReplacer("_", "-").Replace(name)
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("%s-%d", strings.Trim(name, "-"), time.Now().UnixNano()%100000)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return name
}

// svcPort names port "http" (TCP) of Service ns/name.
func svcPort(ns, name string) state.ServicePortName {
	return state.ServicePortName{Namespace: ns, Name: name, Port: "http", Protocol: state.TCP}
}

func newService(ns, name string, mods ...func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, m := range mods {
		m(svc)
	}
	return svc
}

func createService(t *testing.T, client kubernetes.Interface, svc *corev1.Service) *corev1.Service {
	t.Helper()
	out, err := client.CoreV1().Services(svc.Namespace).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return out
}

// updateService applies change to the current Service and updates it.
func updateService(t *testing.T, client kubernetes.Interface, ns, name string, change func(*corev1.Service)) {
	t.Helper()
	svcs := client.CoreV1().Services(ns)
	svc, err := svcs.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	change(svc)
	if _, err := svcs.Update(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update Service %s/%s: %v", ns, name, err)
	}
}

// ep is an endpoint of a slice: an address and, optionally, its node and
// conditions.
type ep struct {
	addr                        string
	node                        string
	ready, serving, terminating bool
	zone                        string // hint
}

func readyEP(addr string) ep { return ep{addr: addr, ready: true, serving: true} }

func newSlice(ns, svc, name string, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP),
		}},
	}
	for _, e := range eps {
		de := discoveryv1.Endpoint{
			Addresses: []string{e.addr},
			Conditions: discoveryv1.EndpointConditions{
				Ready: new(e.ready), Serving: new(e.serving), Terminating: new(e.terminating),
			},
		}
		if e.node != "" {
			de.NodeName = new(e.node)
		}
		if e.zone != "" {
			de.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: e.zone}}}
		}
		s.Endpoints = append(s.Endpoints, de)
	}
	return s
}

// putSlice creates the slice, or replaces its endpoints if it exists.
func putSlice(t *testing.T, client kubernetes.Interface, s *discoveryv1.EndpointSlice) {
	t.Helper()
	api := client.DiscoveryV1().EndpointSlices(s.Namespace)
	cur, err := api.Get(context.Background(), s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(context.Background(), s, metav1.CreateOptions{})
	case err == nil:
		cur.Endpoints = s.Endpoints
		cur.Ports = s.Ports
		_, err = api.Update(context.Background(), cur, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("put EndpointSlice %s/%s: %v", s.Namespace, s.Name, err)
	}
}

// endpointsAre returns a condition: port n exists and its endpoints,
// chosen by pick, are exactly addrs (as "ip:port").
func endpointsAre(n state.ServicePortName, pick func(*state.ServicePort) []state.Endpoint, addrs ...string) func(state.Snapshot) bool {
	return func(s state.Snapshot) bool {
		sp := s.Get(n)
		if sp == nil {
			return false
		}
		var got []string
		for _, e := range pick(sp) {
			got = append(got, e.Addr.String())
		}
		return slices.Equal(got, addrs)
	}
}

func clusterEPs(sp *state.ServicePort) []state.Endpoint  { return sp.ClusterEndpoints }
func internalEPs(sp *state.ServicePort) []state.Endpoint { return sp.InternalEndpoints() }
func externalEPs(sp *state.ServicePort) []state.Endpoint { return sp.ExternalEndpoints() }

// absent returns a condition: no port of Service ns/name is served.
func absent(ns, name string) func(state.Snapshot) bool {
	return func(s state.Snapshot) bool {
		for _, n := range s.Names() {
			if n.Namespace == ns && n.Name == name {
				return false
			}
		}
		return true
	}
}

const waitApply = 10 * time.Second

func TestClusterServiceLifecycle(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	a := runCluster(t, c)
	ns := testNamespace(t, c)
	web := svcPort(ns, "web")

	svc := createService(t, c, newService(ns, "web"))
	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.19.0.1")))
	i, _ := a.waitFor(t, 0, "the new service", waitApply, endpointsAre(web, clusterEPs, "198.19.0.1:8080"))
	sp := a.last().Get(web)
	cip := netip.MustParseAddr(svc.Spec.ClusterIP)
	if !slices.Equal(sp.ClusterIPs, []netip.Addr{cip}) || !netip.MustParsePrefix(serviceCIDR).Contains(cip) || sp.Port != 80 {
		t.Errorf("service port %+v; want cluster IP %s in %s, port 80", sp, cip, serviceCIDR)
	}

	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.19.0.1"), readyEP("198.19.0.2"), readyEP("198.19.0.3")))
	i, _ = a.waitFor(t, i, "three endpoints", waitApply, endpointsAre(web, clusterEPs, "198.19.0.1:8080", "198.19.0.2:8080", "198.19.0.3:8080"))
	// A second slice of the same service adds to the first.
	putSlice(t, c, newSlice(ns, "web", "web-2", readyEP("198.19.0.4")))
	i, _ = a.waitFor(t, i, "four endpoints", waitApply, endpointsAre(web, clusterEPs, "198.19.0.1:8080", "198.19.0.2:8080", "198.19.0.3:8080", "198.19.0.4:8080"))
	putSlice(t, c, newSlice(ns, "web", "web-1", readyEP("198.19.0.2")))
	if err := c.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "web-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	i, _ = a.waitFor(t, i, "scaled down to one endpoint", waitApply, endpointsAre(web, clusterEPs, "198.19.0.2:8080"))

	affinity := func(want state.Affinity) func(state.Snapshot) bool {
		return func(s state.Snapshot) bool { sp := s.Get(web); return sp != nil && sp.Affinity == want }
	}
	updateService(t, c, ns, "web", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP })
	i, _ = a.waitFor(t, i, "affinity with the API server's default timeout", waitApply,
		affinity(state.Affinity{Type: state.AffinityClientIP, Timeout: state.DefaultAffinityTimeout}))
	updateService(t, c, ns, "web", func(s *corev1.Service) {
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(30))}}
	})
	i, _ = a.waitFor(t, i, "affinity timeout 30s", waitApply, affinity(state.Affinity{Type: state.AffinityClientIP, Timeout: 30 * time.Second}))
	updateService(t, c, ns, "web", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityNone
		s.Spec.SessionAffinityConfig = nil
	})
	i, _ = a.waitFor(t, i, "affinity off", waitApply, affinity(state.Affinity{Type: state.AffinityNone}))

	// Only a change to what is served makes a snapshot.
	before := a.count()
	updateService(t, c, ns, "web", func(s *corev1.Service) { s.Annotations = map[string]string{"note": "no-op"} })
	updateService(t, c, ns, "web", func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 })
	i, _ = a.waitFor(t, i, "port 81", waitApply, func(s state.Snapshot) bool { sp := s.Get(web); return sp != nil && sp.Port == 81 })
	if n := a.count(); n != before+1 {
		t.Errorf("%d snapshots for an annotation and a port change, want 1", n-before)
	}

	if err := c.CoreV1().Services(ns).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, i, "the service gone", waitApply, absent(ns, "web"))
}

func TestClusterTerminatingOnly(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	a := runCluster(t, c)
	ns := testNamespace(t, c)
	web := svcPort(ns, "web")

	createService(t, c, newService(ns, "web"))
	putSlice(t, c, newSlice(ns, "web", "web-1",
		readyEP("198.19.1.1"),
		ep{addr: "198.19.1.2", serving: true, terminating: true},
		ep{addr: "198.19.1.3", terminating: true}, // not serving: never used
	))
	i, _ := a.waitFor(t, 0, "the ready endpoint only", waitApply, endpointsAre(web, clusterEPs, "198.19.1.1:8080"))
	putSlice(t, c, newSlice(ns, "web", "web-1",
		ep{addr: "198.19.1.1", serving: true, terminating: true},
		ep{addr: "198.19.1.2", serving: true, terminating: true},
		ep{addr: "198.19.1.3", terminating: true},
	))
	a.waitFor(t, i, "the serving terminating endpoints", waitApply, endpointsAre(web, clusterEPs, "198.19.1.1:8080", "198.19.1.2:8080"))
}

func TestClusterTrafficPolicyLocal(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	a := runCluster(t, c)
	ns := testNamespace(t, c)

	eps := []ep{
		{addr: "198.19.2.1", node: testNode, ready: true, serving: true},
		{addr: "198.19.2.2", node: "kup-node-b", ready: true, serving: true},
	}
	createService(t, c, newService(ns, "itp", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = new(corev1.ServiceInternalTrafficPolicyLocal)
	}))
	putSlice(t, c, newSlice(ns, "itp", "itp-1", eps...))
	createService(t, c, newService(ns, "etp", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}))
	putSlice(t, c, newSlice(ns, "etp", "etp-1", eps...))

	itp, etp := svcPort(ns, "itp"), svcPort(ns, "etp")
	a.waitFor(t, 0, "iTP Local with this node's endpoint", waitApply, func(s state.Snapshot) bool {
		return endpointsAre(itp, internalEPs, "198.19.2.1:8080")(s) &&
			endpointsAre(etp, externalEPs, "198.19.2.1:8080")(s) &&
			endpointsAre(etp, internalEPs, "198.19.2.1:8080", "198.19.2.2:8080")(s)
	})
	sp := a.last().Get(etp)
	if sp.NodePort == 0 || !sp.ExternalLocal {
		t.Errorf("eTP Local NodePort service: %+v", sp)
	}
}

// TestClusterLoadBalancerSourceRanges: the ranges come from the API
// server as it stored them (padded with spaces), together
// with the load-balancer IP from the status, and an update of the ranges
// reaches the snapshot.
func TestClusterLoadBalancerSourceRanges(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	a := runCluster(t, c)
	ns := testNamespace(t, c)

	createService(t, c, newService(ns, "lb", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerSourceRanges = []string{" 198.18.11.0/24 ", "fd5e:b1b5:11::/64"}
	}))
	svc, err := c.CoreV1().Services(ns).Get(context.Background(), "lb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.2.1"}}
	if _, err := c.CoreV1().Services(ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status: %v", err)
	}
	putSlice(t, c, newSlice(ns, "lb", "lb-1", readyEP("198.19.3.1")))

	lb := svcPort(ns, "lb")
	rangesAre := func(want ...string) func(state.Snapshot) bool {
		return func(s state.Snapshot) bool {
			sp := s.Get(lb)
			if sp == nil || len(sp.LoadBalancerIPs) != 1 || sp.LoadBalancerIPs[0] != netip.MustParseAddr("198.19.2.1") {
				return false
			}
			var got []string
			for _, r := range sp.SourceRanges(sp.LoadBalancerIPs[0], nil) {
				got = append(got, r.String())
			}
			return slices.Equal(got, want)
		}
	}
	from, _ := a.waitFor(t, 0, "the IPv4 range of the load-balancer IP", waitApply, rangesAre("198.18.11.0/24"))
	updateService(t, c, ns, "lb", func(s *corev1.Service) {
		s.Spec.LoadBalancerSourceRanges = append(s.Spec.LoadBalancerSourceRanges, "198.18.10.0/24")
	})
	a.waitFor(t, from, "the added range", waitApply, rangesAre("198.18.11.0/24", "198.18.10.0/24"))
}

func TestClusterNodeZone(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}}
	if _, err := c.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	setZone := func(zone string) {
		n, err := c.CoreV1().Nodes().Get(context.Background(), testNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels[corev1.LabelTopologyZone] = zone
		if _, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setZone("zone-a")
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), testNode, metav1.DeleteOptions{}) })

	a := runCluster(t, c)
	ns := testNamespace(t, c)
	web := svcPort(ns, "web")
	createService(t, c, newService(ns, "web"))
	putSlice(t, c, newSlice(ns, "web", "web-1",
		ep{addr: "198.19.3.1", ready: true, serving: true, zone: "zone-a"},
		ep{addr: "198.19.3.2", ready: true, serving: true, zone: "zone-b"},
	))
	i, _ := a.waitFor(t, 0, "zone-a's endpoint", waitApply, endpointsAre(web, clusterEPs, "198.19.3.1:8080"))
	setZone("zone-b")
	a.waitFor(t, i, "zone-b's endpoint", waitApply, endpointsAre(web, clusterEPs, "198.19.3.2:8080"))
}

func TestClusterSkipsServices(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	a := runCluster(t, c)
	ns := testNamespace(t, c)

	createService(t, c, newService(ns, "other-proxy", func(s *corev1.Service) {
		s.Labels = map[string]string{source.LabelServiceProxyName: "someone-else"}
	}))
	putSlice(t, c, newSlice(ns, "other-proxy", "other-proxy-1", readyEP("198.19.4.1")))
	createService(t, c, newService(ns, "headless", func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }))
	headless := newSlice(ns, "headless", "headless-1", readyEP("198.19.4.2"))
	headless.Labels[corev1.IsHeadlessService] = ""
	putSlice(t, c, headless)
	createService(t, c, newService(ns, "external", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeExternalName
		s.Spec.ExternalName = "example.com"
	}))
	createService(t, c, newService(ns, "shown"))
	putSlice(t, c, newSlice(ns, "shown", "shown-1", readyEP("198.19.4.3")))

	// Labelled later, a served Service disappears.
	createService(t, c, newService(ns, "relabelled"))
	putSlice(t, c, newSlice(ns, "relabelled", "relabelled-1", readyEP("198.19.4.4")))

	i, _ := a.waitFor(t, 0, "the served services", waitApply, func(s state.Snapshot) bool {
		return endpointsAre(svcPort(ns, "shown"), clusterEPs, "198.19.4.3:8080")(s) &&
			endpointsAre(svcPort(ns, "relabelled"), clusterEPs, "198.19.4.4:8080")(s)
	})
	last := a.last()
	for _, name := range []string{"other-proxy", "headless", "external"} {
		if !absent(ns, name)(last) {
			t.Errorf("Service %s/%s is served", ns, name)
		}
	}
	updateService(t, c, ns, "relabelled", func(s *corev1.Service) {
		s.Labels = map[string]string{source.LabelServiceProxyName: "someone-else"}
	})
	a.waitFor(t, i, "the relabelled service gone", waitApply, absent(ns, "relabelled"))
}

func TestClusterRefusesMetadataEndpoint(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	a := runCluster(t, c)
	ns := testNamespace(t, c)
	web := svcPort(ns, "web")
	createService(t, c, newService(ns, "web"))

	bad := newSlice(ns, "web", "web-1", readyEP("198.19.5.1"), readyEP("169.254.169.254"))
	_, err := c.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), bad, metav1.CreateOptions{})
	switch {
	case err == nil:
		t.Log("the API server accepted a 169.254.169.254 endpoint")
	case apierrors.IsInvalid(err):
		// As expected: write it where the API server reads it.
		t.Logf("the API server refused it (%v); writing it into etcd", err)
		bad.UID = "5e0b6f4e-0000-4000-8000-000000000001"
		bad.CreationTimestamp = metav1.Now()
		if err := api.PutEtcd(context.Background(), "endpointslices", discoveryv1.SchemeGroupVersion, bad, ns, bad.Name); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal(err)
	}
	a.waitFor(t, 0, "the valid endpoint only", waitApply, endpointsAre(web, clusterEPs, "198.19.5.1:8080"))
	// The API server really serves it: the refusal is the proxy's.
	got, err := c.DiscoveryV1().EndpointSlices(ns).Get(context.Background(), "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(got.Endpoints); n != 2 || got.Endpoints[1].Addresses[0] != "169.254.169.254" {
		t.Errorf("the API server serves %+v", got.Endpoints)
	}
}

// TestClusterIgnoresEndpointsAtAnotherServicesFrontend: an endpoint at
// another Service's cluster IP and port is ignored once that Service
// exists, though the informer source builds each Service alone, and served
// again once it is gone. Two such Services looped through the proxy until
// its descriptors ran out.
func TestClusterIgnoresEndpointsAtAnotherServicesFrontend(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	a := runCluster(t, c)
	ns := testNamespace(t, c)
	const otherIP = "198.18.250.77"
	createService(t, c, newService(ns, "web"))
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(context.Background(),
		newSlice(ns, "web", "web-1", readyEP("198.19.5.1"), readyEP(otherIP)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := svcPort(ns, "web")
	i, _ := a.waitFor(t, 0, "both endpoints, before the other Service exists", waitApply, endpointsAre(web, clusterEPs, otherIP+":8080", "198.19.5.1:8080"))
	createService(t, c, newService(ns, "other", func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = otherIP, []string{otherIP}
		s.Spec.Ports[0].Port = 8080
	}))
	i, _ = a.waitFor(t, i, "the endpoint at the other Service's frontend ignored", waitApply, endpointsAre(web, clusterEPs, "198.19.5.1:8080"))
	if err := c.CoreV1().Services(ns).Delete(context.Background(), "other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, i, "the endpoint back once the other Service is gone", waitApply, endpointsAre(web, clusterEPs, otherIP+":8080", "198.19.5.1:8080"))
}

// TestClusterCaptureCheckFollowsHostAddresses: an endpoint at an address
// this host gains later, with a Service's node port, is ignored once the
// source is told the host's addresses changed, and served again after
// the address goes; it was checked only when its objects changed.
func TestClusterCaptureCheckFollowsHostAddresses(t *testing.T) {
	api := requireAPIServer(t)
	c := api.Client
	var mu sync.Mutex
	var host []netip.Addr
	changed := make(chan struct{}, 1)
	a := runCluster(t, c, func(cl *source.Cluster) {
		cl.HostChanged = changed
		cl.Options.HostAddrs = func() ([]netip.Addr, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(host), nil
		}
	})
	ns := testNamespace(t, c)
	const later = "198.19.77.7"
	np := createService(t, c, newService(ns, "np", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }))
	nodePort := np.Spec.Ports[0].NodePort
	createService(t, c, newService(ns, "web"))
	slice := newSlice(ns, "web", "web-1", readyEP("198.19.5.1"), readyEP(later))
	slice.Ports[0].Port = new(nodePort)
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := svcPort(ns, "web")
	both := []string{fmt.Sprintf("198.19.5.1:%d", nodePort), fmt.Sprintf("%s:%d", later, nodePort)}
	i, _ := a.waitFor(t, 0, "both endpoints", waitApply, endpointsAre(web, clusterEPs, both...))
	tell := func(addrs ...netip.Addr) {
		mu.Lock()
		host = addrs
		mu.Unlock()
		changed <- struct{}{}
	}
	tell(netip.MustParseAddr(later))
	i, _ = a.waitFor(t, i, "the endpoint at the host's new address ignored", waitApply, endpointsAre(web, clusterEPs, both[0]))
	tell()
	a.waitFor(t, i, "the endpoint back once the address is gone", waitApply, endpointsAre(web, clusterEPs, both...))
}
