//go:build integration && linux

package integration

import (
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

// TestBinaryHealthzSlowlorisLeavesTheDataPlaneItsDescriptors: under
// RLIMIT_NOFILE 256, one client holding 400 connections to /healthz that
// send headers that never end (reopening each one closed) takes neither
// the data plane's descriptors nor /healthz's answers: the proxy holds
// its few health connections, well under the descriptors kept in reserve,
// new clients of a Service are served, and /healthz answers within a
// kubelet probe's 1 s from another address. The health server took every
// descriptor: the data plane shed its clients ("Out of file descriptors")
// and /healthz answered in 2 s.
func TestBinaryHealthzSlowlorisLeavesTheDataPlaneItsDescriptors(t *testing.T) {
	const (
		limit   = 256
		reserve = 64 // userspace's fdReserveMax: a quarter of 256
		slow    = 400
	)
	backend := echoBackend(t)
	np, hp := freePort(t), freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, loopbackNodePortManifest("slow", np, backend))
	p := startWithFDLimit(t, proxyBin, limit, append(proxyArgs(file), fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hp))...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", hp)
	waitAnswers(t, p, healthz)
	fds := func() int {
		entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(entries)
	}
	before := fds()

	// The slow client, from 127.0.0.1.
	addr := fmt.Sprintf("127.0.0.1:%d", hp)
	var closed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	for range slow {
		wg.Go(func() {
			for {
				c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
				if err == nil {
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
	// Until the proxy has dealt with them: it closed most, or it holds
	// every descriptor the data plane leaves.
	deadline := time.Now().Add(10 * time.Second)
	for closed.Load() < slow/2 && fds() < limit-reserve {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, %d slow connections closed and %d descriptors open", closed.Load(), fds())
		}
		time.Sleep(10 * time.Millisecond)
	}

	kubelet := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	most := 0
	for i := range 20 {
		n := fds()
		most = max(most, n)
		start := time.Now()
		resp, err := kubelet.Get(healthz)
		if err != nil {
			t.Fatalf("probe %d: %v after %v (%d descriptors open)", i, err, time.Since(start), n)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("probe %d: %s", i, resp.Status)
		}
		c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", np), 2*time.Second)
		if err == nil {
			err = echoes(c)
			c.Close()
		}
		if err != nil {
			t.Fatalf("a new client of the Service, %d: %v (%d descriptors open)", i, err, n)
		}
	}
	t.Logf("%d descriptors open before the slow client, at most %d under it; %d slow connections closed", before, most, closed.Load())
	// The health server's 12, a data-plane client's two, and room.
	if most > before+24 {
		t.Errorf("%d descriptors open under the slow client, %d before: the health server holds more than its few connections", most, before)
	}
	if strings.Contains(p.log(), "Out of file descriptors") {
		t.Errorf("the data plane ran out of descriptors:\n%s", tail(p.log(), 20))
	}
}

// holdSlow sends c a request header a line at a time, never ending it,
// until the server closes c or stop.
func holdSlow(c net.Conn, stop <-chan struct{}) {
	defer c.Close()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
		return
	}
	buf := make([]byte, 512)
	for {
		select {
		case <-stop:
			return
		default:
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Read(buf); err == nil || !os.IsTimeout(err) {
			return
		}
		if _, err := io.WriteString(c, "X-a: b\r\n"); err != nil {
			return
		}
	}
}
