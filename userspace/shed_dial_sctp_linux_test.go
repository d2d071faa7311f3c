//go:build linux

package userspace

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/sctp/sctptest"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestSCTPDialOnTheSparesNumberIsShed: TestTCPDialOnTheSparesNumberIsShed
// for SCTP, whose dial checks its socket once it has connected. An SCTP
// listener that cannot take an association answers its INIT with an ABORT,
// so the first attempt waits instead on an endpoint whose packets a dummy
// link drops. The spare is lost while it waits (its time, 1 s, leaves the
// slow VM room to get there first), and the next attempt's socket, to an
// endpoint that answers, takes the spare's number: the association is
// shed, the spare is back, and the next client is served.
func TestSCTPDialOnTheSparesNumberIsShed(t *testing.T) {
	sctptest.Require(t)
	stuck := blackholedEndpoint(t)
	_, fine := sctpBackends(t, "fine")
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{time.Second, 5 * time.Second}})
	name := spn("sig", "", state.SCTP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: eps(stuck)})
	addr := sctpProxyAddr(t, p, name)
	c := sctptest.Dial(t, addr, sctp.Options{})
	settleOne(t, "the first attempt connecting to the blackholed endpoint", "associations to "+stuck.String(),
		func() (int, error) { return sctpAssocsTo(stuck) })
	// The next attempt has somewhere to go, and its socket will hold the
	// spare's number.
	mustApply(t, p, state.ServicePort{Name: name, Port: 3868, ClusterEndpoints: append(eps(stuck), fine...)})
	loseSpare(p.shed, syscall.EMFILE)

	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 64)); !isReset(err) {
		t.Fatalf("the client read %d bytes, %v; want its association aborted", n, err)
	}
	if n := p.stats.Shed.Load(); n != 1 {
		t.Errorf("Shed = %d, want 1", n)
	}
	if n := p.stats.SCTPDialGiveUps.Load(); n != 0 {
		t.Errorf("SCTPDialGiveUps = %d, want 0: the association was shed, not given up", n)
	}
	if p.shed.missing.Load() {
		t.Error("the spare was not taken back")
	}
	if got := sctptest.WhoAt(t, addr); got != "fine" {
		t.Fatalf("with the spare back, reached %q, want fine", got)
	}
}

// blackholedEndpoint returns an endpoint whose packets are dropped, so an
// SCTP INIT to it is never answered: its route goes out a dummy link,
// which this test creates and deletes, and which drops what it is given
// (a blackhole route would not do: a connect fails at once on it). Links
// and routes are changed only in the SCTP test VM (SCTP_REQUIRED=1), never
// on a host that happens to have SCTP.
func blackholedEndpoint(t *testing.T) netip.AddrPort {
	t.Helper()
	if os.Getenv("SCTP_REQUIRED") != "1" {
		t.Skip("adds a link and a route: runs only in the SCTP test VM (`make test-sctp`)")
	}
	ep := netip.MustParseAddrPort("198.18.200.1:3999")
	link := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "kupdrop0"}}
	if err := netlink.LinkAdd(link); err != nil {
		t.Fatalf("adding a dummy link: %v", err)
	}
	t.Cleanup(func() {
		if err := netlink.LinkDel(link); err != nil {
			t.Errorf("deleting the dummy link: %v", err)
		}
	})
	// An address of its own, for the source of what is sent out of it.
	src := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 18, 200, 2), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.AddrAdd(link, src); err != nil {
		t.Fatalf("adding %s to the dummy link: %v", src.IPNet, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatalf("setting the dummy link up: %v", err)
	}
	route := &netlink.Route{
		Dst:       &net.IPNet{IP: ep.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)},
		LinkIndex: link.Attrs().Index,
		Scope:     netlink.SCOPE_LINK,
	}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatalf("routing %s out of the dummy link: %v", ep.Addr(), err)
	}
	return ep
}

// sctpAssocsTo counts the SCTP associations, in any state, whose peer
// port is ep's, from /proc/net/sctp/assocs.
func sctpAssocsTo(ep netip.AddrPort) (int, error) {
	// ASSOC SOCK STY SST ST HBKT ASSOC-ID TX_QUEUE RX_QUEUE UID INODE LPORT RPORT ...
	return countProcRows("/proc/net/sctp/assocs", 13, func(fields []string) bool {
		port, err := strconv.Atoi(fields[12])
		return err == nil && port == int(ep.Port())
	})
}
