//go:build integration && linux

package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBinaryHTTPBoundsShrinkWithTheDescriptorLimit: under RLIMIT_NOFILE
// 64 and 128, where the data plane's reserve is a quarter of the limit
// (16, 32), slow clients holding every connection /healthz and /metrics
// keep (headers that never end, reopened as each is closed) leave the
// data plane its descriptors: clients of a Service, as many as the
// proxy's descriptors left under the data plane's ceiling allow once the
// servers hold half the reserve, are all served at once, and /healthz
// still answers a kubelet's probe within 1 s. The servers held 12 and 8
// connections at any limit, 20 of the 48 descriptors below the ceiling at
// 64: the data plane shed its clients. The proxy runs in a namespace of
// its own (--portal=none still looks for what an earlier proxy left).
func TestBinaryHTTPBoundsShrinkWithTheDescriptorLimit(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		limit int
		bound int // the health and metrics servers' connections together
	}{
		{64, 3 + 2},
		{128, 6 + 4},
	} {
		t.Run(fmt.Sprint(tc.limit), func(t *testing.T) {
			ns := newNetns(t, fmt.Sprintf("fd%d", tc.limit))
			var backend int
			if err := runInNetns(ns, func() error {
				ln, err := net.Listen("tcp4", "127.0.0.1:0")
				if err != nil {
					return err
				}
				t.Cleanup(func() { ln.Close() })
				backend = ln.Addr().(*net.TCPAddr).Port
				go serveEcho(ln)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			const np, hp, mp = 25620, 25621, 25622 // in the namespace: free
			file := filepath.Join(t.TempDir(), "services.yaml")
			writeFile(t, file, loopbackNodePortManifest("capped", np, backend))
			args := []string{"netns", "exec", string(ns), "/bin/sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, tc.limit), proxyBin,
				"--manifests", file, "--portal=none", "--bind-address=127.0.0.1", "--nodeport-addresses=127.0.0.1/32",
				fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hp), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp)}
			p := startCommand(t, "ip", args...)
			p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
			p.waitLog(0, `"Serving /healthz and /livez"`, 1, 20*time.Second)
			p.waitLog(0, `"Serving /metrics"`, 1, 20*time.Second)
			fds := func() int {
				entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
				if err != nil {
					t.Fatal(err)
				}
				return len(entries)
			}
			dial := func(addr string, from string) (net.Conn, error) {
				var c net.Conn
				err := runInNetns(ns, func() error {
					d := net.Dialer{Timeout: 2 * time.Second}
					if from != "" {
						d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
					}
					var err error
					c, err = d.Dial("tcp4", addr)
					return err
				})
				return c, err
			}
			before := fds()

			// The slow clients, from 127.0.0.1, 30 at each server.
			var closed atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			defer func() { close(stop); wg.Wait() }()
			for _, port := range []int{hp, mp} {
				for range 30 {
					wg.Go(func() {
						for {
							if c, err := dial(fmt.Sprintf("127.0.0.1:%d", port), ""); err == nil {
								holdSlow(c, stop)
							}
							select {
							case <-stop:
								return
							case <-time.After(50 * time.Millisecond): // its pace
								closed.Add(1)
							}
						}
					})
				}
			}
			// Until the servers are at their bounds: they closed as many
			// as there are slow clients.
			deadline := time.Now().Add(10 * time.Second)
			for closed.Load() < 60 {
				if time.Now().After(deadline) {
					t.Fatalf("after 10 s, %d slow connections closed and %d descriptors open", closed.Load(), fds())
				}
				time.Sleep(10 * time.Millisecond)
			}
			under := fds()

			// The data plane's clients, held at once: two descriptors
			// each (the client's, the endpoint's) in what the ceiling
			// (the limit less a quarter) leaves once the rest of the
			// proxy and the servers' bound hold theirs, with two spare
			// for the servers' connections while each closes another, and
			// two more. (The bounds of before, 12 and 8, leave 5 clients
			// fewer.)
			ceiling := tc.limit - tc.limit/4
			n := (ceiling - before - tc.bound - 4) / 2
			if n < 3 {
				t.Fatalf("%d descriptors open before the slow clients leave room for %d clients under the ceiling of %d", before, n, ceiling)
			}
			var clients []net.Conn
			defer func() {
				for _, c := range clients {
					c.Close()
				}
			}()
			for i := range n {
				c, err := dial(fmt.Sprintf("127.0.0.1:%d", np), "")
				if err == nil {
					clients = append(clients, c)
					err = echoes(c)
				}
				if err != nil {
					t.Fatalf("client %d of %d: %v (%d descriptors open, %d before the slow clients, %d under them)\n%s", i+1, n, err, fds(), before, under, tail(p.log(), 10))
				}
			}
			for i, c := range clients {
				if err := echoes(c); err != nil {
					t.Fatalf("client %d of %d, held: %v", i+1, n, err)
				}
			}
			// A kubelet's probe, from another address.
			c, err := dial(fmt.Sprintf("127.0.0.1:%d", hp), "127.0.0.2")
			if err != nil {
				t.Fatalf("probe: %v", err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Second))
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
				t.Fatalf("probe: %v", err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("probe: %v (%d descriptors open)", err, fds())
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("probe: %s", resp.Status)
			}
			t.Logf("limit %d: %d descriptors open before the slow clients, %d under them, %d with %d clients of the Service; %d slow connections closed", tc.limit, before, under, fds(), n, closed.Load())
			if strings.Contains(p.log(), "Out of file descriptors") {
				t.Errorf("the data plane ran out of descriptors:\n%s", tail(p.log(), 20))
			}
		})
	}
}
