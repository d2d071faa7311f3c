//go:build linux

package userspace

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestTCPEndpointsGoneDuringFailover: a connection whose endpoints all go
// while its first attempt is still connecting, and which then fails, has
// nowhere to go next: it is reset and counted as one without endpoints
// (TCPNoEndpoints), not as given up after its attempts. The attempt is
// held connecting by an endpoint that drops SYNs (its accept queue is
// full); the endpoints are removed while the proxy's SYN is pending, and
// then the endpoint's listener is closed, so that the kernel's
// retransmitted SYN, a second later, is refused.
func TestTCPEndpointsGoneDuringFailover(t *testing.T) {
	stuck, closeListener := synDroppingEndpoint(t)

	// Attempts far longer than the retransmit: the first fails by refusal.
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{20 * time.Second, 20 * time.Second}})
	name := spn("going", "", state.TCP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80, ClusterEndpoints: eps(stuck)})
	c, err := net.Dial("tcp4", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	settleSynSent(t, "the proxy's SYN to the endpoint is pending", stuck)
	mustApply(t, p, state.ServicePort{Name: name, Port: 80}) // the endpoints go
	closeListener()                                          // the retransmitted SYN is refused
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("the client read %v, want a reset", err)
	}
	s := p.Stats().Snapshot()
	if s.TCPNoEndpoints != 1 || s.TCPDialFailures != 1 || s.TCPDialGiveUps != 0 {
		t.Fatalf("no endpoints %d, dial failures %d, give-ups %d; want 1, 1 and 0", s.TCPNoEndpoints, s.TCPDialFailures, s.TCPDialGiveUps)
	}
}

// synDroppingEndpoint is a heldEndpoint that is never let go. Its close,
// which cleanup calls too, closes the listener, after which a
// retransmitted SYN is refused.
func synDroppingEndpoint(t *testing.T) (netip.AddrPort, func()) {
	t.Helper()
	h := newHeldEndpoint(t, "stuck")
	return h.ep, h.refuse
}

// heldEndpoint is an endpoint on 127.0.0.1 that drops SYNs, as one whose
// accept queue is full does (a listener with a backlog of 0 that never
// accepts, and one connection already queued), until the test lets it go
// (serve) or closes it (refuse). A connect held there goes on
// retransmitting its SYN, 1 s, 3 s, 7 s... after the first; the first
// retransmit after serve connects, the first after refuse is refused.
type heldEndpoint struct {
	name string
	ep   netip.AddrPort
	ln   net.Listener
	done chan struct{} // closed once serve's goroutine has ended
}

func newHeldEndpoint(t *testing.T, name string) *heldEndpoint {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close() // ln has its own descriptor
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	h := &heldEndpoint{name: name, ep: ln.Addr().(*net.TCPAddr).AddrPort(), ln: ln}
	filler, err := net.Dial("tcp4", h.ep.String()) // fills the accept queue
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		filler.Close()
		ln.Close()
		if h.done != nil {
			<-h.done
		}
	})
	return h
}

// refuse closes the endpoint's listener: SYNs to it are refused from now
// on.
func (h *heldEndpoint) refuse() { h.ln.Close() }

// settleSynSent waits until one socket of this network namespace is
// connecting (SYN_SENT) to ep's port.
func settleSynSent(t *testing.T, what string, ep netip.AddrPort) {
	t.Helper()
	settleOne(t, what, "connections to "+ep.String()+" in SYN_SENT", func() (int, error) { return synSentTo(ep) })
}

// settleOne waits, as settle does, until count says there is exactly one
// of what it counts, which of names in the error.
func settleOne(t *testing.T, what, of string, count func() (int, error)) {
	t.Helper()
	settle(t, what, func() error {
		n, err := count()
		if err == nil && n != 1 {
			err = fmt.Errorf("%d %s, want 1", n, of)
		}
		return err
	})
}

// synSentTo counts this network namespace's IPv4 TCP sockets connecting
// (SYN_SENT) to ep's port, from /proc/net/tcp.
func synSentTo(ep netip.AddrPort) (int, error) {
	// The port alone: the address is written in the host's byte order.
	want := fmt.Sprintf(":%04X", ep.Port())
	return countProcRows("/proc/net/tcp", 4, func(fields []string) bool {
		st, err := strconv.ParseUint(fields[3], 16, 8)
		return err == nil && st == 2 && strings.HasSuffix(fields[2], want) // TCP_SYN_SENT
	})
}

// countProcRows counts the rows of a /proc table (a header line, then
// space-separated fields) that have at least minFields fields and match.
func countProcRows(path string, minFields int, match func(fields []string) bool) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= minFields && match(fields) {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return n, nil
}
