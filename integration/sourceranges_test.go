//go:build integration && linux

package integration

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// sourceRangesManifest is a LoadBalancer Service whose
// loadBalancerSourceRanges admit the outside host's subnet only.
const sourceRangesManifest = `apiVersion: v1
kind: Service
metadata: {name: lb, namespace: e2e}
spec:
  type: LoadBalancer
  clusterIP: 198.18.0.20
  loadBalancerSourceRanges: [RANGES]
  ports:
  - {name: http, protocol: TCP, port: 80, nodePort: 30090}
  - {name: dns, protocol: UDP, port: 53, nodePort: 30091}
status:
  loadBalancer:
    ingress: [{ip: 198.19.2.1}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: e2e, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}, {name: dns, protocol: UDP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"]}]
`

func sourceRanges(ranges string) string {
	return strings.Replace(sourceRangesManifest, "RANGES", ranges, 1)
}

// TestBinaryLoadBalancerSourceRanges: the real binary, with the iptables
// and the bind portal, lets only the sources of loadBalancerSourceRanges
// reach the load-balancer IP, over TCP and UDP; the same Service's cluster
// IP and node ports admit everyone; and an edit of the ranges applies.
// Other sources are dropped as kube-proxy drops them: with iptables by the
// firewall chain (the test reads the drop rule's counter), with bind,
// which has no netfilter, by the socket filter of the load-balancer IP's
// sockets.
func TestBinaryLoadBalancerSourceRanges(t *testing.T) {
	for _, mode := range []string{"iptables", "bind"} {
		t.Run(mode, func(t *testing.T) {
			w, px, file := serveManifest(t, mode, sourceRanges("198.18.11.0/24"), `198\.19\.2\.1:53`, "8080=be1")
			// A node routes (its pods' traffic): a packet to the
			// load-balancer IP that is not redirected is forwarded, and
			// meets the firewall chain there.
			w.node.mustRun(t, "sysctl", "-qw", "net.ipv4.ip_forward=1")

			expectReply(t, w.outside, "tcp", "198.19.2.1:80", "be1:ping")
			expectReply(t, w.outside, "udp", "198.19.2.1:53", "be1:ping")
			// The teaching view (metrics server, default address) says so.
			if code, view := curlCodeIn(t, w.node, "http://127.0.0.1:10249/debug/services"); code != "200" ||
				// the node's 198.18.11.1 is in the range: the VIP is admitted as a source too
				!strings.Contains(view, "  sources:      198.19.2.1 admits only 198.18.11.0/24, 198.19.2.1/32\n") ||
				mode == "iptables" && !regexp.MustCompile(`198\.19\.2\.1:80/TCP -> :\d+ from 198\.18\.11\.0/24`).MatchString(view) {
				t.Errorf("/debug/services: %s\n%s", code, view)
			}
			// The node's own traffic leaves from 198.18.11.1, in the range.
			expectReply(t, w.node, "tcp", "198.19.2.1:80", "be1:ping")

			dropsBefore := firewallDrops(t, w, mode)
			// Dropped, as kube-proxy drops it: no handshake, no reset
			// (iptables: the firewall chain; bind: the socket's filter).
			if r := dial(t, w.pod, "tcp", "198.19.2.1:80", "ping", 0); !strings.Contains(r.Err, "i/o timeout") {
				t.Errorf("TCP to the load-balancer IP from outside its ranges: %+v; want the connect to time out", r)
			}
			expectNoReply(t, w.pod, "udp", "198.19.2.1:53")
			// Nor at the node port on the load-balancer IP (the bind portal
			// makes it a local address; node ports are not served there).
			expectNoReply(t, w.pod, "tcp", "198.19.2.1:30090")
			if mode == "iptables" {
				if got := firewallDrops(t, w, mode); got <= dropsBefore {
					t.Errorf("the firewall chain dropped %d packets, then %d: the pod's traffic did not meet it", dropsBefore, got)
				}
			}
			if mode == "iptables" {
				// Nor straight at the proxy ports the portals redirect
				// to, from the pod or the node itself.
				for _, svc := range []string{"http/TCP", "dns/UDP"} {
					m := regexp.MustCompile(`"Serving" service="e2e/lb:` + svc + `" addr="0\.0\.0\.0:(\d+)" via="proxy-port"`).FindStringSubmatch(px.log())
					if m == nil {
						t.Fatalf("no proxy port for e2e/lb:%s in the log", svc)
					}
					proto := strings.ToLower(svc[len(svc)-3:])
					expectNoReply(t, w.pod, proto, nodePodSide+":"+m[1])
					expectNoReply(t, w.node, proto, "127.0.0.1:"+m[1])
				}
			}
			// Only the load-balancer IP is restricted.
			expectReply(t, w.pod, "tcp", "198.18.0.20:80", "be1:ping")
			expectReply(t, w.pod, "udp", "198.18.0.20:53", "be1:ping")
			expectReply(t, w.pod, "tcp", nodePodSide+":30090", "be1:ping")
			expectReply(t, w.pod, "udp", nodePodSide+":30091", "be1:ping")

			writeFile(t, file, sourceRanges("198.18.11.0/24, 198.18.10.0/24"))
			eventually(t, w.pod, "tcp", "198.19.2.1:80", "be1:ping")
			eventually(t, w.pod, "udp", "198.19.2.1:53", "be1:ping")

			writeFile(t, file, sourceRanges("198.18.11.0/24"))
			eventuallyNot(t, w.pod, "tcp", "198.19.2.1:80")
			expectReply(t, w.outside, "tcp", "198.19.2.1:80", "be1:ping")
		})
	}
}

var dropCounter = regexp.MustCompile(`^\[(\d+):\d+\] -A KUBE-PORTALS-FIREWALL .* -j DROP`)

// firewallDrops sums the packet counters of the node's firewall rules (0
// when there are none, as with the bind portal).
func firewallDrops(t *testing.T, w *world, mode string) int {
	t.Helper()
	if mode != "iptables" {
		return 0
	}
	n := 0
	for _, line := range strings.Split(w.node.mustRun(t, "iptables-save", "-c", "-t", "filter"), "\n") {
		if m := dropCounter.FindStringSubmatch(line); m != nil {
			c, _ := strconv.Atoi(m[1])
			n += c
		}
	}
	return n
}
