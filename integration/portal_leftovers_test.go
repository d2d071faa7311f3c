//go:build integration

package integration

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Rules the iptables portal does not own, or cannot see, on a real node:
// the other backend's, when it cannot be read; and the built-in chains a
// firewall reload flushes, taking our jumps with them.

// noRawProxy returns the arguments of "ip" that run the real binary with
// args in the node namespace with CAP_NET_ADMIN (and
// CAP_NET_BIND_SERVICE) but without CAP_NET_RAW, as in a container
// runtime whose default drops it (CRI-O's): iptables-legacy cannot read
// its tables then, iptables-nft can.
func noRawProxy(w *world, args ...string) []string {
	return append([]string{"netns", "exec", string(w.node), "setpriv", "--bounding-set=-all,+net_admin,+net_bind_service", "--inh-caps=-all", proxyBin}, args...)
}

// logLines returns the proxy's log lines from index from on.
func logLines(px *proxyProc, from int) []string {
	return strings.Split(px.log(), "\n")[from:]
}

// TestBinaryIPTablesUnreadableBackend: a proxy that wrote its rules into
// iptables-legacy (the host's Kubernetes hint is there) leaves them when
// it stops. Without CAP_NET_RAW, iptables-legacy-save fails: a normal run
// says it cannot read that backend, whose rules stay in effect, and
// --cleanup fails naming the backend and why, rather than saying "Cleanup
// done" over rules that still redirect traffic. With the capability,
// --cleanup removes them.
func TestBinaryIPTablesUnreadableBackend(t *testing.T) {
	requireTool(t, "setpriv")
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	w.node.mustRun(t, "iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
	px := startNodeProxy(t, w, file, "--portal=iptables")
	px.waitLog(0, `"Using iptables portal" backend="legacy"`, 1, 30*time.Second)
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	px.cmd.Process.Kill()
	<-px.done
	legacy := ourRules(t, w.node, "legacy")
	if len(legacy) == 0 {
		t.Fatal("the first run wrote no rules into iptables-legacy")
	}
	// The legacy rules still redirect, to a proxy port nobody serves.
	if r := dial(t, w.pod, "tcp", "198.18.0.10:80", "ping", 0); !strings.Contains(r.Err, "connection refused") {
		t.Fatalf("the cluster IP with the legacy rules left: %+v, want refused at the old proxy port", r)
	}

	t.Run("a run without CAP_NET_RAW says it cannot read iptables-legacy", func(t *testing.T) {
		px := startCommand(t, "ip", noRawProxy(w, "--manifests", file, "--portal=iptables", "--hostname-override=node", "-v=2",
			"--healthz-bind-address=", "--metrics-bind-address=")...)
		px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
		px.waitLog(0, `"Cannot read the rules of the other iptables backend, .*stay in effect.* command="iptables-legacy-save" family="IPv4"`, 1, 5*time.Second)
		for _, l := range strings.Split(px.log(), "\n") {
			if strings.Contains(l, "other iptables backend") || strings.Contains(l, "Using iptables portal") {
				t.Logf("without CAP_NET_RAW: %s", l)
				if strings.Contains(l, "Cannot read") && !strings.HasPrefix(l, "E") {
					t.Errorf("not a warning: %s", l)
				}
			}
		}
		px.cmd.Process.Kill()
		<-px.done
	})

	t.Run("--cleanup without CAP_NET_RAW fails naming iptables-legacy", func(t *testing.T) {
		out, err := exec.Command("ip", noRawProxy(w, "--cleanup")...).CombinedOutput()
		t.Logf("--cleanup without CAP_NET_RAW: %v\n%s", err, out)
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("--cleanup exited %v, want a non-zero exit: the legacy rules are still there", err)
		}
		if strings.Contains(string(out), `"Cleanup done"`) {
			t.Error(`--cleanup says "Cleanup done"`)
		}
		for _, want := range []string{"cleanup (iptables-legacy): cannot read the legacy backend's rules", "CAP_NET_RAW", "Permission denied"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("--cleanup's output does not say %q", want)
			}
		}
		if left := ourRules(t, w.node, "legacy"); len(left) == 0 {
			t.Error("the legacy rules went, though they could not be read")
		}
	})

	out, err := exec.Command("ip", "netns", "exec", string(w.node), proxyBin, "--cleanup").CombinedOutput()
	if err != nil {
		t.Fatalf("--cleanup with every capability: %v\n%s", err, out)
	}
	for _, backend := range []string{"legacy", "nft"} {
		if left := ourRules(t, w.node, backend); len(left) > 0 {
			t.Errorf("left in %s after --cleanup:\n%s", backend, strings.Join(left, "\n"))
		}
	}
}

// TestBinaryIPTablesJumpsRestored: a firewall reload flushes the built-in
// nat chains, taking the jumps into ours: service traffic is not
// redirected until the next sync puts them back, which says which jumps
// were missing (the first sync, which adds them all, says nothing).
func TestBinaryIPTablesJumpsRestored(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables", "--iptables-sync-period=2s")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	const restored = `"Jumps into the portal's chains were missing from the built-in chains`
	if strings.Contains(px.log(), "were missing from the built-in chains") {
		t.Errorf("the first sync reports missing jumps:\n%s", px.log())
	}

	from := px.lineCount()
	w.node.mustRun(t, "iptables-nft", "-t", "nat", "-F", "PREROUTING")
	w.node.mustRun(t, "iptables-nft", "-t", "nat", "-F", "OUTPUT")
	i := px.waitLog(from, restored+`.* command="iptables-nft" family="IPv4" restored=\["nat PREROUTING -j KUBE-PORTALS-CONTAINER","nat OUTPUT -j KUBE-PORTALS-HOST","nat PREROUTING -j KUBE-NODEPORT-CONTAINER","nat OUTPUT -j KUBE-NODEPORT-HOST"\]`, 1, 10*time.Second)
	line := logLines(px, i-1)[0]
	t.Logf("after the flush: %s", line)
	if !strings.HasPrefix(line, "E") {
		t.Errorf("not a warning: %s", line)
	}
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")
	// The IPv6 jumps were not touched: nothing said for IPv6.
	for _, l := range logLines(px, from) {
		if strings.Contains(l, "were missing from the built-in chains") && strings.Contains(l, `command="ip6tables-nft"`) {
			t.Errorf("missing IPv6 jumps reported, though only IPv4's were flushed: %s", l)
		}
	}
}
