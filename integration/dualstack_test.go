//go:build integration && linux

package integration

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// dualStackManifest is a dual-stack NodePort Service with an IPv4 and an
// IPv6 EndpointSlice whose endpoints answer with different names (be1 and
// be6), so a reply tells which family's endpoint a client reached.
const dualStackManifest = `apiVersion: v1
kind: Service
metadata: {name: ds, namespace: e2e}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 198.18.0.40
  clusterIPs: [198.18.0.40, "fd5e:b1b5::40"]
  ports:
  - {name: http, protocol: TCP, port: 80, nodePort: 30095}
  - {name: dns, protocol: UDP, port: 53, nodePort: 30096}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ds-4, namespace: e2e, labels: {kubernetes.io/service-name: ds}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}, {name: dns, protocol: UDP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"]}]
`

const dualStackIPv6Slice = `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ds-6, namespace: e2e, labels: {kubernetes.io/service-name: ds}}
addressType: IPv6
ports: [{name: http, protocol: TCP, port: 8081}, {name: dns, protocol: UDP, port: 8081}]
endpoints: [{addresses: ["fd5e:b1b5:12::2"]}]
`

// TestBinaryDualStackKeepsFamilies: the real binary, with the iptables and
// the bind portal, sends a dual-stack Service's IPv4 clients to its IPv4
// endpoints and its IPv6 clients to its IPv6 ones, at the cluster IPs and
// the node ports, over TCP and UDP, as kube-proxy's proxier of each family
// does; with no IPv6 endpoint left, IPv6 clients are refused (with
// iptables, by an ip6tables REJECT: "connection refused" at once) while
// IPv4 clients go on.
func TestBinaryDualStackKeepsFamilies(t *testing.T) {
	for _, mode := range []string{"iptables", "bind"} {
		t.Run(mode, func(t *testing.T) {
			w, _, file := serveManifest(t, mode, dualStackManifest+dualStackIPv6Slice, `fd5e:b1b5::40\]:53`, "8080=be1", "8081=be6")

			// Round robin over both families would send some of
			// these to the other family's endpoint.
			for range 3 {
				expectReply(t, w.pod, "tcp", "198.18.0.40:80", "be1:ping")
				expectReply(t, w.pod, "tcp", "[fd5e:b1b5::40]:80", "be6:ping")
				expectReply(t, w.pod, "udp", "198.18.0.40:53", "be1:ping")
				expectReply(t, w.pod, "udp", "[fd5e:b1b5::40]:53", "be6:ping")
				expectReply(t, w.outside, "tcp", nodeOutSide+":30095", "be1:ping")
				expectReply(t, w.outside, "tcp", "[fd5e:b1b5:11::1]:30095", "be6:ping")
				expectReply(t, w.outside, "udp", nodeOutSide+":30096", "be1:ping")
				expectReply(t, w.outside, "udp", "[fd5e:b1b5:11::1]:30096", "be6:ping")
			}

			writeFile(t, file, dualStackManifest)
			eventuallyNot(t, w.pod, "tcp", "[fd5e:b1b5::40]:80")
			expectNoReply(t, w.pod, "udp", "[fd5e:b1b5::40]:53")
			expectNoReply(t, w.outside, "tcp", "[fd5e:b1b5:11::1]:30095")
			expectReply(t, w.pod, "tcp", "198.18.0.40:80", "be1:ping")
			expectReply(t, w.pod, "udp", "198.18.0.40:53", "be1:ping")
			expectReply(t, w.outside, "tcp", nodeOutSide+":30095", "be1:ping")
			// The teaching view (metrics server, default address) says why.
			code, view := curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services")
			refusal := map[string]string{"iptables": "new connections are refused (the portal's REJECT rule)", "bind": "new connections are reset by the proxy"}[mode]
			if code != "200" || !strings.Contains(view, "  note:         no IPv6 endpoint: from IPv6 clients, "+refusal) ||
				mode == "iptables" && !strings.Contains(view, "[fd5e:b1b5::40]:80/TCP -> ") ||
				mode == "iptables" && !strings.Contains(view, " (refused: no IPv6 endpoint)") {
				t.Errorf("/debug/services: %s\n%s", code, view)
			}
			if mode == "iptables" {
				// The proxy resets and drops as soon as it has the
				// edit, which is all the checks above wait for; the
				// REJECT rules may come a sync period later.
				waitIP6Rule(t, w.node, "e2e/ds:http has no endpoints", "-j REJECT")
				waitIP6Rule(t, w.node, "e2e/ds:dns has no endpoints", "-j REJECT")
				// The kernel sends a host a few ICMPv6 errors at once,
				// then one a second (net.ipv6.icmp.ratelimit): the
				// checks above used them up.
				time.Sleep(1100 * time.Millisecond)
				if r := dial(t, w.pod, "udp-connected", "[fd5e:b1b5::40]:53", "ping", 0); !strings.Contains(r.Err, "connection refused") {
					t.Errorf("UDP to the IPv6 cluster IP without IPv6 endpoints: %+v; want \"connection refused\"", r)
				}
				time.Sleep(1100 * time.Millisecond)
				// TCP is refused with a reset (REJECT --reject-with
				// tcp-reset), which nc reports as "refused": tell it from
				// a timeout.
				start := time.Now()
				out, err := w.pod.run("nc", "-z", "-v", "-w2", "fd5e:b1b5::40", "80")
				if err == nil || !strings.Contains(out, "refused") || time.Since(start) > 1500*time.Millisecond {
					t.Errorf("nc -z to the IPv6 cluster IP without IPv6 endpoints: %v after %v: %q; want a quick refusal",
						err, time.Since(start).Round(time.Millisecond), out)
				}
				for _, r := range ourRules(t, w.node, "nft") {
					if strings.Contains(r, "e2e/ds:http has no endpoints") && !strings.HasPrefix(r, "ip6") {
						t.Errorf("IPv4 rejects though it has an endpoint: %s", r)
					}
				}
			}

			writeFile(t, file, dualStackManifest+dualStackIPv6Slice)
			eventually(t, w.pod, "tcp", "[fd5e:b1b5::40]:80", "be6:ping")
			expectReply(t, w.pod, "udp", "[fd5e:b1b5::40]:53", "be6:ping")

			if mode != "iptables" {
				return
			}
			// Local policies, with the IPv4 endpoint on this node and the
			// IPv6 one on another: IPv6 clients from outside are dropped
			// (DROP, not REJECT), while the node's own traffic to the
			// node port goes to the IPv6 endpoint. /debug/services said
			// "IPv6 clients are refused".
			local := strings.Replace(dualStackManifest, "  ports:\n", "  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local\n  ports:\n", 1)
			local = strings.Replace(local, `endpoints: [{addresses: ["198.18.12.2"]}]`, `endpoints: [{addresses: ["198.18.12.2"], nodeName: node}]`, 1)
			remote6 := strings.Replace(dualStackIPv6Slice, `endpoints: [{addresses: ["fd5e:b1b5:12::2"]}]`, `endpoints: [{addresses: ["fd5e:b1b5:12::2"], nodeName: other}]`, 1)
			writeFile(t, file, local+remote6)
			want := "  note:         no IPv6 endpoint on this node: from IPv6 clients, new connections are dropped (the portal's DROP rule), as kube-proxy drops them (traffic from this node to node and external addresses goes to every endpoint (from pods too, given --cluster-cidr))"
			deadline := time.Now().Add(20 * time.Second)
			for {
				code, view = curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services")
				if code == "200" && strings.Contains(view, want) && strings.Contains(view, "(dropped but from this node: no IPv6 endpoint on this node)") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("/debug/services (%s) lacks %q:\n%s", code, want, view)
				}
				time.Sleep(200 * time.Millisecond)
			}
			if strings.Contains(view, "IPv6 clients are refused") || strings.Contains(view, "no IPv6 endpoint:") {
				t.Errorf("/debug/services says IPv6 clients are refused:\n%s", view)
			}
			// The view follows the edit at once; the portal's rules may
			// wait for --iptables-min-sync-period after the last sync, or
			// longer on a busy machine. The old rules served the checks
			// below too (the node's own client, and an outside one the
			// old rules let through), so wait for the new DROP rule first.
			waitIP6Rule(t, w.node, "e2e/ds:http has no local endpoints", "-j DROP")
			eventually(t, w.node, "tcp", "[fd5e:b1b5:11::1]:30095", "be6:ping")
			start := time.Now()
			out, err := w.outside.run("nc", "-z", "-v", "-w2", "fd5e:b1b5:11::1", "30095")
			if took := time.Since(start); err == nil || strings.Contains(out, "refused") || took < 1500*time.Millisecond {
				t.Errorf("nc -z to the IPv6 node port from outside: %v after %v: %q; want a timeout (dropped)", err, took.Round(time.Millisecond), out)
			}
		})
	}
}

// waitIP6Rule waits until ns has an ip6tables rule of ours whose comment
// has comment and whose target starts with target.
func waitIP6Rule(t *testing.T, ns netns, comment, target string) {
	t.Helper()
	has := func(r string) bool {
		return strings.HasPrefix(r, "ip6") && strings.Contains(r, comment) && strings.Contains(r, target)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		rules := ourRules(t, ns, "nft")
		if slices.ContainsFunc(rules, has) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ip6tables rule %q ... %q after 20 s:\n%s", comment, target, strings.Join(rules, "\n"))
		}
	}
}

// TestBinaryUDPNodePortFromLinkLocal: a client on the node's link sends to
// the node's IPv6 link-local address and a dual-stack Service's UDP node
// port; the reply must leave by that link, from that address. It never
// came: the client's scope was lost, so the reply had no interface to go
// by (TCP was fine). Both portals that serve node ports for clients off
// the node.
func TestBinaryUDPNodePortFromLinkLocal(t *testing.T) {
	for _, mode := range []string{"iptables", "bind"} {
		t.Run(mode, func(t *testing.T) {
			w, _, _ := serveManifest(t, mode, dualStackManifest+dualStackIPv6Slice, `fd5e:b1b5::40\]:53`, "8080=be1", "8081=be6")
			w.node.mustRun(t, "ip", "-6", "addr", "add", "fe80::11:1/64", "dev", "to-out", "nodad")
			w.outside.mustRun(t, "ip", "-6", "addr", "add", "fe80::11:2/64", "dev", "eth0", "nodad")
			expectReply(t, w.outside, "udp", "[fe80::11:1%eth0]:30096", "be6:ping")
			expectReply(t, w.outside, "tcp", "[fe80::11:1%eth0]:30095", "be6:ping")
		})
	}
}

// TestBinaryUDPFromPodBehindLinkLocalGateway: a pod whose node side of the
// veth has only a link-local IPv6 address (fe80::1, Calico's layout: the
// pod's default route is via fe80::1, the node routes the pod's /128 to
// the veth) sends to an IPv6 UDP cluster IP. ip6tables REDIRECT delivers
// the datagram to fe80::1, so the reply must leave from fe80::1 by that
// veth. It never came: the reply named fe80::1 as source but no interface,
// the kernel refused to send it (EINVAL), and the proxy counted a drop.
// Both builds, which read and write the control messages each their own
// way.
func TestBinaryUDPFromPodBehindLinkLocalGateway(t *testing.T) {
	for _, build := range bothBuilds(t) {
		t.Run(build.name, func(t *testing.T) {
			w := newWorld(t)
			w.node.mustRun(t, "ip", "-6", "addr", "flush", "dev", "to-pod")
			w.node.mustRun(t, "ip", "-6", "addr", "add", "fe80::1/64", "dev", "to-pod", "nodad")
			w.node.mustRun(t, "ip", "-6", "route", "add", "fd5e:b1b5:10::2/128", "dev", "to-pod")
			w.pod.mustRun(t, "ip", "-6", "route", "replace", "default", "via", "fe80::1", "dev", "eth0")
			if out := w.node.mustRun(t, "ip", "-6", "-o", "addr", "show", "dev", "to-pod"); strings.Count(out, "inet6") != 1 {
				t.Fatalf("the node's side of the pod's veth should have fe80::1 only:\n%s", out)
			}
			startBackend(t, w.backend, "8080=be1", "8081=be6")
			file := filepath.Join(t.TempDir(), "services.yaml")
			writeFile(t, file, dualStackManifest+dualStackIPv6Slice)
			px := startCommand(t, "ip", "netns", "exec", string(w.node), build.bin, "--manifests", file,
				"--hostname-override=node", "-v=2", "--portal=iptables")
			px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)

			expectReply(t, w.pod, "tcp", "[fd5e:b1b5::40]:80", "be6:ping")
			expectReply(t, w.pod, "udp", "[fd5e:b1b5::40]:53", "be6:ping")
			code, metrics := curlCodeIn(t, w.node, "http://127.0.0.1:10249/metrics")
			// The series must be there, at 0: a renamed or missing
			// counter would pass a check of the lines it finds.
			found := false
			for _, l := range strings.Split(metrics, "\n") {
				if v, ok := strings.CutPrefix(l, "kube_userspace_proxy_udp_dropped_total "); ok {
					found = true
					if v != "0" {
						t.Errorf("/metrics (%s): %s, want 0", code, l)
					}
				}
			}
			if !found {
				t.Errorf("/metrics (%s) has no kube_userspace_proxy_udp_dropped_total:\n%s", code, metrics)
			}
		})
	}
}
