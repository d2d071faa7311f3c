//go:build integration && linux

package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hcFamilyManifest is a dual-stack LoadBalancer Service with
// externalTrafficPolicy: Local and health-check node port 30110, whose
// IPv4 endpoint runs on node v4On and IPv6 endpoint on node v6On.
func hcFamilyManifest(v4On, v6On string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lb, namespace: e2e}
spec:
  type: LoadBalancer
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 198.18.0.70
  clusterIPs: [198.18.0.70, "fd5e:b1b5::70"]
  externalTrafficPolicy: Local
  healthCheckNodePort: 30110
  ports: [{name: http, protocol: TCP, port: 80, nodePort: 30071}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-4, namespace: e2e, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: %s}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-6, namespace: e2e, labels: {kubernetes.io/service-name: lb}}
addressType: IPv6
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["fd5e:b1b5:12::2"], nodeName: %s}]
`, v4On, v6On)
}

// curlHeadersIn fetches url with curl from ns and returns the response's
// status line and headers as curl prints them ("" if nothing answered).
func curlHeadersIn(t *testing.T, ns netns, url string) string {
	t.Helper()
	out, _ := ns.run(requireTool(t, "curl"), "-s", "--max-time", "2", "-D", "-", "-o", "/dev/null", url)
	return strings.ReplaceAll(out, "\r", "")
}

// TestBinaryHealthCheckNodePortPerFamily: a load balancer checking a
// dual-stack externalTrafficPolicy: Local Service's health-check node port
// over IPv6 learns about the node's IPv6 endpoints, over IPv4 about its
// IPv4 ones, as it does from kube-proxy, which serves each family from
// that family's proxier (kubernetes#137370): with only the IPv4 endpoint on
// this node, an IPv6 check answers 503 and localEndpoints 0, since IPv6
// traffic sent to the node would be dropped. It answered 200 with the
// count of both families, so the load balancer sent IPv6 traffic to a node
// that dropped it. Both on the wildcard (one dual-stack socket) and on the
// node's addresses of each family (--nodeport-addresses).
func TestBinaryHealthCheckNodePortPerFamily(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"wildcard", nil},
		{"nodeport-addresses", []string{"--nodeport-addresses=198.18.11.0/24,fd5e:b1b5:11::/64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			startBackend(t, w.backend, "8080=be1")
			file := filepath.Join(t.TempDir(), "services.yaml")
			writeFile(t, file, hcFamilyManifest("node", "other"))
			px := startNodeProxy(t, w, file, append([]string{"--portal=iptables"}, tc.args...)...)
			px.waitLog(0, `"Serving health check node port"`, 1, 30*time.Second)

			run := func(url string) (string, string) { return curlCodeIn(t, w.outside, url) }
			v4, v6 := "http://"+nodeOutSide+":30110/", "http://[fd5e:b1b5:11::1]:30110/"
			body := func(n int) string {
				return fmt.Sprintf(`{"service":{"namespace":"e2e","name":"lb"},"localEndpoints":%d,"serviceProxyHealthy":true}`, n)
			}
			healthzAnswers(t, run, v4, "200", body(1))
			healthzAnswers(t, run, v6, "503", body(0))
			// kube-proxy's headers, the weight by the check's family.
			for url, want := range map[string][]string{
				v4: {"HTTP/1.1 200 OK\n", "\nContent-Type: application/json\n", "\nX-Content-Type-Options: nosniff\n", "\nX-Load-Balancing-Endpoint-Weight: 1\n"},
				v6: {"HTTP/1.1 503 Service Unavailable\n", "\nContent-Type: application/json\n", "\nX-Content-Type-Options: nosniff\n", "\nX-Load-Balancing-Endpoint-Weight: 0\n"},
			} {
				got := curlHeadersIn(t, w.outside, url)
				for _, h := range want {
					if !strings.Contains(got, h) {
						t.Errorf("%s: headers\n%s\nwant %q", url, got, h)
					}
				}
			}
			// A check the node makes of itself over IPv4 on loopback
			// too (the wildcard takes it IPv4-mapped).
			if tc.args == nil {
				healthzAnswers(t, func(url string) (string, string) { return curlCodeIn(t, w.node, url) }, "http://127.0.0.1:30110/", "200", body(1))
				healthzAnswers(t, func(url string) (string, string) { return curlCodeIn(t, w.node, url) }, "http://[::1]:30110/", "503", body(0))
			}

			// The IPv6 endpoint moves here, the IPv4 one away: the answers
			// follow, each in its family.
			replaceFile(t, file, hcFamilyManifest("other", "node"))
			healthzAnswers(t, run, v6, "200", body(1))
			healthzAnswers(t, run, v4, "503", body(0))
		})
	}
}

// TestBinaryBindPortalHealthCheckNotOnServiceAddresses: under the bind
// portal, a health-check node port is a node port: it answers on the
// node's addresses, and not on the service addresses the portal put on the
// node (a ClusterIP, or a load-balancer IP, where it would get round
// loadBalancerSourceRanges), which refuse it as they refuse node ports.
func TestBinaryBindPortalHealthCheckNotOnServiceAddresses(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, hcFamilyManifest("node", "node"))
	px := startNodeProxy(t, w, file, "--portal=bind")
	px.waitLog(0, `"Serving health check node port"`, 1, 30*time.Second)
	px.waitLog(0, `"Serving".*198.18.0.70:80`, 1, 30*time.Second)
	run := func(url string) (string, string) { return curlCodeIn(t, w.pod, url) }
	healthzAnswers(t, run, "http://"+nodePodSide+":30110/", "200", `"localEndpoints":1`)
	// The node port itself is refused on the service address: the
	// health-check port must be too.
	expectNoReply(t, w.pod, "tcp", "198.18.0.70:30071")
	if code, body := curlCodeIn(t, w.pod, "http://198.18.0.70:30110/"); code != "000" {
		t.Errorf("the health-check node port answered on the ClusterIP: %s %q", code, body)
	}
	if code, body := curlCodeIn(t, w.pod, "http://[fd5e:b1b5::70]:30110/"); code != "000" {
		t.Errorf("the health-check node port answered on the IPv6 ClusterIP: %s %q", code, body)
	}
}
