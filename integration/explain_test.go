//go:build integration && linux

package integration

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// explainManifest renders a NodePort Service with a TCP and a UDP port,
// and one EndpointSlice per endpoint, each on 127.0.0.1 at its own port,
// with the given conditions and node hint (the endpoint's YAML body after
// its address).
func explainManifest(nodePort int, affinity string, tcp map[int]string, udp int) string {
	return explainManifestPolicy(nodePort, affinity, "Cluster", tcp, udp)
}

// explainManifestPolicy is explainManifest with an externalTrafficPolicy.
func explainManifestPolicy(nodePort int, affinity, external string, tcp map[int]string, udp int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata: {name: app, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 198.18.0.20
  sessionAffinity: %s
  externalTrafficPolicy: %s
  ports:
  - {name: http, protocol: TCP, port: 80, nodePort: %d}
  - {name: dns, protocol: UDP, port: 53, nodePort: %d}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: app-udp
  namespace: e2e
  labels: {kubernetes.io/service-name: app}
addressType: IPv4
ports: [{name: dns, protocol: UDP, port: %d}]
endpoints: [{addresses: ["127.0.0.1"]}]
`, affinity, external, nodePort, nodePort, udp)
	for port, rest := range tcp {
		fmt.Fprintf(&b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: app-tcp-%d
  namespace: e2e
  labels: {kubernetes.io/service-name: app}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: %d}]
endpoints: [{addresses: ["127.0.0.1"]%s}]
`, port, port, rest)
	}
	return b.String()
}

// TestBinaryExplainsEndpointChoice: at -v=4 the proxy says, for every new
// connection and UDP session, which endpoint it chose and why: round robin
// and over how many, failover past an endpoint that refused, ClientIP
// affinity when it first binds a client and when it keeps it, a
// terminating endpoint taken because no ready one is left, and topology
// hints. DESIGN.md promises a proxy whose every decision can be seen,
// "which backend was chosen and why"; until now the log named the
// endpoint alone.
func TestBinaryExplainsEndpointChoice(t *testing.T) {
	requireTool(t, "curl")
	requireTool(t, "nc")
	for _, build := range bothBuilds(t) {
		t.Run(build.name, func(t *testing.T) {
			a, b, ua := httpBackend(t, "a"), httpBackend(t, "b"), udpBackend(t, "ua")
			dead := freePort(t) // nothing listens: a dial is refused
			np := freePort(t)
			file := filepath.Join(t.TempDir(), "services.yaml")
			ready := map[int]string{a: "", b: "", dead: ""}
			writeFile(t, file, explainManifest(np, "None", ready, ua))
			metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			p := startCommand(t, build.bin, append(proxyArgs(file), "-v=4", "--hostname-override=node-a", "--metrics-bind-address="+metrics)...)
			p.waitLog(0, `"Serving".*via="node-port"`, 2, 20*time.Second)
			url := fmt.Sprintf("http://127.0.0.1:%d/", np)
			const chose = `"Chose endpoint" service="e2e/app:http/TCP" client="127\.0\.0\.1:\d+" `

			// Round robin over three, one of them dead: every request is
			// answered, and the dead endpoint's refusal shows as a second
			// attempt.
			from := p.lineCount()
			for range 6 {
				if body, err := curl(t, url); err != nil || body != "a" && body != "b" {
					t.Fatalf("request through the node port: %q, %v", body, err)
				}
			}
			p.waitLog(from, chose+`endpoint="127\.0\.0\.1:\d+" from="the Service's endpoints" why="round robin: next in turn of 3`, 6, 5*time.Second)
			p.waitLog(from, chose+fmt.Sprintf(`endpoint="127\.0\.0\.1:(%d|%d)" .*why="round robin: next in turn of 3.*; attempt 2: the 1 before failed to connect or ran out of time \(those still connecting race this one\)"`, a, b), 1, 5*time.Second)

			// UDP sessions are explained too.
			if reply, err := ncUDP(t, "127.0.0.1", np, "q"); err != nil || reply != "ua:q" {
				t.Fatalf("datagram through the node port: %q, %v", reply, err)
			}
			p.waitLog(from, fmt.Sprintf(`"Chose endpoint" service="e2e/app:dns/UDP" client="127\.0\.0\.1:\d+" endpoint="127\.0\.0\.1:%d" from="the Service's endpoints" why="round robin: next in turn of 1"`, ua), 1, 5*time.Second)

			// ClientIP affinity: the first connection binds the client,
			// the next ones are kept on its endpoint.
			delete(ready, dead)
			from = p.lineCount()
			replaceFile(t, file, explainManifest(np, "ClientIP", ready, ua))
			waitAffinity(t, p, from, url)

			// No ready endpoint: the terminating one that still serves.
			from = p.lineCount()
			replaceFile(t, file, explainManifest(np, "None", map[int]string{a: `, conditions: {ready: false, serving: true, terminating: true}`}, ua))
			waitExplained(t, p, from, url, "a", chose+fmt.Sprintf(`endpoint="127\.0\.0\.1:%d" .*why="round robin: next in turn of 1; it is terminating but still serving, and no ready endpoint is left`, a))

			// Topology hints for this node narrow the choice to its own.
			from = p.lineCount()
			replaceFile(t, file, explainManifest(np, "None", map[int]string{
				a: `, hints: {forNodes: [{name: node-b}]}`,
				b: `, hints: {forNodes: [{name: node-a}]}`,
			}, ua))
			waitExplained(t, p, from, url, "b", chose+fmt.Sprintf(`endpoint="127\.0\.0\.1:%d" .*why="round robin: next in turn of 1; topology hints: only endpoints hinted for node node-a are used here"`, b))
			view, err := curl(t, "http://"+metrics+"/debug/services")
			if want := fmt.Sprintf("127.0.0.1:%d (hinted for node node-a: topology hints keep this node's traffic to those)", b); err != nil || !strings.Contains(view, want) {
				t.Fatalf("/debug/services does not show %q (%v):\n%s", want, err, view)
			}

			// externalTrafficPolicy: Local leaves this node's own traffic
			// to the node port free to go to every endpoint.
			from = p.lineCount()
			replaceFile(t, file, explainManifestPolicy(np, "None", "Local", map[int]string{
				a: `, nodeName: node-b, hints: {forNodes: [{name: node-a}]}`,
			}, ua))
			waitExplained(t, p, from, url, "a", chose+fmt.Sprintf(`endpoint="127\.0\.0\.1:%d" from="the Service's endpoints: externalTrafficPolicy: Local does not apply to traffic from this node or its pods" why="round robin: next in turn of 1`, a))
		})
	}
}

// waitAffinity requests url until a connection binds the client under
// ClientIP affinity, then checks the next connections keep it there and
// say so.
func waitAffinity(t *testing.T, p *proxyProc, from int, url string) {
	t.Helper()
	bound := regexp.MustCompile(`"Chose endpoint" service="e2e/app:http/TCP" .*endpoint="127\.0\.0\.1:(\d+)" .*why="round robin: next in turn of 2; ClientIP session affinity sends this client here from now on, while it comes back within 3h0m0s"`)
	deadline := time.Now().Add(10 * time.Second)
	var first string
	for first == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no connection was bound by ClientIP affinity:\n%s", p.log())
		}
		body, err := curl(t, url)
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		lines := strings.Split(p.log(), "\n")[from:]
		for _, l := range lines {
			if m := bound.FindStringSubmatch(l); m != nil {
				first = body
				break
			}
		}
	}
	after := p.lineCount()
	for range 3 {
		if body, err := curl(t, url); err != nil || body != first {
			t.Fatalf("a client bound to %q by affinity got %q, %v", first, body, err)
		}
	}
	p.waitLog(after, `"Chose endpoint" service="e2e/app:http/TCP" .*why="ClientIP session affinity: the endpoint this client was sent to before, kept while it comes back within 3h0m0s"`, 3, 5*time.Second)
}

// waitExplained requests url until the new manifest is in force (want
// answers and a choice is explained as re says).
func waitExplained(t *testing.T, p *proxyProc, from int, url, want, re string) {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(10 * time.Second)
	for {
		body, err := curl(t, url)
		if err == nil && body == want && rx.MatchString(strings.Join(strings.Split(p.log(), "\n")[from:], "\n")) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer from %q explained as %q (last answer %q, %v):\n%s", want, re, body, err, p.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
