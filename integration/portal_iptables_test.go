//go:build integration && linux

package integration

import (
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

var (
	webName = state.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: state.TCP}
	dnsName = state.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: state.UDP}
	sixName = state.ServicePortName{Namespace: "default", Name: "six", Port: "http", Protocol: state.TCP}
)

func addrList(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func endpoints(s ...string) []state.Endpoint {
	var out []state.Endpoint
	for _, a := range s {
		out = append(out, state.Endpoint{Addr: netip.MustParseAddrPort(a), Ready: true, Serving: true})
	}
	return out
}

// servicePorts is the snapshot of the traffic tests: a TCP service with
// every kind of frontend in both families and the backend's port 8080 in
// each (a client goes to an endpoint of its own family), a UDP one with a
// node port, and an IPv6-only one with an IPv6 endpoint.
func servicePorts() []state.ServicePort {
	return []state.ServicePort{
		{Name: webName, Port: 80, ClusterIPs: addrList("198.18.0.10", "fd5e:b1b5::10"), ExternalIPs: addrList("198.19.0.5"),
			LoadBalancerIPs: addrList("198.19.1.1"), NodePort: 30080, ClusterEndpoints: endpoints(backendAddr+":8080", "["+backendAddr6+"]:8080")},
		{Name: dnsName, Port: 53, ClusterIPs: addrList("198.18.0.53"), NodePort: 30053, ClusterEndpoints: endpoints(backendAddr + ":8080")},
		{Name: sixName, Port: 8080, ClusterIPs: addrList("fd5e:b1b5::80"), ClusterEndpoints: endpoints("[" + backendAddr6 + "]:8081")},
	}
}

// ourRules returns the lines of iptables-save (both families, the backend
// the portal chose) that belong to our chains or jump into them, without
// counters: what must be equal after a restart.
func ourRules(t *testing.T, ns netns, backend string) []string {
	t.Helper()
	var out []string
	for _, bin := range []string{"iptables-" + backend + "-save", "ip6tables-" + backend + "-save"} {
		for _, l := range strings.Split(ns.mustRun(t, bin), "\n") {
			if strings.Contains(l, "KUBE-PORTALS-") || strings.Contains(l, "KUBE-NODEPORT-") {
				out = append(out, bin[:3]+" "+regexp.MustCompile(`\[\d+:\d+\]`).ReplaceAllString(l, ""))
			}
		}
	}
	return out
}

func TestPortalIPTablesTraffic(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	px := startProxyHelper(t, w, "iptables", true)
	resp := px.do(proxyReq{Op: "apply", Ports: servicePorts(), Clear: true})
	if resp.Backend != "nft" {
		t.Errorf("backend = %q, want nft in a namespace without legacy rules", resp.Backend)
	}
	t.Logf("portals: %q", resp.Portals)

	t.Run("TCP ClusterIP from the pod", func(t *testing.T) { expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping") })
	t.Run("TCP ClusterIP from the node", func(t *testing.T) { expectReply(t, w.node, "tcp", "198.18.0.10:80", "be1:ping") })
	t.Run("UDP ClusterIP from the pod", func(t *testing.T) { expectReply(t, w.pod, "udp", "198.18.0.53:53", "be1:ping") })
	t.Run("UDP ClusterIP from the node", func(t *testing.T) { expectReply(t, w.node, "udp", "198.18.0.53:53", "be1:ping") })
	t.Run("ExternalIP from the pod", func(t *testing.T) { expectReply(t, w.pod, "tcp", "198.19.0.5:80", "be1:ping") })
	t.Run("LB IP from the outside", func(t *testing.T) { expectReply(t, w.outside, "tcp", "198.19.1.1:80", "be1:ping") })
	t.Run("IPv6 ClusterIP from the pod", func(t *testing.T) { expectReply(t, w.pod, "tcp", "[fd5e:b1b5::10]:80", "be1:ping") })
	t.Run("IPv6 ClusterIP from the node", func(t *testing.T) { expectReply(t, w.node, "tcp", "[fd5e:b1b5::80]:8080", "be6:ping") })
	t.Run("TCP NodePort from the outside", func(t *testing.T) { expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping") })
	t.Run("UDP NodePort from the outside", func(t *testing.T) { expectReply(t, w.outside, "udp", nodeOutSide+":30053", "be1:ping") })
	t.Run("NodePort on the node's own address", func(t *testing.T) { expectReply(t, w.node, "tcp", nodePodSide+":30080", "be1:ping") })
	t.Run("IPv6 NodePort from the outside", func(t *testing.T) { expectReply(t, w.outside, "tcp", "[fd5e:b1b5:11::1]:30080", "be1:ping") })
	t.Run("NodePort on a non-local address is not caught", func(t *testing.T) { expectNoReply(t, w.pod, "tcp", "198.18.99.1:30080") })

	t.Run("every rule carries its service comment", func(t *testing.T) {
		rules := ourRules(t, w.node, resp.Backend)
		n, hostJumps := 0, 0
		for _, r := range rules {
			if !strings.Contains(r, "-A KUBE-") {
				continue
			}
			// The host chains are one jump each into the container
			// chains, whose rules name the services.
			if strings.HasSuffix(r, " -j KUBE-PORTALS-CONTAINER") || strings.HasSuffix(r, " -j KUBE-NODEPORT-CONTAINER") {
				hostJumps++
				continue
			}
			if strings.Contains(r, ` --comment "kube-userspace-proxy: loopback node ports are for this host alone" -j RETURN`) {
				continue // leaves loopback destinations to the host chain
			}
			n++
			if !regexp.MustCompile(`--comment "?[a-z-]+/[a-z]+(:[a-z]+)?"? `).MatchString(r) {
				t.Errorf("rule without a service comment: %s", r)
			}
		}
		if n == 0 {
			t.Fatalf("no rules in our chains:\n%s", strings.Join(rules, "\n"))
		}
		if hostJumps != 4 { // two chains, IPv4 and IPv6
			t.Errorf("%d host chain jumps, want 4:\n%s", hostJumps, strings.Join(rules, "\n"))
		}
	})

	// An empty set removes every rule of ours, but keeps the chains.
	px.do(proxyReq{Op: "apply", Clear: true})
	for _, r := range ourRules(t, w.node, resp.Backend) {
		if strings.Contains(r, "-A KUBE-") {
			t.Errorf("rule left after syncing nothing: %s", r)
		}
	}
	expectNoReply(t, w.pod, "tcp", "198.18.0.10:80")

	// Cleanup removes chains and jumps, and is harmless the second time.
	px.do(proxyReq{Op: "cleanup"})
	if left := ourRules(t, w.node, resp.Backend); len(left) > 0 {
		t.Errorf("left after cleanup:\n%s", strings.Join(left, "\n"))
	}
	px.do(proxyReq{Op: "cleanup"})
}

// TestPortalIPTablesRestartConverges kills the portal's process and starts
// another: it reads the rules the first one left, and writing the same
// portals gives the same rules; a smaller set then removes the others.
func TestPortalIPTablesRestartConverges(t *testing.T) {
	w := newWorld(t)
	sctpName := state.ServicePortName{Namespace: "tel", Name: "sig", Protocol: state.SCTP}
	ports := append(servicePorts(), state.ServicePort{Name: sctpName, Port: 3868, ClusterIPs: addrList("198.18.0.99"), NodePort: 30868})
	proxyPorts := map[string]uint16{webName.String(): 41001, dnsName.String(): 41002, sixName.String(): 41003, sctpName.String(): 41004}
	first := startProxyHelper(t, w, "iptables", false)
	r1 := first.do(proxyReq{Op: "apply", Ports: ports, ProxyPorts: proxyPorts})
	before := ourRules(t, w.node, r1.Backend)
	if !slices.ContainsFunc(before, func(r string) bool {
		return strings.Contains(r, "-p sctp -m comment --comment \"tel/sig\" -m sctp --dport 3868")
	}) {
		t.Errorf("no SCTP rule written:\n%s", strings.Join(before, "\n"))
	}
	first.kill()

	second := startProxyHelper(t, w, "iptables", false)
	ex := second.do(proxyReq{Op: "existing"})
	var want []string
	for _, p := range r1.Portals {
		// The rules do not tell address kinds apart.
		p = strings.NewReplacer("ExternalIP ", "ClusterIP ", "LoadBalancerIP ", "ClusterIP ").Replace(p)
		want = append(want, p)
	}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(ex.Portals))
	if !slices.Equal(got, want) {
		t.Errorf("existing portals after restart =\n%q\nwant\n%q", got, want)
	}
	if after := ourRules(t, w.node, r1.Backend); !slices.Equal(after, before) {
		t.Errorf("rules changed by starting a new portal:\n%s\nbefore:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	second.do(proxyReq{Op: "apply", Ports: ports, ProxyPorts: proxyPorts})
	if after := ourRules(t, w.node, r1.Backend); !slices.Equal(after, before) {
		t.Errorf("rules after the restart's sync differ:\n%s\nbefore:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	second.do(proxyReq{Op: "apply", Ports: ports[:1], ProxyPorts: proxyPorts})
	for _, r := range ourRules(t, w.node, r1.Backend) {
		if strings.Contains(r, "kube-system/dns") || strings.Contains(r, "default/six") || strings.Contains(r, "tel/sig") {
			t.Errorf("stale rule kept: %s", r)
		}
	}
	// Cleanup also removes a jump an old kube-proxy (userspace mode, same
	// chain names) left with its own comment.
	w.node.mustRun(t, "iptables-"+r1.Backend, "-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment",
		"handle ClusterIPs; NOTE: this must be before the NodePort rules", "-j", "KUBE-PORTALS-CONTAINER")
	second.do(proxyReq{Op: "cleanup"})
	if left := ourRules(t, w.node, r1.Backend); len(left) > 0 {
		t.Errorf("left after cleanup:\n%s", strings.Join(left, "\n"))
	}
}

// TestPortalIPTablesLegacyBackend: when the host's rules live in the
// legacy backend, the portal writes there, and nothing into nft.
func TestPortalIPTablesLegacyBackend(t *testing.T) {
	w := newWorld(t)
	w.node.mustRun(t, "iptables-legacy", "-A", "INPUT", "-s", "198.18.250.0/24", "-j", "ACCEPT")
	w.node.mustRun(t, "iptables-legacy", "-A", "INPUT", "-s", "198.18.251.0/24", "-j", "ACCEPT")
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	px := startProxyHelper(t, w, "iptables", true)
	resp := px.do(proxyReq{Op: "apply", Ports: servicePorts()})
	if resp.Backend != "legacy" {
		t.Fatalf("backend = %q, want legacy", resp.Backend)
	}
	if n := len(ourRules(t, w.node, "nft")); n != 0 {
		t.Errorf("%d rules of ours in nft", n)
	}
	if n := len(ourRules(t, w.node, "legacy")); n == 0 {
		t.Errorf("no rules of ours in legacy")
	}
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	expectReply(t, w.node, "udp", "198.18.0.53:53", "be1:ping")
	px.do(proxyReq{Op: "cleanup"})
	if left := ourRules(t, w.node, "legacy"); len(left) > 0 {
		t.Errorf("left after cleanup:\n%s", strings.Join(left, "\n"))
	}
}

// TestPortalIPTablesNodePortAddresses: --nodeport-addresses limits which
// node addresses answer a NodePort.
func TestPortalIPTablesNodePortAddresses(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	px := startProxyHelper(t, w, "iptables", true)
	px.do(proxyReq{Op: "apply", Ports: servicePorts(), NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.18.11.0/24")}})
	expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")
	expectNoReply(t, w.pod, "tcp", nodePodSide+":30080")
	px.do(proxyReq{Op: "cleanup"})
}

// TestPortalIPTablesKillRestart kills the proxy (data plane and portal)
// with SIGKILL and starts a new one: clients, including a UDP client that
// keeps its source port across the restart, are served again within 2 s.
func TestPortalIPTablesKillRestart(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	first := startProxyHelper(t, w, "iptables", true)
	first.do(proxyReq{Op: "apply", Ports: servicePorts(), Clear: true})
	const clientPort = 45454
	if r := dial(t, w.pod, "udp", "198.18.0.53:53", "a", clientPort); r.Reply != "be1:a" {
		t.Fatalf("before the restart: %+v", r)
	}
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")

	killed := time.Now()
	first.kill()
	second := startProxyHelper(t, w, "iptables", true)
	// The first sync of a new process clears every UDP frontend's entries:
	// it cannot know the old proxy ports were kept.
	r := second.do(proxyReq{Op: "apply", Ports: servicePorts(), Clear: true})
	if r.Cleared == 0 {
		t.Errorf("the restart's first sync cleared no conntrack entries")
	}
	// From this process: a client helper's exit would count (a second
	// under the race detector, see dialHere).
	udp := dialHere(t, w.pod, "udp", "198.18.0.53:53", "b", clientPort)
	tcp := dialHere(t, w.pod, "tcp", "198.18.0.10:80", "c", 0)
	took := time.Since(killed)
	t.Logf("served again %v after SIGKILL (helper start, one apply and sync, two exchanges)", took.Round(time.Millisecond))
	if udp.Reply != "be1:b" || tcp.Reply != "be1:c" {
		t.Errorf("after the restart: udp %+v, tcp %+v", udp, tcp)
	}
	if took > 2*time.Second {
		t.Errorf("clients were served again only after %v, want within 2 s", took)
	}
	second.do(proxyReq{Op: "cleanup"})
}
