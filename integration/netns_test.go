//go:build integration && linux

package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/netnstest"
)

// The kernel tests build a small world of network namespaces, all created
// and deleted by the test:
//
//	pod (198.18.10.2, fd5e:b1b5:10::2) --veth-- node (198.18.10.1)
//	outside (198.18.11.2, fd5e:b1b5:11::2) --veth-- node (198.18.11.1)
//	backend (198.18.12.2, fd5e:b1b5:12::2) --veth-- node (198.18.12.1)
//
// Service addresses live in 198.18.0.0/24, 198.19.0.0/16 and fd5e:b1b5::/64.
// The node routes everything else out towards the outside namespace, as a
// real node has a default route. Nothing here touches the host namespace:
// every link is created inside a namespace, and programs run in one through
// `ip netns exec` (this test binary re-executed as a helper, see
// runHelperMode).

const helperEnv = "KUPT_HELPER"

func init() {
	// A re-executed test binary runs one helper and exits before the
	// tests (and TestMain's build) start.
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelperMode(mode))
	}
}

// requireRoot skips without root, except under CI, where it fails.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("kernel tests need root (network namespaces, iptables)")
		}
		t.Skip("kernel tests need root: network namespaces and iptables")
	}
	for _, tool := range []string{"ip", "iptables", "ip6tables", "iptables-legacy"} {
		requireTool(t, tool)
	}
}

var (
	nsSeq   atomic.Int32
	nsSweep sync.Once
)

// netns is a network namespace the test created.
type netns string

func newNetns(t *testing.T, role string) netns {
	t.Helper()
	nsSweep.Do(func() { netnstest.SweepStale("kupt") })
	name := netns(fmt.Sprintf("kupt%d-%d-%s", os.Getpid(), nsSeq.Add(1), role))
	if out, err := exec.Command("ip", "netns", "add", string(name)).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", string(name)).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	name.mustRun(t, "ip", "link", "set", "lo", "up")
	return name
}

// run runs a command inside the namespace.
func (ns netns) run(args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", string(ns)}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (ns netns) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := ns.run(args...)
	if err != nil {
		t.Fatalf("in %s: %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
	return out
}

// world is the namespaces of one test.
type world struct {
	node, pod, outside, backend netns
}

// Addresses of the world.
const (
	nodePodSide  = "198.18.10.1"
	podAddr      = "198.18.10.2"
	nodeOutSide  = "198.18.11.1"
	outsideAddr  = "198.18.11.2"
	nodeBackSide = "198.18.12.1"
	backendAddr  = "198.18.12.2"
	backendAddr6 = "fd5e:b1b5:12::2"
)

func newWorld(t *testing.T) *world {
	t.Helper()
	requireRoot(t)
	w := &world{node: newNetns(t, "node"), pod: newNetns(t, "pod"), outside: newNetns(t, "out"), backend: newNetns(t, "be")}
	link := func(peer netns, nodeIf string, subnet int) {
		// Created inside the node namespace with its peer straight in the
		// other one: the host namespace never sees either end.
		w.node.mustRun(t, "ip", "link", "add", nodeIf, "type", "veth", "peer", "name", "eth0", "netns", string(peer))
		w.node.mustRun(t, "ip", "addr", "add", fmt.Sprintf("198.18.%d.1/24", subnet), "dev", nodeIf)
		w.node.mustRun(t, "ip", "-6", "addr", "add", fmt.Sprintf("fd5e:b1b5:%d::1/64", subnet), "dev", nodeIf, "nodad")
		w.node.mustRun(t, "ip", "link", "set", nodeIf, "up")
		peer.mustRun(t, "ip", "addr", "add", fmt.Sprintf("198.18.%d.2/24", subnet), "dev", "eth0")
		peer.mustRun(t, "ip", "-6", "addr", "add", fmt.Sprintf("fd5e:b1b5:%d::2/64", subnet), "dev", "eth0", "nodad")
		peer.mustRun(t, "ip", "link", "set", "eth0", "up")
		peer.mustRun(t, "ip", "route", "add", "default", "via", fmt.Sprintf("198.18.%d.1", subnet))
		peer.mustRun(t, "ip", "-6", "route", "add", "default", "via", fmt.Sprintf("fd5e:b1b5:%d::1", subnet))
	}
	link(w.pod, "to-pod", 10)
	link(w.outside, "to-out", 11)
	link(w.backend, "to-be", 12)
	// The node's default route, so its own traffic to service addresses
	// has a route before OUTPUT redirects it.
	w.node.mustRun(t, "ip", "route", "add", "default", "via", outsideAddr)
	w.node.mustRun(t, "ip", "-6", "route", "add", "default", "via", "fd5e:b1b5:11::2")
	return w
}

// helperProc is this test binary running a helper mode in a namespace.
type helperProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  chan string // stdout lines
	done chan struct{}

	mu     sync.Mutex // guards stderr
	stderr bytes.Buffer
}

func (h *helperProc) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stderr.Write(p)
}

func (h *helperProc) log() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stderr.String()
}

// startHelper runs a long-lived helper in ns. It is killed at cleanup.
func startHelper(t *testing.T, ns netns, mode string, env ...string) *helperProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := &helperProc{t: t, out: make(chan string, 64), done: make(chan struct{})}
	h.cmd = exec.Command("ip", "netns", "exec", string(ns), self)
	h.cmd.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	h.cmd.Stderr = h
	if h.in, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			h.out <- sc.Text()
		}
		h.cmd.Wait()
		close(h.done)
	}()
	t.Cleanup(func() {
		h.kill()
		if t.Failed() {
			t.Logf("%s helper log:\n%s", mode, h.log())
		}
	})
	return h
}

// kill ends the helper with SIGKILL and waits for it.
func (h *helperProc) kill() {
	h.cmd.Process.Kill()
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		h.t.Errorf("helper %d did not exit after SIGKILL", h.cmd.Process.Pid)
	}
}

// waitRunning waits for the "running" line a loop helper sends once its
// clients have had an answer; what names the helper in a failure.
func (h *helperProc) waitRunning(what string) {
	h.t.Helper()
	if got := h.line(30 * time.Second); got != "running" {
		h.t.Fatalf("%s: %q", what, got)
	}
}

// result ends a loop helper, by closing its input, and decodes into v the
// JSON line it answers with.
func (h *helperProc) result(what string, v any) {
	h.t.Helper()
	h.in.Close()
	if err := json.Unmarshal([]byte(h.line(30*time.Second)), v); err != nil {
		h.t.Fatalf("%s: %v", what, err)
	}
}

// line waits for the helper's next stdout line.
func (h *helperProc) line(timeout time.Duration) string {
	h.t.Helper()
	select {
	case l := <-h.out:
		return l
	case <-h.done:
		h.t.Fatalf("helper exited: %v\n%s", h.cmd.ProcessState, h.log())
	case <-time.After(timeout):
		h.t.Fatalf("helper said nothing within %v\n%s", timeout, h.log())
	}
	return ""
}

// call sends a JSON request and decodes the JSON answer.
func (h *helperProc) call(req, resp any, timeout time.Duration) {
	h.t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.in.Write(append(b, '\n')); err != nil {
		h.t.Fatalf("write to helper: %v\n%s", err, h.log())
	}
	if err := json.Unmarshal([]byte(h.line(timeout)), resp); err != nil {
		h.t.Fatalf("helper answer: %v", err)
	}
}

// startBackend runs echo servers in ns: for each "port=name", TCP and UDP
// on every address, answering "name:<request>".
func startBackend(t *testing.T, ns netns, ports ...string) {
	t.Helper()
	h := startHelper(t, ns, "backend", "KUPT_BACKENDS="+strings.Join(ports, ","))
	if l := h.line(10 * time.Second); l != "ready" {
		t.Fatalf("backend said %q", l)
	}
}

// clientResult is what a client helper saw.
type clientResult struct {
	Reply string `json:"reply"`
	From  string `json:"from"`  // the UDP reply's source address
	Local string `json:"local"` // the TCP client's own address
	Err   string `json:"err"`
}

// dial runs one client exchange from ns: proto is tcp, udp or
// udp-connected (a connected socket, which sees ICMP errors); srcPort 0
// lets the kernel choose. A TCP client with an empty payload sends
// nothing and reads what the server says.
func dial(t *testing.T, ns netns, proto, addr, payload string, srcPort int) clientResult {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", string(ns), self)
	cmd.Env = append(os.Environ(), helperEnv+"=client",
		"KUPT_PROTO="+proto, "KUPT_ADDR="+addr, "KUPT_PAYLOAD="+payload, fmt.Sprintf("KUPT_SRCPORT=%d", srcPort))
	out, err := cmd.Output()
	if err != nil {
		return clientResult{Err: fmt.Sprintf("client helper: %v", err)}
	}
	var r clientResult
	if err := json.Unmarshal(out, &r); err != nil {
		return clientResult{Err: fmt.Sprintf("client output %q: %v", out, err)}
	}
	return r
}

// expectReply checks one exchange gets the backend's answer (and, for UDP,
// an answer from the address it was sent to).
func expectReply(t *testing.T, ns netns, proto, addr, wantPrefix string) {
	t.Helper()
	r := dial(t, ns, proto, addr, "ping", 0)
	if r.Err != "" || !strings.HasPrefix(r.Reply, wantPrefix) {
		t.Errorf("%s %s from %s: reply %q, err %q; want %q", proto, addr, ns, r.Reply, r.Err, wantPrefix+"...")
		return
	}
	if proto == "udp" && r.From != addr {
		t.Errorf("udp %s from %s: reply came from %s, want the address sent to", addr, ns, r.From)
	}
}

func expectNoReply(t *testing.T, ns netns, proto, addr string) {
	t.Helper()
	if r := dial(t, ns, proto, addr, "ping", 0); r.Err == "" {
		t.Errorf("%s %s from %s answered %q, want no answer", proto, addr, ns, r.Reply)
	}
}

// runHelperMode is main for a re-executed test binary.
func runHelperMode(mode string) int {
	var err error
	switch mode {
	case "backend":
		err = runBackend(strings.Split(os.Getenv("KUPT_BACKENDS"), ","))
	case "client":
		runClient()
		return 0
	case "proxy":
		err = runProxyHelper(os.Getenv("KUPT_PORTAL"), os.Getenv("KUPT_PROXIER") == "1")
	case "relay":
		err = runRelay(os.Getenv("KUPT_LISTEN"), os.Getenv("KUPT_UNIX"))
	case "hold":
		err = runHold(os.Getenv("KUPT_ADDR"))
	case "connloop":
		err = runConnLoop(os.Getenv("KUPT_CONNLOOP"))
	case "udpclients":
		err = runUDPClients(os.Getenv("KUPT_UDPCLIENTS"))
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

// runBackend serves until stdin closes (the test ended or killed us).
func runBackend(specs []string) error {
	for _, s := range specs {
		port, name, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("bad backend %q", s)
		}
		ln, err := net.Listen("tcp", ":"+port)
		if err != nil {
			return err
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(10 * time.Second))
					line, _ := bufio.NewReader(c).ReadString('\n')
					fmt.Fprintf(c, "%s:%s", name, line)
				}()
			}
		}()
		pc, err := net.ListenPacket("udp", ":"+port)
		if err != nil {
			return err
		}
		go func() {
			buf := make([]byte, 65535)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(fmt.Appendf(nil, "%s:%s", name, buf[:n]), from)
			}
		}()
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return nil
}

// runClient does one exchange and prints a clientResult.
func runClient() {
	var srcPort int
	fmt.Sscan(os.Getenv("KUPT_SRCPORT"), &srcPort)
	r := exchange(os.Getenv("KUPT_PROTO"), os.Getenv("KUPT_ADDR"), os.Getenv("KUPT_PAYLOAD"), srcPort)
	json.NewEncoder(os.Stdout).Encode(r)
}

// dialHere is dial from a thread of the test process moved into ns
// (runInNetns), for an exchange whose time is measured: dial returns when
// its client helper, a new process of the test binary, has exited, and
// under the race detector that is a second after the exchange (the race
// runtime sleeps GORACE's atexit_sleep_ms, 1000 by default, at exit).
func dialHere(t *testing.T, ns netns, proto, addr, payload string, srcPort int) clientResult {
	t.Helper()
	var r clientResult
	if err := runInNetns(ns, func() error {
		r = exchange(proto, addr, payload, srcPort)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

// exchange is one client exchange (see dial), in the caller's network
// namespace.
func exchange(proto, addr, payload string, srcPort int) (r clientResult) {
	deadline := time.Now().Add(2 * time.Second)
	if proto == "tcp" {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			r.Err = err.Error()
			return
		}
		defer c.Close()
		r.Local = c.LocalAddr().String()
		c.SetDeadline(deadline)
		if payload != "" { // "": a server that speaks first
			fmt.Fprintln(c, payload)
		}
		b, err := io.ReadAll(c)
		r.Reply = strings.TrimSpace(string(b))
		if err != nil || r.Reply == "" {
			r.Err = fmt.Sprintf("read: %v (got %q)", err, b)
		}
		return
	}
	dst, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		r.Err = err.Error()
		return
	}
	if proto == "udp-connected" {
		// Connected, as resolvers are, so an ICMP error comes back as
		// "connection refused".
		c, err := net.DialUDP("udp", &net.UDPAddr{Port: srcPort}, dst)
		if err != nil {
			r.Err = err.Error()
			return
		}
		defer c.Close()
		c.SetDeadline(deadline)
		buf := make([]byte, 65535)
		n := 0
		if _, err = c.Write([]byte(payload)); err == nil {
			n, err = c.Read(buf)
		}
		if err != nil {
			r.Err = err.Error()
			return
		}
		r.Reply = strings.TrimSpace(string(buf[:n]))
		return
	}
	// Unconnected, so a reply from any source is seen (and reported).
	network := "udp4"
	if dst.IP.To4() == nil {
		network = "udp6"
	}
	c, err := net.ListenUDP(network, &net.UDPAddr{Port: srcPort})
	if err != nil {
		r.Err = err.Error()
		return
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if _, err := c.WriteTo([]byte(payload), dst); err != nil {
		r.Err = err.Error()
		return
	}
	buf := make([]byte, 65535)
	n, from, err := c.ReadFrom(buf)
	if err != nil {
		r.Err = err.Error()
		return
	}
	r.Reply = strings.TrimSpace(string(buf[:n]))
	ap := from.(*net.UDPAddr).AddrPort()
	r.From = strings.Replace(ap.String(), "::ffff:", "", 1)
	return r
}

// TestNetnsCleanup: the namespaces a test makes are gone when it ends,
// passed or not.
func TestNetnsCleanup(t *testing.T) {
	var names []netns
	t.Run("world", func(t *testing.T) {
		w := newWorld(t)
		names = []netns{w.node, w.pod, w.outside, w.backend}
	})
	if len(names) == 0 {
		t.Skip("no world was built")
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	for _, n := range names {
		if strings.Contains(string(out), string(n)+" ") || strings.Contains(string(out), string(n)+"\n") {
			t.Errorf("namespace %s left behind", n)
		}
	}
}

// runHold connects to addr, says "connected", and once a line comes on
// stdin reads from the connection for at most 8 s and says how that ended:
// "reset", "eof" or "timeout" (or the error).
func runHold(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("connected")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(8 * time.Second))
	_, err = c.Read(make([]byte, 64))
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		fmt.Println("reset")
	case errors.Is(err, io.EOF):
		fmt.Println("eof")
	case errors.As(err, &ne) && ne.Timeout():
		fmt.Println("timeout")
	default:
		fmt.Println(err)
	}
	return nil
}
