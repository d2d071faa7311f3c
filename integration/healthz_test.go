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

// TestBinaryHealthzWhenPortalsFail: when the proxy cannot program its
// portal (here the bind portal's --bind-interface does not exist yet),
// /healthz and /livez answer 503 once a change has waited twice
// --iptables-sync-period, and a health-check node port says
// serviceProxyHealthy false with a 503, so load balancers go to other
// nodes; all answer 200 again once the portal can be programmed. Run in a
// network namespace with the default --healthz-bind-address.
func TestBinaryHealthzWhenPortalsFail(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t, "node")
	startBackend(t, ns, "8080=be1")
	const hc, np = 30100, 30101
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, healthzManifest(hc, np, np+1, 8080))
	px := startCommand(t, "ip", "netns", "exec", string(ns), proxyBin, "--manifests", file, "--portal=bind",
		"--bind-interface=kup-late", "--hostname-override=node", "--iptables-sync-period=1s", "-v=2")
	px.waitLog(0, `"Serving /healthz and /livez" addr="0.0.0.0:10256"`, 1, 20*time.Second)
	px.waitLog(0, `"Sync failed; will retry.*interface kup-late`, 1, 20*time.Second)

	run := func(url string) (string, string) { return curlCodeIn(t, ns, url) }
	healthz, livez := "http://127.0.0.1:10256/healthz", "http://127.0.0.1:10256/livez"
	hcURL := fmt.Sprintf("http://127.0.0.1:%d/", hc)
	healthzAnswers(t, run, healthz, "503", `"healthy":false`)
	healthzAnswers(t, run, livez, "503", `"reason":"a change has waited more than 2s to be applied`)
	healthzAnswers(t, run, hcURL, "503", `"localEndpoints":1,"serviceProxyHealthy":false`)
	// The metrics server (default address) counts the failures, by cause.
	if code, body := curlCodeIn(t, ns, "http://127.0.0.1:10249/metrics"); code != "200" ||
		!regexp.MustCompile(`\nkube_userspace_proxy_sync_failures_total\{cause="portal"\} [1-9]`).MatchString(body) ||
		!strings.Contains(body, "\n"+`kube_userspace_proxy_sync_failures_total{cause="services"} 0`+"\n") {
		t.Errorf("/metrics: %s, sync failures: %q", code, regexp.MustCompile(`(?m)^kube_userspace_proxy_sync_failures.*$`).FindAllString(body, -1))
	}

	// A veth pair: this kernel has no dummy driver.
	ns.mustRun(t, "ip", "link", "add", "kup-late", "type", "veth", "peer", "name", "kup-late-peer")
	ns.mustRun(t, "ip", "link", "set", "kup-late", "up")
	ns.mustRun(t, "ip", "link", "set", "kup-late-peer", "up")
	px.waitLog(0, `"Sync recovered"`, 1, 10*time.Second)
	healthzAnswers(t, run, healthz, "200", `"nodeEligible":true,"healthy":true`)
	healthzAnswers(t, run, healthz, "200", `"healthy":true},"IPv6":{"lastUpdated":"`) // kube-proxy's status per family
	healthzAnswers(t, run, livez, "200", `"healthy":true`)
	healthzAnswers(t, run, hcURL, "200", `"localEndpoints":1,"serviceProxyHealthy":true`)
	expectReply(t, ns, "tcp", "198.18.0.30:80", "be1:ping")

	// The interface goes, and the service addresses with it: the portal
	// fails at each resync until it is back, then puts them back. (No
	// change waits meanwhile, so the proxy stays healthy, as kube-proxy
	// does when a resync fails.)
	from := px.lineCount()
	ns.mustRun(t, "ip", "link", "del", "kup-late")
	px.waitLog(from, `"The bind portal's interface is gone; looking for it again" interface="kup-late"`, 1, 10*time.Second)
	ns.mustRun(t, "ip", "link", "add", "kup-late", "type", "veth", "peer", "name", "kup-late-peer")
	ns.mustRun(t, "ip", "link", "set", "kup-late", "up")
	ns.mustRun(t, "ip", "link", "set", "kup-late-peer", "up")
	px.waitLog(from, `"Sync recovered"`, 1, 10*time.Second)
	expectReply(t, ns, "tcp", "198.18.0.30:80", "be1:ping")
}

// TestBinaryHealthzBeforeTheSourceDelivers: a proxy whose API server does
// not answer (down while the proxy restarted) has nothing to serve, and
// with the iptables portal its old rules send clients to proxy ports
// nothing listens on: once twice --iptables-sync-period has passed with
// nothing applied, /healthz answers 503 so load balancers go elsewhere,
// while /livez stays 200, as a restart would not help.
func TestBinaryHealthzBeforeTheSourceDelivers(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t, "node")
	// Nothing listens on port 1 in the new namespace.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	writeFile(t, kubeconfig, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`)
	px := startCommand(t, "ip", "netns", "exec", string(ns), proxyBin, "--kubeconfig", kubeconfig, "--portal=none",
		"--hostname-override=node", "--iptables-sync-period=1s", "-v=2")
	px.waitLog(0, `"Serving /healthz and /livez" addr="0.0.0.0:10256"`, 1, 20*time.Second)
	run := func(url string) (string, string) { return curlCodeIn(t, ns, url) }
	healthzAnswers(t, run, "http://127.0.0.1:10256/healthz", "503", `"reason":"nothing applied yet: the source has not delivered Services and EndpointSlices`)
	healthzAnswers(t, run, "http://127.0.0.1:10256/livez", "200", `"healthy":true`)
}
