//go:build integration && linux

package integration

import (
	"fmt"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestBinaryResetAfterHalfClose: a side that sends its request and FIN and
// then gives up with a reset has the reset passed on at once, while the
// other side, still working on its answer, sends nothing; and the same the
// other way round. The kernel's NAT does so, and the event loops did; the
// goroutine build passed the reset on only once the silent side next sent
// something (or at --tcp-half-close-timeout, 5 minutes), so an endpoint
// kept working for a client that was gone.
func TestBinaryResetAfterHalfClose(t *testing.T) {
	for _, tc := range bothBuilds(t) {
		t.Run(tc.name, func(t *testing.T) {
			for _, resetter := range []string{"client", "endpoint"} {
				t.Run(resetter, func(t *testing.T) { resetAfterHalfClose(t, tc.bin, resetter) })
			}
		})
	}
}

func resetAfterHalfClose(t *testing.T, bin, resetter string) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *net.TCPConn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c.(*net.TCPConn)
		}
	}()
	np := freePort(t)
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, loopbackNodePortManifest("halfreset", np, ln.Addr().(*net.TCPAddr).Port))
	p := startCommand(t, bin, append(proxyArgs(file), "-v=4")...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)

	nc, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", np), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	client := nc.(*net.TCPConn)
	defer client.Close()
	var endpoint *net.TCPConn
	select {
	case endpoint = <-accepted:
		defer endpoint.Close()
	case <-time.After(5 * time.Second):
		t.Fatalf("the endpoint got no connection\n%s", tail(p.log(), 20))
	}
	resetting, silent := client, endpoint
	if resetter == "endpoint" {
		resetting, silent = endpoint, client
	}
	if _, err := resetting.Write([]byte("req")); err != nil {
		t.Fatal(err)
	}
	if err := resetting.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// Once the silent side has the FIN, the proxy has passed it on.
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(silent); err != nil || string(got) != "req" {
		t.Fatalf("the %s's request arrived as %q, %v; want req and its FIN", resetter, got, err)
	}
	start := time.Now()
	resetting.SetLinger(0)
	resetting.Close()

	const limit = 3 * time.Second
	for {
		st, err := tcpState(silent)
		if err != nil {
			t.Fatal(err)
		}
		if st == unix.BPF_TCP_CLOSE {
			break
		}
		if time.Since(start) > limit {
			t.Fatalf("the silent side is in TCP state %d %v after the %s's reset (8: CLOSE_WAIT), want closed by a reset\n%s",
				st, limit, resetter, tail(p.log(), 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.waitLog(0, `"Connection ended".*reset=true reason="the `+resetter+` reset the connection"`, 1, 5*time.Second)
}

// tcpState returns the kernel's TCP state of c (unix.BPF_TCP_*).
func tcpState(c *net.TCPConn) (uint8, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var st uint8
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		if info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); ierr == nil {
			st = info.State
		}
	}); err != nil {
		return 0, err
	}
	return st, ierr
}
