package proxyserver

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/portal"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// TestDebugServicesSaysWhatThePortalDoes: /debug/services says what
// becomes of traffic without an endpoint to go to as the portal in use
// handles it: with iptables, refused (REJECT) when the port has no
// endpoint (of the client's family) anywhere, dropped (DROP) when a Local
// policy finds none on this node, with the traffic from this node and pods
// that still goes to every endpoint; with bind and none, reset (TCP) or
// dropped (UDP) by the proxy. It said "dropped" for a port with no
// endpoints at all, and "IPv6 clients are refused" for a dual-stack port
// whose IPv6 endpoint is on another node.
func TestDebugServicesSaysWhatThePortalDoes(t *testing.T) {
	here4 := state.Endpoint{Addr: netip.MustParseAddrPort("198.18.12.2:8080"), Ready: true, Serving: true, Local: true}
	there4 := state.Endpoint{Addr: netip.MustParseAddrPort("198.18.13.2:8080"), Ready: true, Serving: true}
	there6 := state.Endpoint{Addr: netip.MustParseAddrPort("[fd5e:b1b5:13::2]:8080"), Ready: true, Serving: true}
	pods := []netip.Prefix{netip.MustParsePrefix("198.18.10.0/24"), netip.MustParsePrefix("fd5e:b1b5:10::/64")}
	dual := []netip.Addr{netip.MustParseAddr("198.18.0.60"), netip.MustParseAddr("fd5e:b1b5::60")}
	single := []netip.Addr{netip.MustParseAddr("198.18.0.61")}
	for _, tc := range []struct {
		name      string
		mode      string
		proto     state.Protocol
		ips       []netip.Addr
		itp, etp  bool
		cluster   []state.Endpoint
		local     []state.Endpoint
		want, not []string
	}{
		{
			name: "iptables, Local policies, IPv6 endpoint on another node", mode: PortalIPTables, proto: state.TCP, ips: dual, itp: true, etp: true,
			cluster: []state.Endpoint{here4, there6}, local: []state.Endpoint{here4},
			want: []string{"note:         no IPv6 endpoint on this node: from IPv6 clients, new connections are dropped (the portal's DROP rule), as kube-proxy drops them (traffic from this node, and from pods (--cluster-cidr), to node and external addresses goes to every endpoint)"},
			not:  []string{"refused", "no IPv4"},
		},
		{
			name: "bind, Local policies, IPv6 endpoint on another node", mode: PortalBind, proto: state.TCP, ips: dual, itp: true, etp: true,
			cluster: []state.Endpoint{here4, there6}, local: []state.Endpoint{here4},
			want: []string{"note:         no IPv6 endpoint on this node: from IPv6 clients, new connections are reset by the proxy (traffic from this node, and from pods"},
			not:  []string{"refused", "DROP"},
		},
		{
			name: "iptables, external Local only, IPv6 endpoint on another node", mode: PortalIPTables, proto: state.TCP, ips: dual, etp: true,
			cluster: []state.Endpoint{here4, there6}, local: []state.Endpoint{here4},
			want: []string{"note:         no IPv6 endpoint on this node: from IPv6 clients of node ports and external addresses (externalTrafficPolicy: Local), new connections are dropped (the portal's DROP rule)"},
			not:  []string{"refused"},
		},
		{
			name: "iptables, dual-stack, no IPv6 endpoint anywhere", mode: PortalIPTables, proto: state.UDP, ips: dual, etp: true,
			cluster: []state.Endpoint{here4}, local: []state.Endpoint{here4},
			want: []string{"note:         no IPv6 endpoint: from IPv6 clients, datagrams are refused (the portal's REJECT rule), as kube-proxy refuses them"},
		},
		{
			name: "iptables, external Local, no endpoints at all", mode: PortalIPTables, proto: state.TCP, ips: single, etp: true,
			want: []string{
				"endpoints:    none: new connections are refused (the portal's REJECT rule), as kube-proxy refuses them",
				"external to:  none: new connections are refused (the portal's REJECT rule), as kube-proxy refuses them",
			},
			not: []string{"DROP", "on this node"},
		},
		{
			name: "iptables, external Local, endpoints elsewhere only", mode: PortalIPTables, proto: state.TCP, ips: single, etp: true,
			cluster: []state.Endpoint{there4},
			want: []string{
				"external to:  none on this node: new connections are dropped (the portal's DROP rule), as kube-proxy drops them, but external traffic from this node and from pods goes to every endpoint (see node & pods)",
				"redirects:    none",
			},
			not: []string{"REJECT"},
		},
		{
			name: "none, UDP, no endpoints at all", mode: PortalNone, proto: state.UDP, ips: single, etp: true,
			want: []string{"endpoints:    none: datagrams are dropped by the proxy", "external to:  none: datagrams are dropped by the proxy"},
			not:  []string{"REJECT", "DROP"},
		},
		{
			name: "bind, internal Local, endpoints elsewhere only", mode: PortalBind, proto: state.TCP, ips: single, itp: true,
			cluster: []state.Endpoint{there4},
			want:    []string{"endpoints:    none on this node: new connections are reset by the proxy"},
			not:     []string{"REJECT", "DROP"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := userspace.New(userspace.Config{})
			t.Cleanup(func() { p.Close() })
			d := &debugView{p: p, mode: tc.mode, pods: pods}
			if tc.mode == PortalIPTables {
				d.portals = func(s state.Snapshot) []portal.Portal { return portal.FromSnapshot(s, nil, nil) }
			}
			sp := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "lb", Protocol: tc.proto}, Port: 80, NodePort: 30061,
				ClusterIPs: tc.ips, InternalLocal: tc.itp, ExternalLocal: tc.etp, ClusterEndpoints: tc.cluster, LocalEndpoints: tc.local}
			var b strings.Builder
			d.write(&b, &debugSnapshot{snap: state.NewSnapshot([]state.ServicePort{sp})})
			checkSays(t, b.String(), tc.want, tc.not)
		})
	}
}

// TestDebugServicesSaysWhyNotListening: a service port without a socket
// says why: its protocol is not served here (SCTP on a kernel without
// it), or the last sync failed for it; it said only "none" (xa52).
func TestDebugServicesSaysWhyNotListening(t *testing.T) {
	p := userspace.New(userspace.Config{})
	t.Cleanup(func() { p.Close() })
	d := &debugView{p: p, mode: PortalNone}
	ep := []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.12.2:8080"), Ready: true, Serving: true}}
	sctp := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "sig", Port: "s", Protocol: state.SCTP}, Port: 80, ClusterEndpoints: ep}
	held := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "app", Port: "http", Protocol: state.TCP}, Port: 80, NodePort: 30062, ClusterEndpoints: ep}
	fine := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "web", Port: "http", Protocol: state.TCP}, Port: 80}
	snap := state.NewSnapshot([]state.ServicePort{sctp, fine})
	if err := p.Apply(snap); err != nil {
		t.Fatal(err)
	}
	// As Apply words a node port another program holds.
	syncErr := joinErrors(&userspace.PortError{Name: held.Name,
		Err: fmt.Errorf("userspace: service %s: listen on 0.0.0.0:30062 (node-port): bind: address already in use", held.Name)})
	var b strings.Builder
	d.write(&b, &debugSnapshot{snap: state.NewSnapshot([]state.ServicePort{sctp, held, fine}), err: syncErr})
	view := b.String()
	want := []string{"listening:    none: the last sync failed for it, and is retried: userspace: service e2e/app:http/TCP: listen on 0.0.0.0:30062 (node-port): bind: address already in use"}
	if p.Unsupported(sctp.Name) != nil {
		want = append(want, "listening:    none: its protocol is not served here (")
	} else {
		t.Log("this kernel has SCTP: only the failed sync is checked")
	}
	for _, w := range want {
		if !strings.Contains(view, w) {
			t.Errorf("lacks %q:\n%s", w, view)
		}
	}
	if !strings.Contains(view, "(proxy-port)") {
		t.Errorf("the port served lists no socket:\n%s", view)
	}
}

// TestDebugServicesSaysWhyHintsAreIgnored: a port whose endpoints carry
// topology hints this node cannot use says so, and why; it listed every
// endpoint as if the Service had no hints.
func TestDebugServicesSaysWhyHintsAreIgnored(t *testing.T) {
	p := userspace.New(userspace.Config{})
	t.Cleanup(func() { p.Close() })
	d := &debugView{p: p, mode: PortalNone}
	a := state.Endpoint{Addr: netip.MustParseAddrPort("198.18.12.2:8080"), Ready: true, Serving: true}
	b := state.Endpoint{Addr: netip.MustParseAddrPort("198.18.13.2:8080"), Ready: true, Serving: true}
	name := state.ServicePortName{Namespace: "e2e", Name: "web", Port: "http", Protocol: state.TCP}
	ignored := state.ServicePort{Name: name, Port: 80, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.62")},
		ClusterEndpoints: []state.Endpoint{a, b}, TopologyHintsIgnored: "zone hints ignored: none is for zone zone-x"}
	zoned := ignored
	a.Topology = "zone zone-a"
	zoned.ClusterEndpoints, zoned.TopologyHintsIgnored = []state.Endpoint{a}, "node hints ignored: none is for node node-a"
	for _, tc := range []struct {
		sp   state.ServicePort
		want string
	}{
		{ignored, "topology:     hints present but not used, so every ready endpoint takes traffic: zone hints ignored: none is for zone zone-x\n"},
		{zoned, "topology:     node hints ignored: none is for node node-a (other hints are used: see endpoints)\n"},
	} {
		var out strings.Builder
		d.write(&out, &debugSnapshot{snap: state.NewSnapshot([]state.ServicePort{tc.sp})})
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("lacks %q:\n%s", tc.want, out.String())
		}
	}
}

// TestDebugServicesTellsWhatFailedAndWhatLingers: after a failed portal
// sync the header names when the last sync that worked ended and the
// redirects are marked as wanted, not installed; connections reset after
// every dial attempt failed are counted beside those carried; connections
// of a deleted Service that go on are counted (xa55: the view said the
// failed sync "applied" its rules, and counted neither).
func TestDebugServicesTellsWhatFailedAndWhatLingers(t *testing.T) {
	p := userspace.New(userspace.Config{})
	t.Cleanup(func() { p.Close() })
	d := &debugView{p: p, mode: PortalIPTables}
	d.portals = func(s state.Snapshot) []portal.Portal { return portal.FromSnapshot(s, p.ProxyPort, nil) }

	backend, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	closed, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := netip.MustParseAddrPort(closed.Addr().String())
	closed.Close()
	ep := func(a netip.AddrPort) []state.Endpoint {
		return []state.Endpoint{{Addr: a, Ready: true, Serving: true}}
	}
	live := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "live", Port: "http", Protocol: state.TCP}, Port: 80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.80")}, ClusterEndpoints: ep(netip.MustParseAddrPort(backend.Addr().String()))}
	dead := state.ServicePort{Name: state.ServicePortName{Namespace: "e2e", Name: "dead", Port: "http", Protocol: state.TCP}, Port: 80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.81")}, ClusterEndpoints: ep(refusing)}
	both := state.NewSnapshot([]state.ServicePort{live, dead})
	if err := p.Apply(both); err != nil {
		t.Fatal(err)
	}
	d.applied(both, nil)
	view := func() string {
		var b strings.Builder
		d.write(&b, d.last.Load())
		return b.String()
	}
	if v := view(); !strings.Contains(v, ", applied ") {
		t.Errorf("a sync that worked is not said applied:\n%s", v)
	}

	// A connection through the live Service, and one the dead one gives up.
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", p.ProxyPort(live.Name)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Reset once every attempt failed, perhaps before Dial returns.
	if r, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", p.ProxyPort(dead.Name))); err == nil {
		r.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = r.Read(make([]byte, 1))
		r.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Activity()[dead.Name].GaveUp == 0 || p.Activity()[live.Name].OpenConnections == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("activity %+v", p.Activity())
		}
		time.Sleep(10 * time.Millisecond)
	}

	d.applied(both, joinErrors(kernelError{errors.New("portal: iptables: restore: exit status 4")}))
	v := view()
	for _, want := range []string{
		"last sync ", " failed (the last that did ended ",
		"(wanted: the portal's last sync failed, so the kernel may still hold the rules of the last one that worked)",
		"carried:      0 connections, 0 open; 1 reset after every dial attempt failed",
	} {
		if !strings.Contains(v, want) {
			t.Errorf("lacks %q:\n%s", want, v)
		}
	}
	if strings.Contains(v, ", applied ") {
		t.Errorf("a failed sync is said applied:\n%s", v)
	}

	// The live Service deleted: its connection goes on, and is counted.
	deadOnly := state.NewSnapshot([]state.ServicePort{dead})
	if err := p.Apply(deadOnly); err != nil {
		t.Fatal(err)
	}
	d.applied(deadOnly, nil)
	if v := view(); !strings.Contains(v, "1 connection of service ports no longer served still open") {
		t.Errorf("the deleted Service's open connection is not counted:\n%s", v)
	}
}

// checkSays fails t for each of want the view lacks and each of not it
// says.
func checkSays(t *testing.T, view string, want, not []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(view, w) {
			t.Errorf("lacks %q:\n%s", w, view)
		}
	}
	for _, n := range not {
		if strings.Contains(view, n) {
			t.Errorf("says %q:\n%s", n, view)
		}
	}
}
