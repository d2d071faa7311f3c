//go:build integration

package integration

import (
	"path/filepath"
	"testing"
	"time"
)

// The node-port addresses, as kube-proxy reads --nodeport-addresses: per
// IP family, for every portal that serves node ports.

// serveNodePorts starts a test world with backends be1 (8080, IPv4) and
// be6 (8081, IPv6) and the real binary in its node namespace on manifest
// with --portal=mode and args; it waits until the proxy serves: with
// iptables until its portals are synced, else until it logs serving at
// ready (a pattern).
func serveNodePorts(t *testing.T, mode, manifest, ready string, args ...string) (*world, *proxyProc) {
	t.Helper()
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, manifest)
	px := startNodeProxy(t, w, file, append([]string{"--portal=" + mode}, args...)...)
	if mode == "iptables" {
		px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	} else {
		px.waitLog(0, `"Serving".*`+ready, 1, 30*time.Second)
	}
	return w, px
}

// TestBinaryNodePortAddressesOfOneFamily: --nodeport-addresses with CIDRs
// of IPv4 alone narrows the IPv4 node ports to them and leaves the IPv6
// node ports on every IPv6 address, as kube-proxy adds ::/0 for a family
// none of the CIDRs is in; and the other way round. It turned every node
// port of the other family off.
func TestBinaryNodePortAddressesOfOneFamily(t *testing.T) {
	manifest := dualStackManifest + dualStackIPv6Slice
	for _, mode := range []string{"iptables", "bind", "none"} {
		t.Run(mode+"/IPv4 CIDR", func(t *testing.T) {
			w, _ := serveNodePorts(t, mode, manifest, `198.18.11.1:30096`, "--nodeport-addresses=198.18.11.0/24")
			expectReply(t, w.outside, "tcp", nodeOutSide+":30095", "be1:ping")
			expectReply(t, w.outside, "udp", nodeOutSide+":30096", "be1:ping")
			expectNoReply(t, w.pod, "tcp", nodePodSide+":30095") // outside the IPv4 CIDR
			expectReply(t, w.outside, "tcp", "[fd5e:b1b5:11::1]:30095", "be6:ping")
			expectReply(t, w.outside, "udp", "[fd5e:b1b5:11::1]:30096", "be6:ping")
			expectReply(t, w.pod, "tcp", "[fd5e:b1b5:10::1]:30095", "be6:ping")
		})
		t.Run(mode+"/IPv6 CIDR", func(t *testing.T) {
			w, _ := serveNodePorts(t, mode, manifest, `fd5e:b1b5:11::1\]:30096`, "--nodeport-addresses=fd5e:b1b5:11::/64")
			expectReply(t, w.outside, "tcp", "[fd5e:b1b5:11::1]:30095", "be6:ping")
			expectNoReply(t, w.pod, "tcp", "[fd5e:b1b5:10::1]:30095") // outside the IPv6 CIDR
			expectReply(t, w.outside, "tcp", nodeOutSide+":30095", "be1:ping")
			expectReply(t, w.outside, "udp", nodeOutSide+":30096", "be1:ping")
			expectReply(t, w.pod, "tcp", nodePodSide+":30095", "be1:ping")
		})
	}
}
