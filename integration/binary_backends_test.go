//go:build integration && linux

package integration

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBinaryIPTablesOtherBackendLeftovers: a proxy that ran with the nft
// backend is killed, another tool adds legacy rules, and the restarted
// proxy chooses legacy. The kernel runs the rules of both backends, so the
// first run's chains in nft would keep redirecting to proxy ports nobody
// serves: the restarted proxy removes them, says how many, and a frontend
// removed afterwards is no longer caught. --cleanup then removes our
// chains from both backends.
func TestBinaryIPTablesOtherBackendLeftovers(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	first := startNodeProxy(t, w, file, "--portal=iptables")
	first.waitLog(0, `"Using iptables portal" backend="nft"`, 1, 30*time.Second)
	first.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	expectReply(t, w.pod, "tcp", "198.19.0.5:80", "be1:ping")
	if len(ourRules(t, w.node, "nft")) == 0 {
		t.Fatal("the first run wrote no rules into nft")
	}
	first.cmd.Process.Kill()
	<-first.done

	// Another tool's legacy rules, more than ours in nft, so the restart
	// chooses legacy (one iptables-legacy-restore rather than 60 runs).
	var legacy strings.Builder
	legacy.WriteString("*filter\n")
	for i := range 60 {
		fmt.Fprintf(&legacy, "-A INPUT -s 198.18.250.%d/32 -j ACCEPT\n", i+1)
	}
	legacy.WriteString("COMMIT\n")
	cmd := exec.Command("ip", "netns", "exec", string(w.node), "iptables-legacy-restore", "--noflush")
	cmd.Stdin = strings.NewReader(legacy.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables-legacy-restore: %v\n%s", err, out)
	}

	second := startNodeProxy(t, w, file, "--portal=iptables")
	second.waitLog(0, `"Using iptables portal" backend="legacy"`, 1, 30*time.Second)
	second.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	if left := ourRules(t, w.node, "nft"); len(left) > 0 {
		t.Errorf("our chains are left in nft after the restart's first sync:\n%s", strings.Join(left, "\n"))
	}
	if !strings.Contains(second.log(), `"Removed the portal's chains from the other iptables backend" command="iptables-nft"`) {
		t.Errorf("the restart does not say what it removed from nft")
	}
	for _, l := range strings.Split(second.log(), "\n") {
		if strings.Contains(l, "other iptables backend") {
			t.Logf("restart: %s", l[strings.Index(l, "] ")+2:])
		}
	}
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	expectReply(t, w.pod, "tcp", "198.19.0.5:80", "be1:ping")

	// The external IP goes: nothing may catch it any more (a stale nft
	// REDIRECT sent it to the first run's proxy port: "connection refused").
	from := second.lineCount()
	writeFile(t, file, strings.Replace(netnsManifest, "  externalIPs: [198.19.0.5]\n", "", 1))
	second.waitLog(from, `"Portals synced"`, 1, 10*time.Second)
	if r := dial(t, w.pod, "tcp", "198.19.0.5:80", "ping", 0); r.Err == "" || strings.Contains(r.Err, "connection refused") {
		t.Errorf("the removed external IP is still caught: reply %q, err %q", r.Reply, r.Err)
	} else {
		t.Logf("the removed external IP, no longer caught: %s", r.Err)
	}
	expectReply(t, w.pod, "tcp", "198.18.0.10:80", "be1:ping")
	expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")

	// --cleanup removes our chains from whichever backend holds them.
	second.cmd.Process.Kill()
	<-second.done
	cmd = exec.Command("ip", "netns", "exec", string(w.node), "iptables-nft-restore", "--noflush")
	cmd.Stdin = strings.NewReader("*nat\n:KUBE-PORTALS-CONTAINER - [0:0]\n-I PREROUTING -j KUBE-PORTALS-CONTAINER\nCOMMIT\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables-nft-restore: %v\n%s", err, out)
	}
	if len(ourRules(t, w.node, "legacy")) == 0 {
		t.Fatal("no chains of ours in legacy before --cleanup")
	}
	out, err := exec.Command("ip", "netns", "exec", string(w.node), proxyBin, "--cleanup").CombinedOutput()
	if err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, out)
	}
	for _, backend := range []string{"nft", "legacy"} {
		if left := ourRules(t, w.node, backend); len(left) > 0 {
			t.Errorf("left in %s after --cleanup:\n%s", backend, strings.Join(left, "\n"))
		}
	}
}
