//go:build integration && linux

package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
		size  = 4 << 20 // bytes each endpoint sends
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
	// other one up to it is open.
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
	var shed float64 = -1
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "kube_userspace_proxy_shed_total "); ok {
			shed, _ = strconv.ParseFloat(v, 64)
		}
	}
	if shed < float64(resets) {
		t.Errorf("kube_userspace_proxy_shed_total = %v, want at least the %d clients reset", shed, resets)
	}
	t.Logf("%d clients echoed, %d reset, shed_total %v", i, resets, shed)
}

// proxyWithFewDescriptors starts bin on a NodePort Service whose endpoint
// is 127.0.0.1:endpointPort and, once it serves, limits its open files to
// those it holds and spare more. It returns the proxy, the node port and
// the limit.
func proxyWithFewDescriptors(t *testing.T, bin string, endpointPort, spare int, args ...string) (*proxyProc, int, uint64) {
	t.Helper()
	np := freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: few, namespace: e2e}
spec:
  type: NodePort
  ports: [{name: tcp, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: few-1, namespace: e2e, labels: {kubernetes.io/service-name: few}}
addressType: IPv4
ports: [{name: tcp, port: %d}]
endpoints: [{addresses: ["127.0.0.1"]}]
`, np, endpointPort))
	p := startCommand(t, bin, append(proxyArgs(file), args...)...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
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
