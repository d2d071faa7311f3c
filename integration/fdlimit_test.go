//go:build integration && linux

package integration

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
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

	np := freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: bulk, namespace: e2e}
spec:
  type: NodePort
  ports: [{name: data, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: bulk-1, namespace: e2e, labels: {kubernetes.io/service-name: bulk}}
addressType: IPv4
ports: [{name: data, port: %d}]
endpoints: [{addresses: ["127.0.0.1"]}]
`, np, ln.Addr().(*net.TCPAddr).Port))
	p := startProxy(t, proxyArgs(file)...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)

	// Two descriptors per connection, and a few to spare; no room for the
	// two of a pipe per connection.
	pid := p.cmd.Process.Pid
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	limit := uint64(len(entries) + 2*conns + 4)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatalf("prlimit: %v", err)
	}

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
	// The test is only worth something if pipes did run out.
	if !strings.Contains(p.log(), "Out of file descriptors for splice pipes") {
		t.Errorf("the proxy never ran short of pipes: the limit of %d left room", limit)
	}
	if t.Failed() {
		t.Logf("proxy log:\n%s", p.log())
	}
}
