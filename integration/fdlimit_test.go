//go:build integration && linux

package integration

import (
	"fmt"
	"io"
	"net"
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

// proxyWithFewDescriptors starts bin on a NodePort Service whose endpoint
// is 127.0.0.1:endpointPort and, once it serves, limits its open files to
// those it holds and spare more. It returns the proxy, the node port and
// the limit.
func proxyWithFewDescriptors(t *testing.T, bin string, endpointPort, spare int) (*proxyProc, int, uint64) {
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
	p := startCommand(t, bin, proxyArgs(file)...)
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
