//go:build integration && linux

package integration

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// rejectManifest is a dual-stack Service without endpoints, a TCP and a
// UDP port, each with a node port.
const rejectManifest = `apiVersion: v1
kind: Service
metadata: {name: empty, namespace: e2e}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 198.18.0.60
  clusterIPs: [198.18.0.60, "fd5e:b1b5::60"]
  ports: [{name: http, protocol: TCP, port: 80, nodePort: 30060}, {name: dns, protocol: UDP, port: 53, nodePort: 30061}]
`

// TestBinaryNoEndpointsRefusesBusyTCPClients: a TCP client that opens
// many connections at once to a Service without endpoints has every one
// refused at once (ECONNREFUSED), in both families and through both
// iptables backends. The portal refused them with an ICMP port
// unreachable (a plain REJECT), which the kernel rate-limits per client
// (net.ipv4.icmp_ratelimit, left here at its default, as on a node): of
// 300 SYNs at once, a handful were refused and the rest went unanswered,
// their clients retransmitting until their connect timeout (xa57). A TCP
// reset is not limited. UDP keeps the ICMP reply, and the rules, reset
// included, read back as written: a resync writes nothing.
func TestBinaryNoEndpointsRefusesBusyTCPClients(t *testing.T) {
	for _, backend := range []string{"nft", "legacy"} {
		t.Run(backend, func(t *testing.T) { testNoEndpointsRefusesBusyTCPClients(t, backend) })
	}
}

func testNoEndpointsRefusesBusyTCPClients(t *testing.T, backend string) {
	w := newWorld(t)
	if backend == "legacy" {
		// The host's rules are there: the portal writes there too.
		w.node.mustRun(t, "iptables-legacy", "-A", "INPUT", "-s", "198.18.250.0/24", "-j", "ACCEPT")
		w.node.mustRun(t, "ip6tables-legacy", "-A", "INPUT", "-s", "fd5e:b1b5:250::/64", "-j", "ACCEPT")
	}
	for _, ns := range []netns{w.node, w.pod, w.outside} {
		if out := strings.TrimSpace(ns.mustRun(t, "sysctl", "-n", "net.ipv4.icmp_ratelimit")); out == "0" {
			t.Fatalf("net.ipv4.icmp_ratelimit is 0 in %s: the test needs the kernel's limit on ICMP errors", ns)
		}
	}
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, rejectManifest)
	wrappers, restores := restoreCounter(t)
	px := startCommand(t, "ip", "netns", "exec", string(w.node), "env", "PATH="+wrappers+":"+os.Getenv("PATH"),
		proxyBin, "--manifests", file, "--hostname-override=node", "-v=2", "--portal=iptables", "--iptables-sync-period=2s")
	px.waitLog(0, `"Using iptables portal" backend="`+backend+`"`, 1, 30*time.Second)
	px.waitLog(0, `"Portals synced"`, 1, 30*time.Second)

	rules := ourRules(t, w.node, backend)
	for _, want := range []string{
		`ipt -A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment "e2e/empty:http has no endpoints" -m conntrack --ctstate NEW -m tcp --dport `,
		`ip6 -A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment "e2e/empty:http has no endpoints" -m conntrack --ctstate NEW -m tcp --dport `,
		`ipt -A KUBE-NODEPORT-NON-LOCAL -p udp -m comment --comment "e2e/empty:dns has no endpoints" -m conntrack --ctstate NEW -m udp --dport `,
		`ip6 -A KUBE-NODEPORT-NON-LOCAL -p udp -m comment --comment "e2e/empty:dns has no endpoints" -m conntrack --ctstate NEW -m udp --dport `,
	} {
		reply := " -j REJECT --reject-with tcp-reset"
		switch {
		case strings.Contains(want, "-p udp") && strings.HasPrefix(want, "ip6"):
			reply = " -j REJECT --reject-with icmp6-port-unreachable"
		case strings.Contains(want, "-p udp"):
			reply = " -j REJECT --reject-with icmp-port-unreachable"
		}
		if !slices.ContainsFunc(rules, func(r string) bool { return strings.HasPrefix(r, want) && strings.HasSuffix(r, reply) }) {
			t.Errorf("no rule %q...%q:\n%s", want, reply, strings.Join(slices.DeleteFunc(slices.Clone(rules), func(r string) bool {
				return !strings.Contains(r, "-A KUBE-NODEPORT-NON-LOCAL ")
			}), "\n"))
		}
	}

	// 300 connections at once from one client, to each family's
	// ClusterIP from the pod and to the node port from outside (each
	// client address has its own ICMP allowance).
	for _, tc := range []struct {
		from netns
		addr string
	}{
		{w.pod, "198.18.0.60:80"},
		{w.pod, "[fd5e:b1b5::60]:80"},
		{w.outside, nodeOutSide + ":30060"},
		{w.outside, "[fd5e:b1b5:11::1]:30060"},
	} {
		res := connectAll(t, tc.from, netip.MustParseAddrPort(tc.addr), 300, time.Second)
		if res.refused != 300 {
			t.Errorf("300 connections at once from %s to %s: %s; want all refused within 1s", tc.from, tc.addr, res)
		} else {
			t.Logf("300 connections at once from %s to %s: %s", tc.from, tc.addr, res)
		}
	}
	// UDP is still refused with an ICMP port unreachable.
	for _, addr := range []string{"198.18.0.60:53", "[fd5e:b1b5::60]:53"} {
		if r := dial(t, w.pod, "udp-connected", addr, "ping", 0); !strings.Contains(r.Err, "connection refused") {
			t.Errorf("UDP to %s without endpoints: %+v; want \"connection refused\"", addr, r)
		}
	}

	// The rules read back as written: resyncs write nothing.
	written := restores()
	px.waitLog(px.lineCount(), `"Portals in place; nothing written"|"Portals synced"`, 2, 20*time.Second)
	if n := restores(); n != written {
		t.Errorf("unchanged resyncs ran iptables-restore %d times, want none:\n%s", n-written, strings.Join(rules, "\n"))
	}
	if after := ourRules(t, w.node, backend); !slices.Equal(after, rules) {
		t.Errorf("rules changed:\n%s\nbefore:\n%s", strings.Join(after, "\n"), strings.Join(rules, "\n"))
	}
}

// connectResult counts how n connections at once ended.
type connectResult struct {
	refused int      // ECONNREFUSED within the limit
	late    int      // ECONNREFUSED, after the limit
	noReply int      // still connecting at the end
	other   []string // anything else (connected, another error), the first few
	slowest time.Duration
}

func (r connectResult) String() string {
	return fmt.Sprintf("%d refused within the limit (slowest %v), %d refused later, %d unanswered (timed out), other %q",
		r.refused, r.slowest.Round(time.Millisecond), r.late, r.noReply, r.other)
}

// connectAll opens n TCP connections to dst from ns at once, as a busy
// client does: n non-blocking sockets of ns, each connect started one
// after the other, then waits for their outcomes until within has passed
// since the last one started, and half as long again to tell a late
// refusal (after a SYN retransmission) from none.
func connectAll(t *testing.T, ns netns, dst netip.AddrPort, n int, within time.Duration) connectResult {
	t.Helper()
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()})
	if dst.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	}
	type conn struct {
		fd      int
		started time.Time
		err     error // the outcome, once known
		took    time.Duration
		done    bool
	}
	conns := make([]conn, 0, n)
	defer func() {
		for _, c := range conns {
			unix.Close(c.fd)
		}
	}()
	// On a thread in ns: a socket stays in the namespace it was made in.
	err := runInNetns(ns, func() error {
		for range n {
			fd, serr := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if serr != nil {
				return serr
			}
			c := conn{fd: fd, started: time.Now()}
			switch cerr := unix.Connect(fd, sa); {
			case errors.Is(cerr, unix.EINPROGRESS):
			default:
				c.err, c.took, c.done = cerr, time.Since(c.started), true
			}
			conns = append(conns, c)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%d connections from %s to %s: %v", n, ns, dst, err)
	}
	end := conns[len(conns)-1].started.Add(within * 3 / 2)
	for {
		var pfds []unix.PollFd
		var idx []int
		for i, c := range conns {
			if !c.done {
				pfds = append(pfds, unix.PollFd{Fd: int32(c.fd), Events: unix.POLLOUT})
				idx = append(idx, i)
			}
		}
		wait := time.Until(end)
		if len(pfds) == 0 || wait <= 0 {
			break
		}
		if _, err := unix.Poll(pfds, int(wait.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			t.Fatalf("poll: %v", err)
		}
		now := time.Now()
		for j, p := range pfds {
			if p.Revents == 0 {
				continue
			}
			c := &conns[idx[j]]
			c.done, c.took = true, now.Sub(c.started)
			if v, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil {
				c.err = err
			} else if v != 0 {
				c.err = syscall.Errno(v)
			}
		}
	}
	var r connectResult
	for _, c := range conns {
		switch {
		case !c.done:
			r.noReply++
		case errors.Is(c.err, unix.ECONNREFUSED) && c.took <= within:
			r.refused++
			r.slowest = max(r.slowest, c.took)
		case errors.Is(c.err, unix.ECONNREFUSED):
			r.late++
		case len(r.other) < 5:
			r.other = append(r.other, fmt.Sprintf("after %v: %v", c.took.Round(time.Millisecond), c.err))
		}
	}
	return r
}
