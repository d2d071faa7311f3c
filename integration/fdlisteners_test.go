//go:build integration && linux

package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// proxyFDs counts the descriptors process pid holds.
func proxyFDs(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// holdThrough connects n idle clients to addr, each echoed once, and
// closes them when the test ends; it fails the test at the first one not
// served.
func holdThrough(t *testing.T, p *proxyProc, addr string, n int) {
	t.Helper()
	for i := range n {
		c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			err = echoes(c)
		}
		if err != nil {
			t.Fatalf("client %d of %d: %v\n%s", i, n, err, tail(p.log(), 30))
		}
	}
}

// TestBinaryServiceAddedUnderConnectionLoad: clients hold about 90% of the
// connections' room, far more descriptor numbers than listeners had below
// their old ceiling, and a Service added then is listened on and serves
// (a handful of service ports are far from the listeners' bound). Both
// builds, under a limit set before the proxy starts. The listeners'
// ceiling was a descriptor number an eighth of the room below the
// connections', which the connections' low numbers pushed every new
// listener past: the new Service got "too many listening sockets" and no
// listener until the clients left.
func TestBinaryServiceAddedUnderConnectionLoad(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) { serviceAddedUnderLoad(t, tc.bin) })
	}
}

func serviceAddedUnderLoad(t *testing.T, bin string) {
	const (
		limit = 512
		conns = limit - 64 // the connections' ceiling
	)
	backend := echoBackend(t)
	np, np2 := freePort(t), freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, loopbackNodePortManifest("held", np, backend))
	p := startWithFDLimit(t, bin, limit, proxyArgs(file)...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)
	pid := p.cmd.Process.Pid
	addr := fmt.Sprintf("127.0.0.1:%d", np)
	holdThrough(t, p, addr, 1) // the loops and pools are set up

	// Two descriptors a client: about 90% of the room left, ending about
	// 24 descriptors short of the connections' ceiling, far above the
	// listeners' old one (an eighth of the room, 64, below it).
	n := (conns - proxyFDs(t, pid) - 24) / 2
	holdThrough(t, p, addr, n)
	held := proxyFDs(t, pid)
	t.Logf("%d clients hold the proxy's descriptors up to %d of %d (connections' ceiling %d)", n+1, held, limit, conns)
	if held < conns-64 {
		t.Fatalf("the clients hold only %d descriptors", held)
	}

	replaceFile(t, file, loopbackNodePortManifest("held", np, backend)+"---\n"+loopbackNodePortManifest("added", np2, backend))
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", np2), 2*time.Second)
		if err == nil {
			err = echoes(c)
			c.Close()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Service added under load is not served: %v\n%s", err, tail(p.log(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if regexp.MustCompile(`too many listening sockets`).MatchString(p.log()) {
		t.Errorf("a listener refused:\n%s", tail(p.log(), 30))
	}
	// The clients already held are still served.
	holdThrough(t, p, addr, 1)
}
