//go:build unix && (!linux || goroutines)

package userspace

import (
	"bufio"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestClosingListenerServesQueuedConnections: connections the kernel
// queued on a listening socket that its accept loop did not get round to
// are served when the socket closes, not reset: their clients' connects
// had succeeded. The socket here is one of the service port's whose
// accept loop never ran, so every connection is still queued at the
// close, as behind an accept loop that is slow to be scheduled.
func TestClosingListenerServesQueuedConnections(t *testing.T) {
	be := startTCPBackend(t, "a")
	p := newTestProxier(t, Config{})
	name := spn("queued", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(be.addr())})
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	sp, noLoop := withoutAcceptLoop(t, p, name, ln)
	l := &tcpListener{sp: sp, role: roleProxyPort, addr: netip.MustParseAddr("127.0.0.1"), ln: ln, done: noLoop}

	const n = 5
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range n {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	l.close()
	for i, c := range clients {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "a\n" {
			t.Errorf("client %d, queued at the close: %q, %v; want it served", i, got, err)
		}
	}
	if a := p.stats.TCPAccepted.Load(); a != n {
		t.Errorf("%d connections counted as accepted, want %d", a, n)
	}
}
