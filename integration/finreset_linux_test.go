//go:build integration && linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestBinaryKeepAliveAfterFINDoesNotCutDelivery: what a side sent before
// its FIN reaches a slow reader whole, then its EOF, after the proxy's
// keep-alive probe (30 s idle) has met the sender's closed socket, gone
// once tcp_fin_timeout (1 s in the test's namespace) expired it, and the
// sender's kernel answered with a reset. Both builds took that reset for
// "the endpoint reset the connection" and reset the reader 2 s later,
// with what the proxy still held (xa57: 6,444,872 of 8,000,000 bytes
// downloaded; 906,808 of 2,999,808 uploaded). Everything runs in one
// network namespace: the proxy, the endpoint and the client on its
// loopback. About 40 s.
func TestBinaryKeepAliveAfterFINDoesNotCutDelivery(t *testing.T) {
	requireRoot(t)
	for _, tc := range bothBuilds(t) {
		for _, sender := range []string{"endpoint", "client"} {
			t.Run(tc.name+"/"+sender, func(t *testing.T) {
				t.Parallel()
				keepAliveAfterFIN(t, tc.bin, sender)
			})
		}
	}
}

func keepAliveAfterFIN(t *testing.T, bin, sender string) {
	const size = 1 << 20
	payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	ns := newNetns(t, "finreset")
	ns.mustRun(t, "sysctl", "-q", "-w", "net.ipv4.tcp_fin_timeout=1")
	small := func(_, _ string, rc syscall.RawConn) error {
		// A small receive buffer: most of the payload waits in the proxy.
		return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<10) })
	}
	var ln net.Listener
	inNetns(t, ns, func() (err error) {
		lc := net.ListenConfig{}
		if sender == "client" {
			lc.Control = small // the endpoint is the slow reader
		}
		ln, err = lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
		return err
	})
	defer ln.Close()
	accepted := make(chan *net.TCPConn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c.(*net.TCPConn)
		}
	}()
	const np = 30080 // in the test's own namespace
	endpointPort := ln.Addr().(*net.TCPAddr).Port
	file := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, file, loopbackNodePortManifest("finreset", np, endpointPort))
	p := startCommand(t, "ip", append([]string{"netns", "exec", string(ns), bin}, append(proxyArgs(file), "-v=4")...)...)
	p.waitLog(0, `"Serving".*via="node-port"`, 1, 20*time.Second)

	var client *net.TCPConn
	inNetns(t, ns, func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		if sender == "endpoint" {
			d.Control = small // the client is the slow reader
		}
		nc, err := d.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", np))
		if err == nil {
			client = nc.(*net.TCPConn)
		}
		return err
	})
	defer client.Close()
	var endpoint *net.TCPConn
	select {
	case endpoint = <-accepted:
		defer endpoint.Close()
	case <-time.After(5 * time.Second):
		t.Fatalf("the endpoint got no connection\n%s", tail(p.log(), 20))
	}
	sending, reader, readerName := endpoint, client, "client"
	// The proxy's socket to the sender, whose FIN it has: in CLOSE_WAIT
	// until the sender's reset.
	filter := fmt.Sprintf("dport = :%d", endpointPort)
	if sender == "client" {
		sending, reader, readerName = client, endpoint, "endpoint"
		filter = fmt.Sprintf("sport = :%d", np)
	}

	// The sender sends all, half-closes, and once the proxy has taken
	// everything closes normally: its orphaned socket waits in FIN_WAIT2
	// for the proxy's FIN, which does not come while the reader reads
	// nothing, and is gone 1 s later.
	if _, err := sending.Write(payload); err != nil {
		t.Fatal(err)
	}
	if err := sending.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := waitAcked(sending, 10*time.Second); err != nil {
		t.Fatalf("the proxy did not take the %s's %d bytes and FIN: %v", sender, size, err)
	}
	sending.Close()

	// The proxy's keep-alive probe reaches the gone socket after 30 s of
	// silence and brings the reset: its socket leaves CLOSE_WAIT.
	deadline := time.Now().Add(45 * time.Second)
	for {
		out := ns.mustRun(t, "ss", "-Htn", "state", "close-wait", filter)
		if strings.TrimSpace(out) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy's socket to the %s is still in CLOSE_WAIT after 45 s: %s\n%s", sender, out, tail(p.log(), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The reader is slow: it starts reading only after the proxy has had
	// longer than its 2 s drain to cut it short, as both builds did.
	time.Sleep(3 * time.Second)
	reader.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got bytes.Buffer
	_, err := io.Copy(&got, reader)
	if got.Len() != size || !bytes.Equal(got.Bytes(), payload) || err != nil {
		t.Fatalf("the %s read %d of %d bytes, then %v; want all of them and EOF\n%s", readerName, got.Len(), size, err, tail(p.log(), 20))
	}
	reader.Close()
	p.waitLog(0, `"Connection ended".*bytesTo`+map[string]string{"endpoint": "Client", "client": "Endpoint"}[sender]+fmt.Sprintf("=%d", size), 1, 10*time.Second)
}

// inNetns runs f in ns (see runInNetns); the test fails on its error.
func inNetns(t *testing.T, ns netns, f func() error) {
	t.Helper()
	if err := runInNetns(ns, f); err != nil {
		t.Fatal(err)
	}
}

// runInNetns runs f on a thread of its own moved into ns, so the sockets
// f makes are ns's (a socket stays in the namespace it was made in); the
// thread is moved back after, or, if it cannot be, stays locked and ends
// with its goroutine.
func runInNetns(ns netns, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer self.Close()
		target, err := os.Open("/run/netns/" + string(ns))
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		err = f()
		if serr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); serr != nil {
			errc <- errors.Join(err, serr)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// waitAcked waits, bounded by d, until the peer has acknowledged
// everything written to c, its FIN included.
func waitAcked(c *net.TCPConn, d time.Duration) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(d)
	for {
		var unacked int
		var ierr error
		if err := rc.Control(func(fd uintptr) { unacked, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil {
			return err
		}
		if ierr != nil {
			return ierr
		}
		if unacked == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d bytes still unacknowledged after %v", unacked, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
