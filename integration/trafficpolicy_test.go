//go:build integration && linux

package integration

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// etpLocalManifest is a NodePort Service with externalTrafficPolicy: Local
// and two endpoints, one on this node ("node") and one on another.
const etpLocalManifest = `apiVersion: v1
kind: Service
metadata: {name: etp, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.40
  externalTrafficPolicy: Local
  ports: [{name: http, protocol: TCP, port: 80, nodePort: 30095}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: etp-here, namespace: e2e, labels: {kubernetes.io/service-name: etp}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: node}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: etp-there, namespace: e2e, labels: {kubernetes.io/service-name: etp}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8081}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: other}]
`

// TestBinaryClusterCIDRTrafficIsNotExternal: with --cluster-cidr, a pod's
// traffic to a node port of an externalTrafficPolicy: Local Service goes
// to all its endpoints, as kube-proxy routes it, while traffic from
// outside the cluster reaches only this node's endpoint. Through the
// iptables portal, which keeps the client's address.
func TestBinaryClusterCIDRTrafficIsNotExternal(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=here", "8081=there")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, etpLocalManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables", "--cluster-cidr=198.18.10.0/24,fd5e:b1b5:10::/64")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)

	reached := func(ns netns) map[string]int {
		seen := map[string]int{}
		for range 6 {
			r := dial(t, ns, "tcp", nodePodSide+":30095", "ping", 0)
			if r.Err != "" {
				t.Fatalf("from %s: %s", ns, r.Err)
			}
			name, _, _ := strings.Cut(r.Reply, ":")
			seen[name]++
		}
		return seen
	}
	if got := reached(w.pod); got["here"] != 3 || got["there"] != 3 {
		t.Errorf("a pod's node-port traffic reached %v; want both endpoints, round robin", got)
	}
	if got := reached(w.outside); got["here"] != 6 {
		t.Errorf("outside node-port traffic reached %v; want this node's endpoint only", got)
	}
}

// TestBinaryLocalPolicyWithoutLocalEndpointDrops: through the iptables
// portal, a Service whose traffic policy is Local, with endpoints only on
// other nodes, has its new connections dropped, as kube-proxy's DROP rules
// ("has no local endpoints") drop them: the client times out, where the
// proxy would accept and reset. External traffic from this node and from
// pods still goes to every endpoint, as kube-proxy routes it.
func TestBinaryLocalPolicyWithoutLocalEndpointDrops(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8081=there")
	itp := `---
apiVersion: v1
kind: Service
metadata: {name: itp, namespace: e2e}
spec:
  clusterIP: 198.18.0.41
  internalTrafficPolicy: Local
  ports: [{name: http, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: itp-there, namespace: e2e, labels: {kubernetes.io/service-name: itp}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8081}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: other}]
`
	// The etp Service without its endpoint on this node.
	etp, _, ok := strings.Cut(etpLocalManifest, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: etp-here")
	if !ok {
		t.Fatal("etpLocalManifest changed shape")
	}
	_, there, _ := strings.Cut(etpLocalManifest, "nodeName: node}]\n")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, etp+there+itp)
	px := startNodeProxy(t, w, file, "--portal=iptables", "--cluster-cidr=198.18.10.0/24")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)

	dropped := func(from netns, addr, port string) {
		t.Helper()
		start := time.Now()
		out, err := from.run("nc", "-z", "-v", "-w2", addr, port)
		if took := time.Since(start); err == nil || strings.Contains(out, "refused") || took < 1500*time.Millisecond {
			t.Errorf("nc -z %s %s from %s: %v after %v: %q; want a timeout (dropped)", addr, port, from, err, took.Round(time.Millisecond), out)
		}
	}
	dropped(w.outside, nodeOutSide, "30095")
	dropped(w.pod, "198.18.0.41", "80")
	dropped(w.node, "198.18.0.41", "80")
	expectReply(t, w.pod, "tcp", nodePodSide+":30095", "there:ping")
	expectReply(t, w.node, "tcp", nodeOutSide+":30095", "there:ping")

	code, view := curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services")
	for _, want := range []string{
		"endpoints:    none on this node: new connections are dropped (the portal's DROP rule), as kube-proxy drops them",
		"(dropped: no IPv4 endpoint on this node)",
		"(dropped but from this node and pods: no IPv4 endpoint on this node)",
	} {
		if code != "200" || !strings.Contains(view, want) {
			t.Errorf("/debug/services (%s) lacks %q:\n%s", code, want, view)
		}
	}
}

// hcDropManifest is a dual-stack LoadBalancer Service with
// externalTrafficPolicy: Local, an IPv4 endpoint (and no IPv6 one) on this
// node, and a
// health-check node port.
const hcDropManifest = `apiVersion: v1
kind: Service
metadata: {name: lb, namespace: e2e}
spec:
  type: LoadBalancer
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 198.18.0.60
  clusterIPs: [198.18.0.60, "fd5e:b1b5::60"]
  externalTrafficPolicy: Local
  healthCheckNodePort: 30100
  ports: [{name: http, protocol: TCP, port: 80, nodePort: 30061}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-4, namespace: e2e, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: node}]
`

// TestBinaryHealthCheckNodePortThroughDropPolicy: on a node whose INPUT
// policy drops (only established traffic, loopback and ICMPv6 accepted),
// a cloud load balancer's health checks reach the health-check node port
// of an externalTrafficPolicy: Local Service from outside, in both
// families, as kube-proxy's "health check node port" ACCEPT rules let
// them: the iptables portal accepts the port in KUBE-NODEPORT-NON-LOCAL.
// They timed out, while the node port itself (redirected, so accepted)
// answered, and checks from the node itself worked.
func TestBinaryHealthCheckNodePortThroughDropPolicy(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1")
	for _, ipt := range []string{"iptables", "ip6tables"} {
		w.node.mustRun(t, ipt, "-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
		w.node.mustRun(t, ipt, "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
		w.node.mustRun(t, ipt, "-P", "INPUT", "DROP")
	}
	// Neighbour discovery, or IPv6 stops at the link.
	w.node.mustRun(t, "ip6tables", "-A", "INPUT", "-p", "ipv6-icmp", "-j", "ACCEPT")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, hcDropManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	px.waitLog(0, `"Serving health check node port"`, 1, 30*time.Second)

	expectReply(t, w.outside, "tcp", nodeOutSide+":30061", "be1:ping")
	// Each family's check is answered, from that family's endpoints: the
	// node has an IPv4 one and no IPv6 one.
	for url, want := range map[string]string{"http://" + nodeOutSide + ":30100/": "200", "http://[fd5e:b1b5:11::1]:30100/": "503"} {
		n := map[string]string{"200": "1", "503": "0"}[want]
		if code, body := curlCodeIn(t, w.outside, url); code != want || !strings.Contains(body, `"localEndpoints":`+n) {
			t.Errorf("health check %s from outside: %q %q; want %s with %s local endpoints", url, code, body, want, n)
		}
	}
	var accepts []string
	for _, r := range ourRules(t, w.node, "nft") {
		if strings.Contains(r, "health check node port") {
			accepts = append(accepts, r)
		}
	}
	want := []string{
		`ipt -A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment "e2e/lb health check node port" -m tcp --dport 30100 -j ACCEPT`,
		`ip6 -A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment "e2e/lb health check node port" -m tcp --dport 30100 -j ACCEPT`,
	}
	if !slices.Equal(accepts, want) {
		t.Errorf("health check rules as iptables-save prints them:\n%s\nwant\n%s", strings.Join(accepts, "\n"), strings.Join(want, "\n"))
	}
	if code, view := curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services"); code != "200" ||
		!strings.Contains(view, "  health check: node port 30100 (accepted in KUBE-NODEPORT-NON-LOCAL)\n") {
		t.Errorf("/debug/services (%s):\n%s", code, view)
	}
}
