//go:build linux

package userspace

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestTCPResetAfterFINDoesNotCutDelivery: a side that sends all it has
// and its FIN, and whose kernel then answers the proxy with a reset
// (here a close with SO_LINGER 0 once the proxy has acknowledged it all;
// in xa57's runs, a keep-alive probe that reached its orphaned socket
// after tcp_fin_timeout), has everything it sent delivered to a slow
// reader, then its EOF, as a direct connection delivers it. Both builds
// took that reset for "the endpoint reset the connection" and reset the
// reader after resetDrain, discarding what the proxy still held (xa57:
// 6,444,872 of 8,000,000 bytes downloaded; 906,808 of 2,999,808
// uploaded).
//
// The large payload is still being read from the sender's socket when the
// reset comes; the small one has been read, and its FIN passed on, and
// waits in the proxy's socket to the reader. A reader that talks on
// after the reset (a pipelined request) has the proxy find the reset by
// writing to the gone socket.
func TestTCPResetAfterFINDoesNotCutDelivery(t *testing.T) {
	for _, tc := range []struct {
		size  int
		talks bool
	}{{1 << 20, false}, {48 << 10, false}, {1 << 20, true}} {
		t.Run(fmt.Sprintf("%d,talks=%v", tc.size, tc.talks), func(t *testing.T) { testResetAfterFIN(t, tc.size, tc.talks) })
	}
}

func testResetAfterFIN(t *testing.T, size int, talks bool) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	small := func(_, _ string, rc syscall.RawConn) error {
		// A small receive buffer: most of the payload waits in the proxy.
		return rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<10) })
	}
	for _, sender := range []string{"endpoint", "client"} {
		t.Run(sender, func(t *testing.T) {
			logs := captureLog(t, "4")
			lc := net.ListenConfig{}
			if sender == "client" {
				lc.Control = small // the endpoint is the slow reader
			}
			ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
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
			p := newTestProxier(t, Config{})
			name := spn("finreset", "", state.TCP)
			mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(ln.Addr().(*net.TCPAddr).AddrPort())})
			d := net.Dialer{}
			if sender == "endpoint" {
				d.Control = small // the client is the slow reader
			}
			nc, err := d.Dial("tcp4", proxyAddr(t, p, name))
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
				t.Fatal("the endpoint got no connection")
			}
			sending, reader, readerName := endpoint, client, "client"
			if sender == "client" {
				sending, reader, readerName = client, endpoint, "endpoint"
			}

			// The sender sends all and its FIN, which the proxy takes into
			// its buffers; the reader, which has not finished, reads
			// nothing yet. Then the sender's socket goes with a reset.
			if _, err := sending.Write(payload); err != nil {
				t.Fatal(err)
			}
			if err := sending.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if err := waitAcked(sending, 10*time.Second); err != nil {
				t.Fatalf("the proxy did not take the %s's %d bytes and FIN: %v", sender, size, err)
			}
			sending.SetLinger(0)
			sending.Close()
			if talks {
				if _, err := reader.Write([]byte("more")); err != nil {
					t.Fatal(err)
				}
			}

			// The reader is slow: it starts reading only after the proxy
			// has had longer than resetDrain to cut it short, as both
			// builds did.
			time.Sleep(resetDrain + time.Second)
			got, err := readUntilError(reader)
			if len(got) != size || !bytes.Equal(got, payload) || err != nil {
				t.Fatalf("the %s read %d of %d bytes (intact: %v), then %v; want all of them and EOF", readerName, len(got), size, bytes.Equal(got, payload[:min(len(got), size)]), err)
			}
			// Nothing more to say to the sender's gone socket: the reader's
			// connection ends (with a reset once it had everything, or
			// when it closes).
			reader.Close()
			settle(t, "the connection ends", func() error {
				klog.Flush()
				if a := p.Stats().TCPActive.Load(); a != 0 {
					return fmt.Errorf("%d connections still active", a)
				}
				if line := logs.lineWith(`"Connection ended"`); !strings.Contains(line, fmt.Sprintf("bytesTo%s=%d", map[string]string{"endpoint": "Client", "client": "Endpoint"}[sender], size)) {
					return fmt.Errorf("ended with %q, want %d bytes passed", line, size)
				}
				return nil
			})
		})
	}
}
