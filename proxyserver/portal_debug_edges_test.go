package proxyserver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/conntrack"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// failingConntrack is a conntrack table whose ClearUDP fails with err
// while it is set, deleting nothing.
type failingConntrack struct {
	*conntrack.Fake
	mu  sync.Mutex // guards the fields below
	err error
}

func (f *failingConntrack) setError(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func (f *failingConntrack) ClearUDP(ctx context.Context, filters ...conntrack.Filter) (int, error) {
	f.mu.Lock()
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return f.Fake.ClearUDP(ctx, filters...)
}

// udpFlow is a client's UDP flow to dst, REDIRECTed to proxyPort.
func udpFlow(dst string, proxyPort uint16) conntrack.Flow {
	client := netip.MustParseAddrPort("198.18.10.2:45454")
	return conntrack.Flow{Family: portal.IPv4, Protocol: conntrack.ProtocolUDP,
		OrigSrc: client, OrigDst: netip.MustParseAddrPort(dst),
		ReplySrc: netip.AddrPortFrom(netip.MustParseAddr("198.18.10.1"), proxyPort), ReplyDst: client}
}

// TestKernelSyncWritesWhatIsNotYetWritten: the rules are written at the
// first sync even when the portals are those it starts from (a restart
// with the previous run's portals, or none at all), and a failed sync is
// written again at the next call, portals unchanged and the min period
// not over: the sync loop paces retries, and a retry the rate limit held
// back would count as a wait, not as the failure it still is.
func TestKernelSyncWritesWhatIsNotYetWritten(t *testing.T) {
	ctx := context.Background()
	one := []portal.Portal{udpPortal("198.18.0.10", 40000)}
	for _, tc := range []struct {
		name  string
		last  []portal.Portal
		first []portal.Portal
	}{
		{"no portals", nil, nil},
		{"no portals, none before", []portal.Portal{}, []portal.Portal{}},
		{"the previous run's portals", one, one},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pt := &portal.Fake{}
			k := &kernelSync{pt: pt, last: tc.last, minPeriod: time.Hour, resync: time.Hour}
			if err := k.sync(ctx, tc.first); err != nil || pt.Syncs() != 1 {
				t.Fatalf("first sync: err %v, %d syncs; want 1", err, pt.Syncs())
			}
		})
	}

	pt := &portal.Fake{}
	k := &kernelSync{pt: pt, minPeriod: time.Hour, resync: time.Hour}
	if err := k.sync(ctx, one); err != nil {
		t.Fatal(err)
	}
	// A full resync that fails, then a call at once with the same
	// portals.
	k.lastTime = time.Now().Add(-2 * time.Hour)
	boom := errors.New("iptables-restore: exit status 4")
	pt.SetError(boom)
	err := k.sync(ctx, one)
	if !errors.Is(err, boom) || !errors.As(err, new(kernelError)) {
		t.Fatalf("failing resync: err %v, want a kernelError wrapping %v", err, boom)
	}
	pt.SetError(nil)
	if err := k.sync(ctx, one); err != nil || pt.Syncs() != 3 {
		t.Fatalf("retry of the failed sync: err %v, %d syncs; want it written (3 syncs)", err, pt.Syncs())
	}
	if err := k.sync(ctx, one); err != nil || pt.Syncs() != 3 {
		t.Fatalf("after the retry worked: err %v, %d syncs; want none", err, pt.Syncs())
	}
}

// TestKernelSyncRetriesConntrackCleanup: conntrack entries that could not
// be deleted make the sync fail, and are deleted at the next call, though
// the portals did not change; once deleted, they are not asked for again.
func TestKernelSyncRetriesConntrackCleanup(t *testing.T) {
	ctx := context.Background()
	ct := &failingConntrack{Fake: &conntrack.Fake{}}
	pt := &portal.Fake{}
	k := &kernelSync{pt: pt, ct: ct, minPeriod: time.Hour, resync: time.Hour}
	if err := k.sync(ctx, []portal.Portal{udpPortal("198.18.0.10", 40000)}); err != nil {
		t.Fatal(err)
	}
	moved := []portal.Portal{udpPortal("198.18.0.10", 40001)}
	ct.Add(udpFlow("198.18.0.10:53", 40000))
	netlink := errors.New("netlink: operation not permitted")
	ct.setError(netlink)
	k.lastTime = time.Now().Add(-2 * time.Hour)
	if err := k.sync(ctx, moved); !errors.Is(err, netlink) {
		t.Fatalf("conntrack failing: err %v, want it to wrap %v", err, netlink)
	}
	ct.setError(nil)
	calls := len(ct.Calls())
	if err := k.sync(ctx, moved); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := ct.Flows(); len(got) != 0 {
		t.Fatalf("after the retry conntrack holds %v, want the entry on the old proxy port deleted", got)
	}
	if got := ct.Calls(); len(got) != calls+1 {
		t.Fatalf("conntrack calls %v: want one more, the retry", got)
	}
	// Another move: only its own frontend's entries are asked for.
	k.lastTime = time.Now().Add(-2 * time.Hour)
	if err := k.sync(ctx, []portal.Portal{udpPortal("198.18.0.10", 40002)}); err != nil {
		t.Fatal(err)
	}
	want := []conntrack.Filter{{Family: portal.IPv4, OrigDst: netip.MustParseAddr("198.18.0.10"), OrigDstPort: 53}}
	if got := ct.Calls(); !slices.Equal(got[len(got)-1], want) {
		t.Errorf("the last ClearUDP was given %v, want %v (nothing left over from the retry)", got[len(got)-1], want)
	}
}

// movingPortal is a portal whose syncs change where node ports' rules
// send traffic (--nodeport-addresses edited): from lost their
// redirection, to gained it.
type movingPortal struct {
	*portal.Fake
	from, to []portal.Portal
}

func (m *movingPortal) MovedNodePorts() (from, to []portal.Portal) { return m.from, m.to }

// TestKernelSyncClearsWhatMovedNodePortsLeft: a node port whose rules no
// longer redirect a client's traffic leaves its REDIRECTed entry, and one
// whose rules now do leaves its unredirected entry: both are deleted, and
// the entries of other node ports stay.
func TestKernelSyncClearsWhatMovedNodePortsLeft(t *testing.T) {
	ctx := context.Background()
	nodePort := func(port, proxyPort uint16) portal.Portal {
		return portal.Portal{Service: state.ServicePortName{Namespace: "ns", Name: "dns", Protocol: state.UDP},
			Kind: portal.NodePort, Family: portal.IPv4, Port: port, ProxyPort: proxyPort}
	}
	unredirected := func(dst string) conntrack.Flow {
		client, to := netip.MustParseAddrPort("198.18.10.2:45454"), netip.MustParseAddrPort(dst)
		return conntrack.Flow{Family: portal.IPv4, Protocol: conntrack.ProtocolUDP, OrigSrc: client, OrigDst: to, ReplySrc: to, ReplyDst: client}
	}
	portals := []portal.Portal{nodePort(30053, 40000), nodePort(30054, 40001)}
	ct := &conntrack.Fake{}
	pt := &movingPortal{Fake: &portal.Fake{}}
	k := &kernelSync{pt: pt, ct: ct, minPeriod: 0, resync: time.Hour}
	if err := k.sync(ctx, portals); err != nil {
		t.Fatal(err)
	}
	kept := []conntrack.Flow{udpFlow("198.18.2.1:30054", 40001), unredirected("198.18.2.1:30053")}
	ct.Add(udpFlow("198.18.2.1:30053", 40000), unredirected("198.18.2.1:30054"))
	ct.Add(kept...)
	pt.from, pt.to = portals[:1], portals[1:]
	k.lastTime = time.Now().Add(-2 * time.Hour)
	if err := k.sync(ctx, portals); err != nil {
		t.Fatal(err)
	}
	if got := ct.Flows(); !slices.Equal(got, kept) {
		t.Errorf("conntrack holds %v, want %v", got, kept)
	}
}

// orderPortal is a portal that notes how many ClearUDP calls ct had seen
// when each Sync began.
type orderPortal struct {
	*portal.Fake
	ct      *conntrack.Fake
	cleared []int
}

func (o *orderPortal) Sync(ctx context.Context, portals []portal.Portal) error {
	o.cleared = append(o.cleared, len(o.ct.Calls()))
	return o.Fake.Sync(ctx, portals)
}

// TestKernelSyncWritesRulesBeforeClearingConntrack: a sync writes the
// rules, then deletes the conntrack entries of the old mapping (README:
// rules, then conntrack clean-up). Deleted first, a client's next
// datagram would make a new entry on the old rules, which stays.
func TestKernelSyncWritesRulesBeforeClearingConntrack(t *testing.T) {
	ctx := context.Background()
	ct := &conntrack.Fake{}
	pt := &orderPortal{Fake: &portal.Fake{}, ct: ct}
	k := &kernelSync{pt: pt, ct: ct, last: []portal.Portal{udpPortal("198.18.0.10", 40000)}, minPeriod: 0, resync: time.Hour}
	ct.Add(udpFlow("198.18.0.10:53", 40000))
	if err := k.sync(ctx, []portal.Portal{udpPortal("198.18.0.10", 40001)}); err != nil {
		t.Fatal(err)
	}
	if len(pt.cleared) != 1 || pt.cleared[0] != 0 {
		t.Errorf("ClearUDP calls seen when the rules were written: %v, want [0]", pt.cleared)
	}
	if got := ct.Calls(); len(got) != 1 {
		t.Errorf("conntrack calls %v, want one, after the rules", got)
	}
	if got := ct.Flows(); len(got) != 0 {
		t.Errorf("conntrack holds %v, want the old mapping's entry deleted", got)
	}
}

// TestKernelSyncClearsWhatARejectTurnsAway: a UDP frontend whose service
// port lost its last endpoint keeps its proxy port, and its rule now
// rejects new flows: a client's existing entry would carry it past the
// REJECT, so it is deleted (conntrack.StaleUDP).
func TestKernelSyncClearsWhatARejectTurnsAway(t *testing.T) {
	ctx := context.Background()
	ct := &conntrack.Fake{}
	k := &kernelSync{pt: &portal.Fake{}, ct: ct, minPeriod: 0, resync: time.Hour}
	served := udpPortal("198.18.0.10", 40000)
	if err := k.sync(ctx, []portal.Portal{served}); err != nil {
		t.Fatal(err)
	}
	ct.Add(udpFlow("198.18.0.10:53", 40000))
	rejected := served
	rejected.Reject = true
	if err := k.sync(ctx, []portal.Portal{rejected}); err != nil {
		t.Fatal(err)
	}
	if got := ct.Flows(); len(got) != 0 {
		t.Errorf("conntrack holds %v after the frontend's rule became a REJECT, want it deleted", got)
	}
}

// TestKernelSyncDefersForWhatIsLeftOfThePeriod: a change that comes
// within --iptables-min-sync-period of the last sync is deferred until
// the period is over, not for a whole period from now.
func TestKernelSyncDefersForWhatIsLeftOfThePeriod(t *testing.T) {
	ctx := context.Background()
	pt := &portal.Fake{}
	k := &kernelSync{pt: pt, minPeriod: time.Hour, resync: 2 * time.Hour}
	if err := k.sync(ctx, []portal.Portal{udpPortal("198.18.0.10", 40000)}); err != nil {
		t.Fatal(err)
	}
	k.lastTime = time.Now().Add(-59 * time.Minute)
	var d errDeferred
	if err := k.sync(ctx, []portal.Portal{udpPortal("198.18.0.10", 40001)}); !errors.As(err, &d) {
		t.Fatalf("change within the period: err %v, want deferred", err)
	}
	if d.after <= 0 || d.after > time.Minute {
		t.Errorf("deferred %v, want at most the minute left of the period", d.after)
	}
	if pt.Syncs() != 1 {
		t.Errorf("%d syncs, want the change not yet written", pt.Syncs())
	}
}

// driftedPortal is a portal whose rules something else rewrote: Drift
// returns held, what those rules redirect.
type driftedPortal struct {
	*portal.Fake
	held []portal.Portal
}

func (d *driftedPortal) Drift(context.Context) ([]portal.Portal, bool, error) {
	return d.held, d.held != nil, nil
}

// TestKernelSyncClearsWhatRewrittenRulesMade: a full resync that finds the
// rules rewritten by something else writes this proxy's again and deletes
// the UDP entries the other rules made: those of every frontend they
// redirected, even to the same proxy port (they may have sent it to
// another address), and those of frontends they left unredirected.
func TestKernelSyncClearsWhatRewrittenRulesMade(t *testing.T) {
	ctx := context.Background()
	ct := &conntrack.Fake{}
	pt := &driftedPortal{Fake: &portal.Fake{}}
	ours := []portal.Portal{udpPortal("198.18.0.10", 40000), udpPortal("198.18.0.11", 40001), udpPortal("198.18.0.13", 40003)}
	k := &kernelSync{pt: pt, ct: ct, minPeriod: 0, resync: time.Hour}
	if err := k.sync(ctx, ours); err != nil {
		t.Fatal(err)
	}
	// The other rules: 198.18.0.10 as ours, 198.18.0.11 not at all,
	// 198.18.0.12 (not ours) to a port of theirs; 198.18.0.13 moved.
	pt.held = []portal.Portal{udpPortal("198.18.0.10", 40000), udpPortal("198.18.0.12", 39000), udpPortal("198.18.0.13", 39003)}
	untouched := udpFlow("198.18.0.14:53", 0)
	ct.Add(udpFlow("198.18.0.10:53", 40000), udpFlow("198.18.0.11:53", 0), udpFlow("198.18.0.12:53", 39000), udpFlow("198.18.0.13:53", 39003), untouched)
	k.lastTime = time.Now().Add(-2 * time.Hour)
	if err := k.sync(ctx, ours); err != nil {
		t.Fatal(err)
	}
	if pt.Syncs() != 2 {
		t.Fatalf("%d syncs, want the rules written again", pt.Syncs())
	}
	if got := ct.Flows(); !slices.Equal(got, []conntrack.Flow{untouched}) {
		t.Errorf("conntrack holds %v, want only %v", got, untouched)
	}
}

// TestJoinErrorsDeferredOnlyAlone: a rate limit's wait is the result of a
// sync only when nothing else failed; a failure beside it is the result,
// worded alone.
func TestJoinErrorsDeferredOnlyAlone(t *testing.T) {
	wait := errDeferred{after: time.Second}
	if err := joinErrors(nil, wait, nil); err != wait {
		t.Errorf("a wait alone: %#v, want %#v", err, wait)
	}
	boom := errors.New("userspace: service e2e/web:http/TCP: open proxy port: no free port")
	err := joinErrors(wait, boom)
	if errors.As(err, new(errDeferred)) || err == nil || err.Error() != boom.Error() {
		t.Errorf("a wait and a failure: %v, want the failure alone", err)
	}
}

// TestDebugServicesWantedOnlyWhenThePortalFailed: the redirects are marked
// wanted, not installed, only when the portal's own sync failed (a
// kernelError); a Service's failure leaves them as installed. A service
// port without a proxy port has no rule to show, failed or not.
func TestDebugServicesWantedOnlyWhenThePortalFailed(t *testing.T) {
	p := userspace.New(userspace.Config{})
	t.Cleanup(func() { p.Close() })
	ep := []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.12.2:8080"), Ready: true, Serving: true}}
	web := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "web", Port: "http", Protocol: state.TCP}, Port: 80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.90")}, ClusterEndpoints: ep}
	idle := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "idle", Port: "http", Protocol: state.TCP}, Port: 80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.91")}, ClusterEndpoints: ep}
	d := &debugView{p: p, mode: PortalIPTables}
	d.portals = func(s state.Snapshot) []portal.Portal {
		return portal.FromSnapshot(s, func(n state.ServicePortName) uint16 {
			if n == web.Name {
				return 40090
			}
			return 0
		}, nil)
	}
	snap := state.NewSnapshot([]state.ServicePort{web, idle})
	installed := "  redirects:    198.18.0.90:80/TCP -> :40090\n"
	for _, tc := range []struct {
		name string
		err  error
		web  string
	}{
		{"a Service failed", &userspace.PortError{Name: idle.Name, Err: errors.New("userspace: service e2e/idle:http/TCP: open proxy port: no free port")}, installed},
		{"the portal failed", kernelError{errors.New("portal: iptables: restore: exit status 4")},
			"  redirects:    198.18.0.90:80/TCP -> :40090 (wanted: the portal's last sync failed, so the kernel may still hold the rules of the last one that worked)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			d.write(&b, &debugSnapshot{snap: snap, err: joinErrors(tc.err)})
			view := b.String()
			if s := portSection(view, web.Name); !strings.Contains(s, tc.web) {
				t.Errorf("lacks %q:\n%s", tc.web, s)
			}
			if s := portSection(view, idle.Name); !strings.Contains(s, "  redirects:    none\n") {
				t.Errorf("a port without a proxy port shows a redirect:\n%s", s)
			}
		})
	}
}

// TestDebugServicesNodePortPolicy: a node port of a Local policy with no
// endpoint on this node is shown dropped but for this node's traffic (a
// cluster IP's would be dropped outright), a load-balancer IP's redirect
// names the sources it admits, and a health check node port says that the
// iptables portal lets it through; a port with no external frontend says
// nothing of external traffic, whatever its external policy.
func TestDebugServicesNodePortPolicy(t *testing.T) {
	p := userspace.New(userspace.Config{})
	t.Cleanup(func() { p.Close() })
	there := []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.13.2:8080"), Ready: true, Serving: true}}
	lb := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "lb", Port: "http", Protocol: state.TCP}, Port: 80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.92")}, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.9")},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, NodePort: 30092,
		HealthCheckNodePort: 30192, ExternalLocal: true, ClusterEndpoints: there}
	inner := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "inner", Port: "http", Protocol: state.TCP}, Port: 80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.93")}, ExternalLocal: true, ClusterEndpoints: there}
	snap := state.NewSnapshot([]state.ServicePort{lb, inner})
	pp := func(state.ServicePortName) uint16 { return 40092 }

	d := &debugView{p: p, mode: PortalIPTables}
	d.portals = func(s state.Snapshot) []portal.Portal { return portal.FromSnapshot(s, pp, nil) }
	var b strings.Builder
	d.write(&b, &debugSnapshot{snap: snap})
	s := portSection(b.String(), lb.Name)
	for _, want := range []string{
		"NodePort(IPv4) 30092/TCP -> :40092 (dropped but from this node: no IPv4 endpoint on this node)",
		"203.0.113.9:80/TCP -> :40092 from 198.51.100.0/24 (dropped but from this node",
		"198.18.0.92:80/TCP -> :40092,",
		"  health check: node port 30192 (accepted in KUBE-NODEPORT-NON-LOCAL)\n",
		"  node & pods:  external traffic from this node goes to every endpoint (from pods too, given --cluster-cidr): 198.18.13.2:8080\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("lacks %q:\n%s", want, s)
		}
	}
	// Pods of IPv4 only (--cluster-cidr): their IPv4 traffic is let
	// through too.
	d.pods = []netip.Prefix{netip.MustParsePrefix("198.18.10.0/24")}
	b.Reset()
	d.write(&b, &debugSnapshot{snap: snap})
	s = portSection(b.String(), lb.Name)
	for _, want := range []string{
		"NodePort(IPv4) 30092/TCP -> :40092 (dropped but from this node and pods: no IPv4 endpoint on this node)",
		"  node & pods:  external traffic from this node or from pods (198.18.10.0/24) goes to every endpoint: 198.18.13.2:8080\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("with IPv4 pods: lacks %q:\n%s", want, s)
		}
	}
	if s := portSection(b.String(), inner.Name); strings.Contains(s, "external to:") || strings.Contains(s, "node & pods:") {
		t.Errorf("a port without node port or external address speaks of external traffic:\n%s", s)
	}

	// No portal redirects: the health check node port is only served.
	d = &debugView{p: p, mode: PortalBind}
	b.Reset()
	d.write(&b, &debugSnapshot{snap: snap})
	if s := portSection(b.String(), lb.Name); !strings.Contains(s, "  health check: node port 30192\n") {
		t.Errorf("bind portal: lacks the health check node port alone:\n%s", s)
	}
}

// TestDebugServicesProxyHeaderOnTCPOnly: a PROXY protocol header asked
// for a port of another protocol than TCP is said not to be sent.
func TestDebugServicesProxyHeaderOnTCPOnly(t *testing.T) {
	p := userspace.New(userspace.Config{})
	t.Cleanup(func() { p.Close() })
	d := &debugView{p: p, mode: PortalNone}
	for _, proto := range []state.Protocol{state.UDP, state.SCTP} {
		sp := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "sig", Port: "s", Protocol: proto}, Port: 80, ProxyProtocol: state.ProxyProtocolV1}
		var b strings.Builder
		d.write(&b, &debugSnapshot{snap: state.NewSnapshot([]state.ServicePort{sp})})
		if want := "  proxy header: PROXY protocol v1 asked for, not sent: it is sent on TCP ports only\n"; !strings.Contains(b.String(), want) {
			t.Errorf("%s: lacks %q:\n%s", proto, want, b.String())
		}
	}
}

// TestDebugServicesSaysWhatTheSourceRefused: a manifest file's rejected
// edit is shown, each line of the reason indented, in place of the
// warnings of the file that serves; what is ignored is named by where it
// comes from, and a long list ends with how many more the log has.
func TestDebugServicesSaysWhatTheSourceRefused(t *testing.T) {
	p := userspace.New(userspace.Config{})
	t.Cleanup(func() { p.Close() })
	d := &debugView{p: p, mode: PortalNone}
	d.applied(state.NewSnapshot(nil), nil)
	view := func() string {
		var b strings.Builder
		d.write(&b, d.last.Load())
		return b.String()
	}
	d.sourceRead(errors.New("services.yaml: line 3: bad indentation\n  a second line"), []error{errors.New("a warning of the file that serves")}, nil)
	v := view()
	for _, want := range []string{"The manifest file's last edit was rejected (", "\n  services.yaml: line 3: bad indentation\n    a second line\n"} {
		if !strings.Contains(v, want) {
			t.Errorf("lacks %q:\n%s", want, v)
		}
	}
	if strings.Contains(v, "a warning of the file that serves") {
		t.Errorf("a rejected edit shows the warnings too:\n%s", v)
	}

	var ignored []error
	for i := range 25 {
		ignored = append(ignored, fmt.Errorf("Service e2e/s%d: port 0 ignored", i))
	}
	d.cluster = true
	d.clusterRead(ignored)
	v = view()
	for _, want := range []string{"Parts of objects from the API server are ignored:\n", "  Service e2e/s19: port 0 ignored\n  ... and 5 more (see the log)\n"} {
		if !strings.Contains(v, want) {
			t.Errorf("lacks %q:\n%s", want, v)
		}
	}
	if strings.Contains(v, "rejected") || strings.Contains(v, "e2e/s20:") {
		t.Errorf("says more than it should:\n%s", v)
	}
}

// TestDebugServicesFamilyNotes: a dual-stack port with no endpoint at all
// says so once, on its endpoints line, with no note per family; one whose
// cluster IP, its only frontend, lacks a family's endpoint on this node
// under internalTrafficPolicy: Local says so without a word of node-port
// or external traffic it has none of.
func TestDebugServicesFamilyNotes(t *testing.T) {
	p := userspace.New(userspace.Config{})
	t.Cleanup(func() { p.Close() })
	here4 := state.Endpoint{Addr: netip.MustParseAddrPort("198.18.12.2:8080"), Ready: true, Serving: true, Local: true}
	there6 := state.Endpoint{Addr: netip.MustParseAddrPort("[fd5e:b1b5:13::2]:8080"), Ready: true, Serving: true}
	dual := []netip.Addr{netip.MustParseAddr("198.18.0.94"), netip.MustParseAddr("fd5e:b1b5::94")}
	name := state.ServicePortName{Namespace: "e2e", Name: "dual", Port: "http", Protocol: state.TCP}
	d := &debugView{p: p, mode: PortalIPTables}
	d.portals = func(s state.Snapshot) []portal.Portal { return portal.FromSnapshot(s, nil, nil) }
	for _, tc := range []struct {
		name      string
		sp        state.ServicePort
		want, not []string
	}{
		{"no endpoints", state.ServicePort{Name: name, Port: 80, ClusterIPs: dual},
			[]string{"  endpoints:    none: new connections are refused (the portal's REJECT rule), as kube-proxy refuses them\n"},
			[]string{"note:"}},
		{"internal Local, IPv6 endpoint elsewhere, cluster IP only", state.ServicePort{Name: name, Port: 80, ClusterIPs: dual, InternalLocal: true,
			ClusterEndpoints: []state.Endpoint{here4, there6}, LocalEndpoints: []state.Endpoint{here4}},
			[]string{"  note:         no IPv6 endpoint on this node: from IPv6 clients, new connections are dropped (the portal's DROP rule), as kube-proxy drops them\n"},
			[]string{"node-port", "no IPv4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			d.write(&b, &debugSnapshot{snap: state.NewSnapshot([]state.ServicePort{tc.sp})})
			checkSays(t, b.String(), tc.want, tc.not)
		})
	}
}
