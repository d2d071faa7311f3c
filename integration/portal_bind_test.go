//go:build integration && linux

package integration

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// lo addresses in 198.18.0.0/15 or fd5e:b1b5::/32 on the node.
func serviceAddrsOn(t *testing.T, ns netns, dev string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(ns.mustRun(t, "ip", "-o", "addr", "show", "dev", dev), "\n") {
		f := strings.Fields(l)
		for i, w := range f {
			if (w == "inet" || w == "inet6") && i+1 < len(f) && (strings.HasPrefix(f[i+1], "198.1") || strings.HasPrefix(f[i+1], "fd5e:b1b5:")) {
				out = append(out, f[i+1])
			}
		}
	}
	return out
}

// bindDevice is where the bind portal puts addresses in this kernel: its
// dummy interface if the kernel has the driver, else lo.
func bindDevice(t *testing.T, ns netns) string {
	if _, err := ns.run("ip", "link", "show", "kube-ups0"); err == nil {
		return "kube-ups0"
	}
	return "lo"
}

func TestPortalBindTraffic(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	px := startProxyHelper(t, w, "bind", true)
	px.do(proxyReq{Op: "apply", Ports: servicePorts()})
	dev := bindDevice(t, w.node)
	t.Logf("bind portal uses %s", dev)
	got := serviceAddrsOn(t, w.node, dev)
	for _, want := range []string{"198.18.0.10/32", "198.18.0.53/32", "198.19.0.5/32", "198.19.1.1/32", "fd5e:b1b5::10/128", "fd5e:b1b5::80/128"} {
		if !strings.Contains(strings.Join(got, " "), want) {
			t.Errorf("%s missing on %s (have %v)", want, dev, got)
		}
	}
	if out := w.node.mustRun(t, "iptables-save"); strings.Contains(out, "KUBE-") {
		t.Errorf("bind portal wrote iptables rules:\n%s", out)
	}

	t.Run("TCP ClusterIP from the pod", func(t *testing.T) { expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping") })
	t.Run("TCP ClusterIP from the node", func(t *testing.T) { expectReply(t, w.node, "tcp", "198.18.0.10:80", "be1:ping") })
	t.Run("UDP ClusterIP from the pod", func(t *testing.T) { expectReply(t, w.pod, "udp", "198.18.0.53:53", "be1:ping") })
	t.Run("UDP ClusterIP from the node", func(t *testing.T) { expectReply(t, w.node, "udp", "198.18.0.53:53", "be1:ping") })
	t.Run("ExternalIP from the pod", func(t *testing.T) { expectReply(t, w.pod, "tcp", "198.19.0.5:80", "be1:ping") })
	t.Run("LB IP from the outside", func(t *testing.T) { expectReply(t, w.outside, "tcp", "198.19.1.1:80", "be1:ping") })
	t.Run("IPv6 ClusterIP from the pod", func(t *testing.T) { expectReply(t, w.pod, "tcp", "[fd5e:b1b5::80]:8080", "be6:ping") })
	t.Run("NodePort from the outside", func(t *testing.T) { expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping") })
	t.Run("UDP NodePort from the outside", func(t *testing.T) { expectReply(t, w.outside, "udp", nodeOutSide+":30053", "be1:ping") })

	// A deleted service stops answering and its addresses go.
	px.do(proxyReq{Op: "apply", Ports: servicePorts()[:1]})
	got = serviceAddrsOn(t, w.node, dev)
	if s := strings.Join(got, " "); strings.Contains(s, "198.18.0.53/32") || strings.Contains(s, "fd5e:b1b5::80/128") || !strings.Contains(s, "198.18.0.10/32") {
		t.Errorf("addresses after deleting two services: %v", got)
	}
	expectNoReply(t, w.pod, "udp", "198.18.0.53:53")
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")

	// Cleanup removes our addresses (and nothing else: lo keeps its own).
	px.do(proxyReq{Op: "cleanup"})
	if left := serviceAddrsOn(t, w.node, "lo"); len(left) > 0 {
		t.Errorf("addresses left on lo: %v", left)
	}
	if _, err := w.node.run("ip", "link", "show", "kube-ups0"); err == nil {
		t.Error("dummy interface left after cleanup")
	}
	if lo := w.node.mustRun(t, "ip", "addr", "show", "dev", "lo"); !strings.Contains(lo, "127.0.0.1/8") || !strings.Contains(lo, "::1/128") {
		t.Errorf("cleanup removed lo's own addresses:\n%s", lo)
	}
	px.do(proxyReq{Op: "cleanup"})
}

// TestPortalBindLeavesForeignAddresses: addresses someone else put on lo
// in the service range are not ours to remove.
func TestPortalBindLeavesForeignAddresses(t *testing.T) {
	w := newWorld(t)
	w.node.mustRun(t, "ip", "addr", "add", "198.18.0.200/32", "dev", "lo")
	w.node.mustRun(t, "ip", "-6", "addr", "add", "fd5e:b1b5::200/128", "dev", "lo")
	px := startProxyHelper(t, w, "bind", false)
	px.do(proxyReq{Op: "apply", Ports: servicePorts()})
	px.do(proxyReq{Op: "apply"})
	px.do(proxyReq{Op: "cleanup"})
	got := strings.Join(serviceAddrsOn(t, w.node, "lo"), " ")
	if got != "198.18.0.200/32 fd5e:b1b5::200/128" {
		t.Errorf("lo service-range addresses after cleanup = %q, want only the foreign ones", got)
	}
}

// TestBinarySwitchingPortals: a proxy restarted with another portal
// removes what the previous one left, as --cleanup would, and serves: the
// iptables rules would REDIRECT every Service to proxy ports nobody serves
// any more, and the bind portal's addresses would make load-balancer IPs
// the node's own. A proxy without a portal does the same when it may.
func TestBinarySwitchingPortals(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	stop := func(px *proxyProc) {
		t.Helper()
		if _, ok := px.terminate(10 * time.Second); !ok {
			t.Fatal("the proxy did not stop on SIGTERM")
		}
	}

	px := startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	// A second proxy without a portal, tried beside the running one,
	// leaves its rules alone: they are no leftovers.
	before := ourRules(t, w.node, "nft")
	beside := startNodeProxy(t, w, file, "--portal=none", "--healthz-bind-address=", "--metrics-bind-address=")
	beside.waitLog(0, `"Leaving the iptables portal's rules alone: a running proxy serves the ports they redirect to"`, 1, 30*time.Second)
	stop(beside)
	if after := ourRules(t, w.node, "nft"); !slices.Equal(before, after) {
		t.Errorf("a proxy without a portal changed a running proxy's rules:\n%v\nthen\n%v", before, after)
	}
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	stop(px)
	if len(ourRules(t, w.node, "nft")) == 0 {
		t.Fatal("the iptables portal left no rules to remove: the test proves nothing")
	}

	px = startNodeProxy(t, w, file, "--portal=bind")
	px.waitLog(0, `"Removing the iptables portal's rules a previous run left`, 1, 30*time.Second)
	px.waitLog(0, `"Serving".*198.18.0.53:53`, 1, 30*time.Second)
	if left := ourRules(t, w.node, "nft"); len(left) > 0 {
		t.Errorf("iptables rules left under the bind portal: %v", left)
	}
	if out := w.node.mustRun(t, "iptables-nft-save", "-t", "filter"); strings.Contains(out, "KUBE-PORTALS-FIREWALL") {
		t.Errorf("the firewall chain is left under the bind portal:\n%s", out)
	}
	checkServed(t, w, false)
	dev := bindDevice(t, w.node)
	if len(serviceAddrsOn(t, w.node, dev)) == 0 {
		t.Fatal("the bind portal added no addresses: the test proves nothing")
	}
	stop(px)

	px = startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	if left := serviceAddrsOn(t, w.node, dev); len(left) > 0 {
		t.Errorf("service addresses left on %s under the iptables portal: %v", dev, left)
	}
	checkServed(t, w, true)
	stop(px)

	// Without a portal, a proxy that may change the kernel's rules
	// removes them too: they would send its node ports to old proxy ports.
	px = startNodeProxy(t, w, file, "--portal=none")
	px.waitLog(0, `"Removing the iptables portal's rules a previous run left`, 1, 30*time.Second)
	px.waitLog(0, `"Serving".*via="node-port"`, 2, 30*time.Second)
	if left := ourRules(t, w.node, "nft"); len(left) > 0 {
		t.Errorf("iptables rules left under no portal: %v", left)
	}
	expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")
	expectReply(t, w.outside, "udp", nodeOutSide+":30053", "be1:ping")
	stop(px)

	// From bind to none: a proxy without a portal tried beside a running
	// bind portal leaves its addresses, which that one serves; once it is
	// gone, the next removes them (left, they would make load-balancer IPs
	// the node's own).
	px = startNodeProxy(t, w, file, "--portal=bind")
	px.waitLog(0, `"Serving".*198.18.0.53:53`, 1, 30*time.Second)
	addrs := serviceAddrsOn(t, w.node, dev)
	beside = startNodeProxy(t, w, file, "--portal=none", "--healthz-bind-address=", "--metrics-bind-address=")
	beside.waitLog(0, `"Leaving the bind portal's service addresses alone: a running proxy serves them"`, 1, 30*time.Second)
	stop(beside)
	if now := serviceAddrsOn(t, w.node, dev); !slices.Equal(now, addrs) {
		t.Errorf("a proxy without a portal changed a running bind portal's addresses: %v, then %v", addrs, now)
	}
	checkServed(t, w, false)
	stop(px)
	px = startNodeProxy(t, w, file, "--portal=none")
	px.waitLog(0, `"Removing the service addresses a previous run's bind portal left`, 1, 30*time.Second)
	// The line comes before the removal: give it a moment.
	left := serviceAddrsOn(t, w.node, dev)
	for deadline := time.Now().Add(10 * time.Second); len(left) > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		left = serviceAddrsOn(t, w.node, dev)
	}
	if len(left) > 0 {
		t.Errorf("service addresses left on %s under no portal 10s after their removal began: %v", dev, left)
	}
	// The removal comes before the node ports are served.
	px.waitLog(0, `"Serving".*via="node-port"`, 2, 30*time.Second)
	expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")
}

// TestBinarySwitchingPortalsFindsTheBindInterface: the service addresses
// a bind portal put on its --bind-interface are removed by the next run
// with another portal even without that flag, found by their label: left,
// they would make load-balancer IPs the node's own, where node ports
// serve them round their source ranges.
func TestBinarySwitchingPortalsFindsTheBindInterface(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	// A veth pair: this kernel has no dummy driver.
	w.node.mustRun(t, "ip", "link", "add", "kup-alt", "type", "veth", "peer", "name", "kup-alt-peer")
	w.node.mustRun(t, "ip", "link", "set", "kup-alt", "up")
	w.node.mustRun(t, "ip", "link", "set", "kup-alt-peer", "up")

	px := startNodeProxy(t, w, file, "--portal=bind", "--bind-interface=kup-alt")
	px.waitLog(0, `"Serving".*198.18.0.53:53`, 1, 30*time.Second)
	if len(serviceAddrsOn(t, w.node, "kup-alt")) == 0 {
		t.Fatal("the bind portal added no addresses to kup-alt: the test proves nothing")
	}
	if _, ok := px.terminate(10 * time.Second); !ok {
		t.Fatal("the proxy did not stop on SIGTERM")
	}

	px = startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	if left := serviceAddrsOn(t, w.node, "kup-alt"); len(left) > 0 {
		t.Errorf("service addresses left on kup-alt under the iptables portal: %v", left)
	}
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
}
