//go:build linux

package userspace

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// timeWaitOn counts this network namespace's IPv4 TCP sockets in
// TIME_WAIT whose local port is port, from /proc/net/tcp.
func timeWaitOn(port uint16) (int, error) {
	want := fmt.Sprintf(":%04X", port)
	return countProcRows("/proc/net/tcp", 4, func(fields []string) bool {
		st, err := strconv.ParseUint(fields[3], 16, 8)
		return err == nil && st == 6 && strings.HasSuffix(fields[1], want) // TCP_TIME_WAIT
	})
}

// TestProxyPortReboundOverTimeWait: a service port removed and added
// again listens on its old proxy port even while connections it served
// there wait in TIME_WAIT (the proxy closed them first: their endpoint
// did), as any server restarted on its port must (SO_REUSEADDR). Without
// it the port could not be listened on for a minute, and, the range's
// only port, the Service went unserved.
func TestProxyPortReboundOverTimeWait(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an endpoint that answers and closes first
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("bye\n"))
			c.Close()
		}
	}()
	port := freePort(t)
	p := newTestProxier(t, Config{PortRange: PortRange{Base: port, Size: 1}})
	svc := state.ServicePort{Name: spn("rebind", "", state.TCP), Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())}
	bye := func() error {
		c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if got, err := io.ReadAll(c); err != nil || string(got) != "bye\n" {
			return fmt.Errorf("read %q, %v; want bye and EOF", got, err)
		}
		return nil
	}
	mustApply(t, p, svc)
	if got := p.ProxyPort(svc.Name); got != port {
		t.Fatalf("proxy port %d, want %d, the range's only one", got, port)
	}
	if err := bye(); err != nil {
		t.Fatal(err)
	}
	settleOne(t, "the proxy's socket of the connection waits in TIME_WAIT", "sockets on port "+strconv.Itoa(int(port))+" in TIME_WAIT", func() (int, error) { return timeWaitOn(port) })
	mustApply(t, p)
	if err := p.Apply(state.NewSnapshot([]state.ServicePort{svc})); err != nil {
		t.Fatalf("Apply with the proxy port's connection in TIME_WAIT: %v", err)
	}
	if got := p.ProxyPort(svc.Name); got != port {
		t.Fatalf("proxy port %d, want %d again", got, port)
	}
	if err := bye(); err != nil {
		t.Fatalf("served again: %v", err)
	}
}
