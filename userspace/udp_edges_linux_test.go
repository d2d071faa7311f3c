//go:build linux

package userspace

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestUDPReplyThatCannotBeSentIsDropped: a reply the proxy cannot send to
// its client is counted in UDPDropped (udp_dropped_total). A client that
// broadcasts to 127.255.255.255 reaches a proxy port on the wildcard
// address, and the reply is to leave from the address the datagram was
// sent to, which no socket may send from: Linux's route lookup refuses a
// source that is not a local address (sendmsg fails with ENETUNREACH). The
// broadcast stays on lo, and only the proxy listens on its port; each of
// the port's sockets (one per event loop, SO_REUSEPORT) gets a copy.
func TestUDPReplyThatCannotBeSentIsDropped(t *testing.T) {
	be := startUDPBackend(t, "a")
	p := newTestProxier(t, Config{BindAddress: netip.IPv4Unspecified()})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1) }); err != nil || serr != nil {
		t.Fatalf("SO_BROADCAST: %v, %v", err, serr)
	}
	to := netip.AddrPortFrom(netip.MustParseAddr("127.255.255.255"), p.ProxyPort(name))
	if _, err := c.WriteToUDPAddrPort([]byte("who"), to); err != nil {
		skipOrFail(t, "broadcast to %s: %v", to, err)
	}
	settle(t, "each reply is counted as dropped", func() error {
		st := p.Stats()
		if opened, in, dropped := st.UDPSessionsOpened.Load(), st.UDPDatagramsIn.Load(), st.UDPDropped.Load(); opened == 0 || in != opened || dropped != opened {
			return fmt.Errorf("%d sessions, %d datagrams to the endpoint, %d dropped; want a datagram and a dropped reply for each session", opened, in, dropped)
		}
		return nil
	})
	if n := p.Stats().UDPDatagramsOut.Load(); n != 0 {
		t.Fatalf("%d replies sent to the client, want none: each was dropped", n)
	}
}
