//go:build integration

package integration

import (
	"path/filepath"
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
