//go:build integration && linux

package integration

import (
	"encoding/binary"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Rules the iptables portal does not own, or cannot see, on a real node:
// the other backend's, when it cannot be read; kube-proxy's, left by a
// kube-proxy removed without `kube-proxy --cleanup`; and the built-in
// chains a firewall reload flushes, taking our jumps with them.

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

// kubeProxyRules are what kube-proxy's iptables mode leaves for node port
// 30080: its jumps first in PREROUTING and OUTPUT, and a DNAT to an old
// endpoint (the backend's port 8081).
const kubeProxyRules = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-EXT-WEB - [0:0]
-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I OUTPUT 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "e2e/web:http" -m tcp --dport 30080 -j KUBE-EXT-WEB
-A KUBE-EXT-WEB -p tcp -m comment --comment "e2e/web:http" -j DNAT --to-destination 198.18.12.2:8081
COMMIT
`

// TestBinaryIPTablesKubeProxyLeftovers: kube-proxy's leftover rules take
// node ports before ours. The proxy leaves them alone but says so at
// start, naming the chains and the jumps and `kube-proxy --cleanup`; it
// says when they go, and again when they come back while it runs
// (kubeadm re-installing kube-proxy); kube-proxy's nftables table is
// named as well.
func TestBinaryIPTablesKubeProxyLeftovers(t *testing.T) {
	w := newWorld(t)
	startBackend(t, w.backend, "8080=be1", "8081=stale", "8082=be6")
	restore := func(rules string) {
		t.Helper()
		cmd := exec.Command("ip", "netns", "exec", string(w.node), "iptables-nft-restore", "--noflush")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("iptables-nft-restore: %v\n%s", err, out)
		}
	}
	restore(kubeProxyRules)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables", "--iptables-sync-period=2s")
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	const warned = `"kube-proxy's iptables rules are in effect on this host .*take precedence over its node ports.*` +
		"`kube-proxy --cleanup`" + ` on this node removes them" command="iptables-nft" family="IPv4" table="nat"`
	px.waitLog(0, warned+` chains=\["KUBE-SERVICES","KUBE-NODEPORTS"\] jumps=\["OUTPUT -j KUBE-SERVICES","PREROUTING -j KUBE-SERVICES"\]`, 1, 5*time.Second)
	for _, l := range strings.Split(px.log(), "\n") {
		if strings.Contains(l, "kube-proxy") {
			t.Logf("at start: %s", l)
		}
	}
	// What the warning is about: the node port goes to kube-proxy's
	// endpoint, and the proxy does not touch kube-proxy's rules.
	expectReply(t, w.node, "tcp", nodePodSide+":30080", "stale:ping")
	if out := w.node.mustRun(t, "iptables-nft", "-t", "nat", "-S", "KUBE-NODEPORTS"); !strings.Contains(out, "--dport 30080") {
		t.Errorf("kube-proxy's node port rule went:\n%s", out)
	}

	// Someone runs kube-proxy --cleanup (the jumps go): said once.
	from := px.lineCount()
	w.node.mustRun(t, "iptables-nft", "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
	w.node.mustRun(t, "iptables-nft", "-t", "nat", "-D", "OUTPUT", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
	px.waitLog(from, `"kube-proxy's iptables rules no longer take traffic`, 1, 10*time.Second)
	expectReply(t, w.node, "tcp", nodePodSide+":30080", "be1:ping")
	expectReply(t, w.outside, "tcp", nodeOutSide+":30080", "be1:ping")

	// kube-proxy comes back while the proxy runs: said when first seen,
	// once.
	from = px.lineCount()
	restore("*nat\n-I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n")
	i := px.waitLog(from, warned+` jumps=\["PREROUTING -j KUBE-SERVICES"\]`, 1, 10*time.Second)
	px.waitLog(i, resynced, 2, 10*time.Second) // two resyncs later
	if n := strings.Count(strings.Join(logLines(px, from), "\n"), "kube-proxy's iptables rules are in effect"); n != 1 {
		t.Errorf("the warning was given %d times after kube-proxy's jump came back, want once", n)
	}

	// kube-proxy's nftables mode: its table "ip kube-proxy".
	from = px.lineCount()
	if err := nftTable(w.node, unix.NFT_MSG_NEWTABLE, unix.NFPROTO_IPV4, "kube-proxy"); err != nil {
		t.Fatalf("add table ip kube-proxy: %v", err)
	}
	px.waitLog(from, `"kube-proxy's nftables tables are on this host .*`+"`kube-proxy --cleanup`"+` on this node removes them" tables=\["ip kube-proxy"\]`, 1, 10*time.Second)
	from = px.lineCount()
	if err := nftTable(w.node, unix.NFT_MSG_DELTABLE, unix.NFPROTO_IPV4, "kube-proxy"); err != nil {
		t.Fatalf("delete table ip kube-proxy: %v", err)
	}
	px.waitLog(from, `"kube-proxy's nftables tables are gone from this host" tables=\["ip kube-proxy"\]`, 1, 10*time.Second)
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

// nftTable adds (NFT_MSG_NEWTABLE) or deletes (NFT_MSG_DELTABLE) the
// nftables table name of family in ns, with one netlink batch, as nft
// would: the nft command may not be installed.
func nftTable(ns netns, op uint16, family byte, name string) error {
	return runInNetns(ns, func() error { return nftBatch(op, family, name) })
}

func nftBatch(op uint16, family byte, name string) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	msg := func(typ, flags uint16, seq uint32, fam byte, resID uint16, attrs []byte) []byte {
		b := make([]byte, unix.NLMSG_HDRLEN+4, unix.NLMSG_HDRLEN+4+len(attrs))
		binary.NativeEndian.PutUint16(b[4:], typ)
		binary.NativeEndian.PutUint16(b[6:], flags)
		binary.NativeEndian.PutUint32(b[8:], seq)
		b[16] = fam
		binary.BigEndian.PutUint16(b[18:], resID)
		b = append(b, attrs...)
		binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
		return b
	}
	attr := make([]byte, unix.NLA_HDRLEN+len(name)+1)
	binary.NativeEndian.PutUint16(attr, uint16(len(attr)))
	binary.NativeEndian.PutUint16(attr[2:], unix.NFTA_TABLE_NAME)
	copy(attr[unix.NLA_HDRLEN:], name)
	for len(attr)%unix.NLA_ALIGNTO != 0 {
		attr = append(attr, 0)
	}
	flags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	if op == unix.NFT_MSG_NEWTABLE {
		flags |= unix.NLM_F_CREATE
	}
	var req []byte
	req = append(req, msg(unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, 1, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)...)
	req = append(req, msg(unix.NFNL_SUBSYS_NFTABLES<<8|op, flags, 2, family, 0, attr)...)
	req = append(req, msg(unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, 3, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)...)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq != 2 || len(m.Data) < 4 {
				continue
			}
			if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
				return unix.Errno(-errno)
			}
			return nil
		}
	}
}

// TestBinaryIPTablesOursAppearInTheOtherBackend: our chains put into the
// other backend while the proxy runs (an older proxy build, or a restore
// by hand) redirect traffic beside the proxy's rules, since the kernel
// runs both backends'; a resync finds them, says so, and removes them, as
// the start does with those an earlier run left. Before, only the start
// looked: the resync said its portals were in place, and the stale rule
// went on catching its address. Both backends, so each is looked at as
// the other: legacy through its tables in use, nft through its chains.
func TestBinaryIPTablesOursAppearInTheOtherBackend(t *testing.T) {
	for _, backend := range []string{"nft", "legacy"} {
		t.Run(backend, func(t *testing.T) { testOursAppearInTheOtherBackend(t, backend) })
	}
}

func testOursAppearInTheOtherBackend(t *testing.T, backend string) {
	other := map[string]string{"nft": "legacy", "legacy": "nft"}[backend]
	w := newWorld(t)
	if backend == "legacy" {
		// The host's rules are there: the portal writes there too.
		w.node.mustRun(t, "iptables-legacy", "-A", "INPUT", "-s", "198.18.250.0/24", "-j", "ACCEPT")
		w.node.mustRun(t, "iptables-legacy", "-A", "INPUT", "-s", "198.18.251.0/24", "-j", "ACCEPT")
	}
	startBackend(t, w.backend, "8080=be1", "8081=be6")
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, netnsManifest)
	px := startNodeProxy(t, w, file, "--portal=iptables", "--iptables-sync-period=2s")
	px.waitLog(0, `"Using iptables portal" backend="`+backend+`"`, 1, 30*time.Second)
	i := px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)
	px.waitLog(i, `"Portals in place; nothing written"`, 1, 10*time.Second)
	if left := ourRules(t, w.node, other); len(left) > 0 {
		t.Fatalf("ours in %s before the test put them there:\n%s", other, strings.Join(left, "\n"))
	}
	const stale = "198.18.0.77:80" // no Service of the proxy's
	if r := dialHere(t, w.pod, "tcp", stale, "ping", 0); strings.Contains(r.Err, "connection refused") {
		t.Fatalf("%s is refused before the stale rule: %+v", stale, r)
	}

	// An older proxy's rules, in the other backend: a portal to a proxy
	// port nobody serves now.
	from := px.lineCount()
	cmd := exec.Command("ip", "netns", "exec", string(w.node), "iptables-"+other+"-restore", "--noflush")
	cmd.Stdin = strings.NewReader(`*nat
:KUBE-PORTALS-CONTAINER - [0:0]
-I PREROUTING 1 -m comment --comment "kube-userspace-proxy service portals" -j KUBE-PORTALS-CONTAINER
-A KUBE-PORTALS-CONTAINER -d 198.18.0.77/32 -p tcp -m comment --comment "e2e/gone:http" -m tcp --dport 80 -j REDIRECT --to-ports 40077
COMMIT
`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables-%s-restore: %v\n%s", other, err, out)
	}
	if r := dialHere(t, w.pod, "tcp", stale, "ping", 0); !strings.Contains(r.Err, "connection refused") {
		t.Errorf("%s with our chains in %s: %+v, want refused at the stale rule's proxy port", stale, other, r)
	}
	i = px.waitLog(from, `"Found the portal's chains in the other iptables backend since the proxy started.*" command="iptables-`+other+`" family="IPv4"`, 1, 10*time.Second)
	if line := logLines(px, i-1)[0]; !strings.HasPrefix(line, "E") {
		t.Errorf("not a warning: %s", line)
	}
	i = px.waitLog(i, `"Removed the portal's chains from the other iptables backend" command="iptables-`+other+`" jumps=1 chains=1`, 1, 10*time.Second)
	if left := ourRules(t, w.node, other); len(left) > 0 {
		t.Errorf("ours still in %s:\n%s", other, strings.Join(left, "\n"))
	}
	if r := dialHere(t, w.pod, "tcp", stale, "ping", 0); strings.Contains(r.Err, "connection refused") {
		t.Errorf("%s after the removal: %+v, still refused", stale, r)
	}
	checkServed(t, w, true)
	// Then the resyncs find nothing to do again, and say it once.
	px.waitLog(i, `"Portals in place; nothing written"`, 2, 10*time.Second)
	if n := strings.Count(strings.Join(logLines(px, from), "\n"), "Found the portal's chains in the other iptables backend"); n != 1 {
		t.Errorf("the other backend's chains were reported %d times, want once", n)
	}
}
