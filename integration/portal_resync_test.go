//go:build integration && linux

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// resyncManifest adds to netnsManifest every other kind of rule the
// portal writes, in both families: a Service without endpoints (REJECT,
// which iptables-save prints with its default reply), and a dual-stack
// load balancer with source ranges (the firewall chain), a Local policy
// whose endpoint is on another node (DROP, and ACCEPT from this host and
// the pods of --cluster-cidr) and a health-check node port.
const resyncManifest = netnsManifest + `---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: e2e}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 198.18.0.60
  clusterIPs: [198.18.0.60, "fd5e:b1b5::60"]
  ports: [{name: http, protocol: TCP, port: 80}, {name: dns, protocol: UDP, port: 53}]
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: e2e}
spec:
  type: LoadBalancer
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 198.18.0.70
  clusterIPs: [198.18.0.70, "fd5e:b1b5::70"]
  externalTrafficPolicy: Local
  healthCheckNodePort: 30071
  loadBalancerSourceRanges: [198.18.11.0/24, "fd5e:b1b5:11::/64"]
  ports: [{name: http, protocol: TCP, port: 80, nodePort: 30070}]
status:
  loadBalancer:
    ingress: [{ip: 198.19.7.1}, {ip: "fd5e:b1b5:7::1"}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: e2e, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["198.18.12.2"], nodeName: elsewhere}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-2, namespace: e2e, labels: {kubernetes.io/service-name: local}}
addressType: IPv6
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["fd5e:b1b5:12::2"], nodeName: elsewhere}]
`

// restoreCounter puts wrappers of the iptables-restore commands in a
// directory for the front of the proxy's PATH, which note each run in a
// file before they run the real one. It returns the directory and a
// function that counts the runs so far.
func restoreCounter(t *testing.T) (dir string, runs func() int) {
	t.Helper()
	dir, count := iptablesCounter(t)
	return dir, func() int {
		t.Helper()
		return count("-restore")
	}
}

// iptablesCounter is restoreCounter for the iptables-restore and
// iptables-save commands: runs counts those whose name ends with kind
// ("-restore", "-save").
func iptablesCounter(t *testing.T) (dir string, runs func(kind string) int) {
	t.Helper()
	dir = t.TempDir()
	log := filepath.Join(dir, "runs")
	writeFile(t, log, "")
	for _, base := range []string{"iptables", "ip6tables", "iptables-nft", "ip6tables-nft", "iptables-legacy", "ip6tables-legacy"} {
		for _, name := range []string{base + "-restore", base + "-save"} {
			real, err := exec.LookPath(name)
			if err != nil {
				continue
			}
			script := fmt.Sprintf("#!/bin/sh\necho %s >>%s\nexec %s \"$@\"\n", name, log, real)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir, func(kind string) int {
		t.Helper()
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasSuffix(l, kind) {
				n++
			}
		}
		return n
	}
}

// resynced is the line a resync ends with, whether it wrote the rules
// ("Portals synced") or found them in place.
const resynced = `"Portals in place; nothing written"|"Portals synced"`

// TestBinaryIPTablesResyncWritesNothingUnchanged: a periodic resync that
// reads back exactly what the proxy writes, in both families and tables,
// runs no iptables-restore (it restored every table of every family at
// each --iptables-sync-period, replacing thousands of rules, and with nft
// the whole ruleset, for nothing). A rule or a jump deleted by hand, or a
// chain flushed, is written back at the next resync, as before. Both
// backends: the rules are compared as each one's iptables-save prints
// them.
func TestBinaryIPTablesResyncWritesNothingUnchanged(t *testing.T) {
	t.Parallel() // it mostly waits for resyncs (see doc.go)
	for _, backend := range []string{"nft", "legacy"} {
		t.Run(backend, func(t *testing.T) { testResyncWritesNothingUnchanged(t, backend) })
	}
}

func testResyncWritesNothingUnchanged(t *testing.T, backend string) {
	w := newWorld(t)
	if backend == "legacy" {
		// The host's rules are there: the portal writes there too.
		w.node.mustRun(t, "iptables-legacy", "-A", "INPUT", "-s", "198.18.250.0/24", "-j", "ACCEPT")
		w.node.mustRun(t, "iptables-legacy", "-A", "INPUT", "-s", "198.18.251.0/24", "-j", "ACCEPT")
	}
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, resyncManifest)
	wrappers, runs := iptablesCounter(t)
	restores := func() int { t.Helper(); return runs("-restore") }
	px := startCommand(t, "ip", "netns", "exec", string(w.node), "env", "PATH="+wrappers+":"+os.Getenv("PATH"),
		proxyBin, "--manifests", file, "--hostname-override=node", "-v=2", "--portal=iptables", "--iptables-sync-period=2s",
		"--cluster-cidr=198.18.10.0/24,fd5e:b1b5:10::/64")
	px.waitLog(0, `"Using iptables portal" backend="`+backend+`"`, 1, 30*time.Second)
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	written := restores()
	if written != 4 {
		t.Errorf("the first sync ran iptables-restore %d times, want 4 (two tables, two families)", written)
	}
	rules := ourRules(t, w.node, backend)
	for _, want := range []string{"-j REJECT --reject-with icmp-port-unreachable", "-j REJECT --reject-with icmp6-port-unreachable",
		"-A KUBE-PORTALS-FIREWALL -d fd5e:b1b5:7::1/128", "-s fd5e:b1b5:10::/64", "health check node port", "-m addrtype --src-type LOCAL"} {
		if !slices.ContainsFunc(rules, func(r string) bool { return strings.Contains(r, want) }) {
			t.Errorf("no rule with %q to compare:\n%s", want, strings.Join(rules, "\n"))
		}
	}

	// Two resyncs with nothing changed: read back, nothing written. Each
	// reads every table of a family with one iptables-save (it ran one
	// per table) and runs nothing else: the other backend is looked at
	// without a process when it has no tables of ours.
	i := px.waitLog(px.lineCount(), resynced, 1, 20*time.Second)
	saves := runs("-save")
	px.waitLog(i, `"Portals in place; nothing written"`, 1, 20*time.Second)
	if n := runs("-save") - saves; n != 2 {
		t.Errorf("an unchanged resync ran iptables-save %d times, want 2 (one per family)", n)
	}
	if n := restores(); n != written {
		t.Errorf("unchanged resyncs ran iptables-restore %d times, want none", n-written)
	}
	if after := ourRules(t, w.node, backend); !slices.Equal(after, rules) {
		t.Errorf("rules changed:\n%s\nbefore:\n%s", strings.Join(after, "\n"), strings.Join(rules, "\n"))
	}
	checkServed(t, w, true)

	// Each change by hand is written back at the next resync, and the
	// one after that writes nothing again.
	for _, tc := range []struct {
		name   string
		change []string
		says   string // a line the proxy logs about it
	}{
		{"a portal rule deleted", []string{"iptables-" + backend, "-t", "nat", "-D", "KUBE-PORTALS-CONTAINER", "2"},
			`"The portal's rules were rewritten by something else since the last sync`},
		{"a jump deleted", []string{"ip6tables-" + backend, "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment",
			"kube-userspace-proxy service portals; keep before the node port jump", "-j", "KUBE-PORTALS-CONTAINER"},
			`"Jumps into the portal's chains were missing from the built-in chains.*family="IPv6" restored=\["nat PREROUTING -j KUBE-PORTALS-CONTAINER"\]`},
		{"a filter chain flushed", []string{"ip6tables-" + backend, "-F", "KUBE-NODEPORT-NON-LOCAL"},
			`"The portal's rules are not as this proxy writes them; writing them again".*family="IPv6" table="filter" difference="KUBE-NODEPORT-NON-LOCAL rule 1 missing`},
		{"a filter rule replaced", []string{"iptables-" + backend, "-R", "KUBE-NODEPORT-NON-LOCAL", "1", "-j", "ACCEPT"},
			`"The portal's rules are not as this proxy writes them; writing them again".*family="IPv4" table="filter" difference="KUBE-NODEPORT-NON-LOCAL rule 1 is`},
	} {
		// Not subtests: px fails the test that started it.
		before := restores()
		from := px.lineCount()
		w.node.mustRun(t, tc.change...)
		if after := ourRules(t, w.node, backend); slices.Equal(after, rules) {
			t.Fatalf("%s: the change did not take", tc.name)
		}
		i := px.waitLog(from, tc.says, 1, 10*time.Second)
		px.waitLog(i, `"Portals synced"`, 1, 5*time.Second)
		if n := restores() - before; n != 4 {
			t.Errorf("%s: the resync after the change ran iptables-restore %d times, want 4", tc.name, n)
		}
		if after := ourRules(t, w.node, backend); !slices.Equal(after, rules) {
			t.Errorf("%s: rules after the resync:\n%s\nwant:\n%s", tc.name, strings.Join(after, "\n"), strings.Join(rules, "\n"))
		}
		written := restores()
		px.waitLog(px.lineCount(), resynced, 1, 10*time.Second)
		if n := restores(); n != written {
			t.Errorf("%s: the resync after that ran iptables-restore %d times, want none", tc.name, n-written)
		}
	}
	checkServed(t, w, true)
}
