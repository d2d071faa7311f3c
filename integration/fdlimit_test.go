//go:build integration && linux

package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestBinaryKeepsConnectionsWithoutSpareDescriptors: a proxy that has just
// enough file descriptors for its connections, and none for the splice
// pipes that bulk data would use, still delivers every byte of every
// transfer: connections it already serves are not cut for want of a pipe.
func TestBinaryKeepsConnectionsWithoutSpareDescriptors(t *testing.T) {
	const (
		conns = 20
		size  = 16 << 20 // bytes each endpoint sends: more than the sockets' buffers hold
	)
	// The endpoint waits until every connection is in, so the proxy holds
	// its two descriptors for each before any bulk data moves.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, conns)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	// Two descriptors per connection, and a few to spare; no room for the
	// two of a pipe per connection.
	p, np, _ := proxyWithFewDescriptors(t, proxyBin, ln.Addr().(*net.TCPAddr).Port, 2*conns+4)

	clients := make([]net.Conn, conns)
	for i := range clients {
		c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", np), 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		defer c.Close()
		// A small receive buffer, so the transfer cannot wait in the
		// client's socket (where tcp_rmem allows, 32 MiB on this
		// machine's kernel, a receive queue took all 4 MiB unread and
		// no pipe was ever short) and must wait in a pipe.
		if err := c.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	payload := make([]byte, size)
	for i := range conns {
		select {
		case c := <-accepted:
			go func() {
				defer c.Close()
				c.Write(payload)
			}()
		case <-time.After(10 * time.Second):
			t.Fatalf("the endpoint got %d of %d connections:\n%s", i, conns, p.log())
		}
	}

	// The clients read nothing until the proxy has run out of pipes: data
	// the clients do not take stays in each connection's pipe, so every
	// connection wants one at once. (Clients that read at once let a few
	// pipes, returned as each connection drained, serve them all in turn,
	// and the test sometimes proved nothing.)
	p.waitLog(0, "Out of file descriptors for splice pipes", 1, 20*time.Second)
	var wg sync.WaitGroup
	got := make([]int64, conns)
	errs := make([]error, conns)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(60 * time.Second))
			got[i], errs[i] = io.Copy(io.Discard, c)
		}()
	}
	wg.Wait()
	for i := range conns {
		if got[i] != size || errs[i] != nil {
			t.Errorf("connection %d: %d of %d bytes, %v", i, got[i], size, errs[i])
		}
	}
	if t.Failed() {
		t.Logf("proxy log:\n%s", p.log())
	}
}

// TestBinaryOutOfDescriptorsDoesNotSpin: when the proxy can neither accept
// nor shed a waiting connection (no descriptor is free, not even its
// spare, which another dial took), it leaves the listening socket alone for
// a moment instead of spinning on it, and serves again once descriptors are
// free. Both builds: the goroutine build spun at a full core before.
func TestBinaryOutOfDescriptorsDoesNotSpin(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) { outOfDescriptors(t, tc.bin) })
	}
}

func outOfDescriptors(t *testing.T, bin string) {
	// The endpoint holds what it accepts, until released; then it echoes.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var held []net.Conn
	released := false
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if !released {
				held = append(held, c)
				mu.Unlock()
				continue
			}
			mu.Unlock()
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	release := func() {
		mu.Lock()
		defer mu.Unlock()
		released = true
		for _, c := range held {
			c.Close()
		}
	}
	defer release()

	p, np, _ := proxyWithFewDescriptors(t, bin, ln.Addr().(*net.TCPAddr).Port, 8)
	pid := p.cmd.Process.Pid

	// Far more clients than descriptors, all at once.
	addr := fmt.Sprintf("127.0.0.1:%d", np)
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range 40 {
		if c, err := net.DialTimeout("tcp4", addr, 2*time.Second); err == nil {
			clients = append(clients, c)
		}
	}
	// Whether it could shed one with its spare (which another dial may
	// have taken), or not, it says it is out of descriptors.
	p.waitLog(0, `"Out of file descriptors( or buffers; shedding new connections|, without a spare one to shed a connection with)`, 1, 10*time.Second)

	cpu := func() time.Duration {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
		ticks := 0
		for _, i := range []int{11, 12} { // utime and stime, after the command name
			n, _ := strconv.Atoi(f[i])
			ticks += n
		}
		return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100
	}
	before := cpu()
	time.Sleep(2 * time.Second)
	if used := cpu() - before; used > 500*time.Millisecond {
		t.Errorf("the proxy used %v of CPU in 2s while out of descriptors: it spins", used)
	}

	// Descriptors come back: the proxy serves again.
	release()
	for _, c := range clients {
		c.Close()
	}
	clients = nil
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
		if err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 4)
			if _, err = c.Write([]byte("ping")); err == nil {
				_, err = io.ReadFull(c, buf)
			}
			c.Close()
			if err == nil && string(buf) == "ping" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not served again once descriptors were free: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestBinaryOutOfDescriptorsShedsNewClients: a client that connects while
// the proxy is out of file descriptors is reset at once (shed, with the
// proxy's spare descriptor) rather than left waiting, and counted in
// shed_total; the proxy serves again once descriptors are free. Clients
// come one at a time, each echoed or reset before the next, first with
// descriptors for a few connections (the tester's case), then with none
// free at all. The goroutine build gave up its spare while no client
// waited and a dial took it, so the next client waited for ever.
func TestBinaryOutOfDescriptorsShedsNewClients(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) { outOfDescriptorsSheds(t, tc.bin) })
	}
}

func outOfDescriptorsSheds(t *testing.T, bin string) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	mp := freePort(t)
	p, np, _ := proxyWithFewDescriptors(t, bin, ln.Addr().(*net.TCPAddr).Port, 20, fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))
	pid := p.cmd.Process.Pid
	addr := fmt.Sprintf("127.0.0.1:%d", np)

	var kept []net.Conn // echoed clients, held open so their descriptors stay taken
	defer func() {
		for _, c := range kept {
			c.Close()
		}
	}()
	resets := 0
	// try connects one client and says whether it was echoed (and is
	// kept); a client that is neither echoed nor reset within 3s fails the
	// test.
	try := func(what string) bool {
		t.Helper()
		// A reset may come before connect has returned.
		c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
		if err == nil {
			c.SetDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 4)
			if _, err = c.Write([]byte("ping")); err == nil {
				_, err = io.ReadFull(c, buf)
			}
			if err == nil {
				kept = append(kept, c)
				return true
			}
			c.Close()
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: neither served nor reset within 3s: the client waits while the proxy is out of descriptors\nproxy log:\n%s", what, p.log())
		}
		resets++
		return false
	}

	// Descriptors for about ten connections: clients are echoed until
	// they run out, and then each is reset.
	i := 0
	for ; i < 40 && try(fmt.Sprintf("client %d", i)); i++ {
	}
	if resets == 0 {
		t.Fatalf("40 clients served with descriptors for about 10")
	}
	for j := range 3 {
		if try(fmt.Sprintf("client %d, after the first reset", i+1+j)) {
			t.Errorf("client %d served after the first reset, while no descriptor was freed", i+1+j)
		}
	}

	// No descriptor free at all, not even one for accept: the limit is the
	// lowest free descriptor, so the proxy's spare is below it and every
	// other one up to it is open. The spare's number is free for a moment
	// while a loop that woke for the last client sheds: the highest of a
	// few reads is the lowest free one, since no connection opens or
	// closes meanwhile.
	lowest := 0
	for range 5 {
		lowest = max(lowest, lowestFreeFD(t, pid))
		time.Sleep(20 * time.Millisecond)
	}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(lowest), Max: uint64(lowest)}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	for j := range 3 {
		if try(fmt.Sprintf("client %d, with no descriptor free", j)) {
			t.Errorf("client %d served with no descriptor free", j)
		}
	}
	if strings.Contains(p.log(), "without a spare one to shed a connection with") {
		t.Errorf("the proxy lost its spare descriptor while clients came one at a time:\n%s", p.log())
	}

	// Descriptors come back: the proxy serves again, and counted every
	// reset client as shed.
	for _, c := range kept {
		c.Close()
	}
	kept = nil
	deadline := time.Now().Add(10 * time.Second)
	for !try("a client once descriptors are free") {
		if time.Now().After(deadline) {
			t.Fatalf("not served again once descriptors were free:\n%s", p.log())
		}
		resets--
		time.Sleep(100 * time.Millisecond)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", mp))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	var shed, accepted float64 = -1, -1
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "kube_userspace_proxy_shed_total "); ok {
			shed, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(line, "kube_userspace_proxy_tcp_connections_accepted_total "); ok {
			accepted, _ = strconv.ParseFloat(v, 64)
		}
	}
	if shed < float64(resets) {
		t.Errorf("kube_userspace_proxy_shed_total = %v, want at least the %d clients reset", shed, resets)
	}
	// accepted_total counts every connection taken, the shed ones too,
	// whichever way they were shed (at EMFILE with the spare, at the
	// reserve, at the dial). The event-loop build left out those shed
	// at accept.
	if accepted < shed+float64(i) {
		t.Errorf("kube_userspace_proxy_tcp_connections_accepted_total = %v, want at least the %v shed and the %d echoed", accepted, shed, i)
	}
	t.Logf("%d clients echoed, %d reset, shed_total %v, accepted_total %v", i, resets, shed, accepted)
}

// lowestFreeFD is the lowest descriptor number process pid has not open.
func lowestFreeFD(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	open := map[int]bool{}
	for _, e := range entries {
		n, _ := strconv.Atoi(e.Name())
		open[n] = true
	}
	lowest := 0
	for open[lowest] {
		lowest++
	}
	return lowest
}

// loopbackNodePortManifest is a NodePort Service name, on node port np,
// with one endpoint at 127.0.0.1:endpointPort.
func loopbackNodePortManifest(name string, np, endpointPort int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: e2e}
spec:
  type: NodePort
  ports: [{name: tcp, port: 80, nodePort: %[2]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: e2e, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{name: tcp, port: %[3]d}]
endpoints: [{addresses: ["127.0.0.1"]}]
`, name, np, endpointPort)
}

// proxyWithFewDescriptors starts bin on a NodePort Service whose endpoint
// is 127.0.0.1:endpointPort and, once it serves, limits its open files to
// those it holds and spare more. It returns the proxy, the node port and
// the limit. It counts the open files once every listener is open (the
// node port, the proxy port, and /metrics when args ask for it), so that
// none opens later, within the limit: the spare, given up for a moment
// to shed a client, could lose its number to one.
func proxyWithFewDescriptors(t *testing.T, bin string, endpointPort, spare int, args ...string) (*proxyProc, int, uint64) {
	t.Helper()
	np := freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, loopbackNodePortManifest("few", np, endpointPort))
	p := startCommand(t, bin, append(proxyArgs(file), args...)...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
	p.waitLog(0, `"Serving".*via="proxy-port"`, 1, 20*time.Second)
	for _, a := range args {
		if addr, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok && addr != "" {
			p.waitLog(0, `"Serving /metrics"`, 1, 20*time.Second)
		}
	}
	pid := p.cmd.Process.Pid
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	limit := uint64(len(entries) + spare)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}
	return p, np, limit
}

// startWithFDLimit starts bin with RLIMIT_NOFILE at limit from its start
// (soft and hard, as `ulimit -n` sets them), as a DaemonSet's container
// runtime would.
func startWithFDLimit(t *testing.T, bin string, limit int, args ...string) *proxyProc {
	t.Helper()
	return startCommand(t, "/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, limit), bin}, args...)...)
}

// answers says whether url answers 200 within 5s, and why not.
func answers(url string) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// waitAnswers waits, up to 10 s, until url answers 200 (see answers);
// else the test fails with p's log.
func waitAnswers(t *testing.T, p *proxyProc, url string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); answers(url) != nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered:\n%s", url, p.log())
		}
	}
}

// echoes says whether c, a connection through the proxy to an echo
// backend, echoes a line.
func echoes(c net.Conn) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "ping\n" {
		return fmt.Errorf("echo %q", buf)
	}
	return nil
}

// TestBinaryHealthAnswersWhileClientsHoldEveryDescriptor: clients that
// hold every connection the proxy can take leave it the descriptors it
// keeps in reserve, so /livez, /healthz and /metrics still answer (a
// liveness probe left unanswered restarts the proxy and cuts every
// connection) and the clients it already serves go on; the clients past
// the reserve are reset and counted as shed. Both builds, under a limit
// set before the proxy starts. The event-loop build used every descriptor
// and its health and metrics servers failed to accept (EMFILE).
func TestBinaryHealthAnswersWhileClientsHoldEveryDescriptor(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) { healthWhileClientsHoldDescriptors(t, tc.bin, false) })
	}
}

// TestBinaryBurstPastTheDescriptorCeilingServesTheFirstClients: the same
// clients all wait in the listener's queue before the proxy takes any (it
// is stopped while they connect), so it accepts them faster than it dials
// their endpoints. The clients it accepted first are still served, and
// those past what the descriptors allow are shed. The goroutine build
// accepted on past the ceiling before the first clients' dials had their
// descriptors, so those dials found none and the first clients were reset.
func TestBinaryBurstPastTheDescriptorCeilingServesTheFirstClients(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) { healthWhileClientsHoldDescriptors(t, tc.bin, true) })
	}
}

// healthWhileClientsHoldDescriptors connects as many clients as the
// proxy's descriptor limit, all queued at once while the proxy is stopped
// if burst, and checks that health and metrics answer, the first client
// is served, and the clients past the reserve are shed.
func healthWhileClientsHoldDescriptors(t *testing.T, bin string, burst bool) {
	const limit = 200
	backend := echoBackend(t)
	np, hp, mp := freePort(t), freePort(t), freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, loopbackNodePortManifest("held", np, backend))
	p := startWithFDLimit(t, bin, limit, append(proxyArgs(file),
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hp), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
	livez := fmt.Sprintf("http://127.0.0.1:%d/livez", hp)
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", hp)
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", mp)
	waitAnswers(t, p, healthz)

	// As many idle clients as the limit: two descriptors each would take
	// twice what the proxy has.
	addr := fmt.Sprintf("127.0.0.1:%d", np)
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	if burst {
		// The kernel completes the handshakes and queues the connections
		// while the proxy is stopped.
		stop(t, p)
	}
	// A client shed before its connect returned reads the reset there.
	const firstServed = 16
	resetAtConnect := 0
	for i := range limit {
		c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
		switch {
		case err == nil:
			clients = append(clients, c)
		case i < firstServed:
			t.Fatalf("client %d: %v", i, err)
		case errors.Is(err, unix.ECONNRESET):
			resetAtConnect++
		default:
			t.Fatalf("client %d: %v", i, err)
		}
	}
	if burst {
		resume(t, p)
	}
	p.waitLog(0, `"Out of file descriptors`, 1, 20*time.Second)
	// Some time for the descriptors freed by resets to be taken, if the
	// data plane would.
	time.Sleep(500 * time.Millisecond)

	var slowest time.Duration
	for _, url := range []string{livez, healthz, metrics, livez} {
		start := time.Now()
		if err := answers(url); err != nil {
			t.Errorf("while clients hold every descriptor the data plane may use: %v", err)
		}
		slowest = max(slowest, time.Since(start))
	}
	t.Logf("the slowest of four health and metrics requests took %v", slowest)
	// The clients past the reserve were reset: one that is kept reads its
	// echo, one that was shed reads a reset or EOF. The first ones came
	// while descriptors were plenty, and are served.
	served, shed := 0, resetAtConnect
	for i, c := range clients {
		err := echoes(c)
		if err == nil {
			served++
			continue
		}
		shed++
		if i < firstServed {
			t.Errorf("client %d of the first %d, which came while descriptors were plenty, was not served: %v", i, firstServed, err)
		}
	}
	t.Logf("%d clients served, %d shed, under a limit of %d", served, shed, limit)
	if shed == 0 {
		t.Errorf("%d clients all served under a limit of %d", served, limit)
	}
	if served > limit/2 {
		t.Errorf("%d clients served under a limit of %d: the reserve is not kept", served, limit)
	}
	if t.Failed() {
		t.Logf("proxy log:\n%s", tail(p.log(), 40))
	}
}

// stop stops p (SIGSTOP) until resume or the end of the test.
func stop(t *testing.T, p *proxyProc) {
	t.Helper()
	if err := p.cmd.Process.Signal(unix.SIGSTOP); err != nil {
		t.Fatalf("stop the proxy: %v", err)
	}
	t.Cleanup(func() { p.cmd.Process.Signal(unix.SIGCONT) })
}

// resume continues p after stop.
func resume(t *testing.T, p *proxyProc) {
	t.Helper()
	if err := p.cmd.Process.Signal(unix.SIGCONT); err != nil {
		t.Fatalf("continue the proxy: %v", err)
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestBinaryTooManyListenersKeepsServing: more service ports than the
// descriptor limit allows listeners for. The proxy stops opening
// listeners short of the limit (the ports left out are reported and
// retried), so the ports it listens on serve their clients and /livez and
// /metrics answer. Both builds. The proxy took every descriptor for
// listeners, reset every connection to them and left its probes
// unanswered, and its retries took any descriptor freed for yet another
// listener.
func TestBinaryTooManyListenersKeepsServing(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) { tooManyListeners(t, tc.bin) })
	}
}

func tooManyListeners(t *testing.T, bin string) {
	const (
		limit = 512
		ntcp  = 600
		nudp  = 100
		// held at once, half through each of three served ports: the
		// room left for connections is an eighth of the limit (64
		// descriptors here, 32 connections) less what the rest of the
		// process opens after the first listener, so 18 leave a margin
		// (30 failed now and then under load)
		conns = 12
	)
	backend := echoBackend(t)
	ub := udpBackend(t, "u")
	var m strings.Builder
	for k := range ntcp + nudp {
		proto, bp := "TCP", backend
		if k >= ntcp {
			proto, bp = "UDP", ub
		}
		fmt.Fprintf(&m, `---
apiVersion: v1
kind: Service
metadata: {name: s%d, namespace: many}
spec:
  clusterIP: 198.18.%d.%d
  ports: [{name: p, protocol: %s, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s%d-1, namespace: many, labels: {kubernetes.io/service-name: s%d}}
addressType: IPv4
ports: [{name: p, protocol: %s, port: %d}]
endpoints: [{addresses: ["127.0.0.1"]}]
`, k, 1+k/250, 1+k%250, proto, k, k, proto, bp)
	}
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, m.String())
	hp, mp := freePort(t), freePort(t)
	p := startWithFDLimit(t, bin, limit, append(proxyArgs(file),
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hp), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))...)
	p.waitLog(0, `"Serving" service="many/s0:p/TCP"`, 1, 30*time.Second)
	// Let it sync and retry a few times.
	time.Sleep(3 * time.Second)

	served := regexp.MustCompile(`"Serving" service="many/s\d+:p/TCP" addr="(127\.0\.0\.1:\d+)"`).FindAllStringSubmatch(p.log(), -1)
	t.Logf("%d of %d TCP ports served under a limit of %d", len(served), ntcp, limit)
	if len(served) == 0 || len(served) >= ntcp {
		t.Fatalf("%d of %d TCP ports served under a limit of %d:\n%s", len(served), ntcp, limit, tail(p.log(), 40))
	}
	for _, url := range []string{
		fmt.Sprintf("http://127.0.0.1:%d/livez", hp),
		fmt.Sprintf("http://127.0.0.1:%d/metrics", mp),
	} {
		if err := answers(url); err != nil {
			t.Errorf("with more service ports than descriptors: %v", err)
		}
	}
	// The ports it listens on serve: several clients at once on each of a
	// few, the last opened among them.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for _, s := range []int{0, len(served) / 2, len(served) - 1} {
		addr := served[s][1]
		for i := range conns / 2 {
			c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
			if err == nil {
				err = echoes(c)
				held = append(held, c)
			}
			if err != nil {
				t.Errorf("client %d of the served port %s: %v", i, addr, err)
				break
			}
		}
	}
	if strings.Contains(p.log(), "too many listening sockets") == false {
		t.Errorf("the ports left out are not reported")
	}
	if t.Failed() {
		t.Logf("proxy log:\n%s", tail(p.log(), 40))
	}
}

// TestBinaryServiceAddedOutOfDescriptorsServedOnceTheyReturn: a Service
// added while clients hold every descriptor the data plane may use cannot
// be listened on; once the clients leave it is served within about a
// second, not after the sync's retry pause, which had doubled up to 30 s
// meanwhile (xa51). Both builds.
func TestBinaryServiceAddedOutOfDescriptorsServedOnceTheyReturn(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) { servedOnceDescriptorsReturn(t, tc.bin) })
	}
}

func servedOnceDescriptorsReturn(t *testing.T, bin string) {
	const limit = 200
	backend := echoBackend(t)
	np, added := freePort(t), freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, loopbackNodePortManifest("held", np, backend))
	p := startWithFDLimit(t, bin, limit, append(proxyArgs(file), "-v=2")...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)

	var clients []net.Conn
	closeAll := func() {
		for _, c := range clients {
			c.Close()
		}
		clients = nil
	}
	defer closeAll()
	for range limit {
		if c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", np), 2*time.Second); err == nil {
			clients = append(clients, c)
		}
	}
	p.waitLog(0, `"Out of file descriptors`, 1, 20*time.Second)
	writeFile(t, file, loopbackNodePortManifest("held", np, backend)+"---\n"+loopbackNodePortManifest("added", added, backend))
	// The goroutine build may still find room for the listeners: then
	// the Service is served at once, and only that is checked.
	p.waitLog(0, `"Sync failed.*e2e/added.*file descriptors|"Serving" service="e2e/added`, 1, 20*time.Second)
	if !strings.Contains(p.log(), `"Serving" service="e2e/added`) {
		// Long enough for the retry pause to double past 4 s (1, 2, 4,
		// 8 s).
		p.waitLog(0, `"Sync failed again"|"Sync failed`, 4, 30*time.Second)
	} else {
		t.Log("the added Service was listened on at once")
	}
	closeAll()
	left := time.Now()
	if err := servedWithin(fmt.Sprintf("127.0.0.1:%d", added), 5*time.Second); err != nil {
		t.Fatalf("the Service added while descriptors ran out is not served %v after the clients left: %v\n%s", time.Since(left).Round(time.Millisecond), err, tail(p.log(), 30))
	}
	t.Logf("served %v after the clients left", time.Since(left).Round(time.Millisecond))
}

// servedWithin connects to addr until a connection echoes, for up to
// timeout, and returns the last failure if none did.
func servedWithin(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp4", addr, time.Second)
		if err == nil {
			err = echoes(c)
			c.Close()
		}
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
