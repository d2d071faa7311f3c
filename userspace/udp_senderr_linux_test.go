//go:build linux

package userspace

import (
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestUDPSendErrorDropsTheDatagramOnly: a client datagram the kernel will
// not send to the endpoint (here an OUTPUT DROP rule, which makes the
// send fail with EPERM, as a host firewall would) is counted as dropped,
// not as sent, and the session goes on: once the rule is gone, the next
// datagram of the same session is answered. Both builds.
func TestUDPSendErrorDropsTheDatagramOnly(t *testing.T) {
	if !inOwnNetns(t) {
		return
	}
	be := startUDPBackendOn(t, "a", raceFineAddr+":0")
	p := newTestProxier(t, Config{UDPIdleTimeout: time.Minute})
	name := spn("senderr", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be.addr())})
	c, err := net.Dial("udp", proxyAddr(t, p, name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uc := c.(*net.UDPConn)
	if got, err := udpExchangeTimeout(uc, []byte("one"), 2*time.Second); err != nil || string(got) != "one" {
		t.Fatalf("before the rule: %q, %v", got, err)
	}

	rule := []string{"OUTPUT", "-d", be.addr().Addr().String(), "-p", "udp", "--dport", strconv.Itoa(int(be.addr().Port())), "-j", "DROP"}
	iptables := func(op string) {
		t.Helper()
		if out, err := exec.Command("iptables", append([]string{op}, rule...)...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %s %s: %v: %s", op, strings.Join(rule, " "), err, out)
		}
	}
	iptables("-I")
	if got, err := udpExchangeTimeout(uc, []byte("two"), 300*time.Millisecond); err == nil {
		t.Fatalf("with the endpoint's datagrams dropped: answered %q", got)
	}
	st := p.Stats()
	settle(t, "the datagram counted as dropped", func() error {
		if d := st.UDPDropped.Load(); d != 1 {
			return errorf("%d dropped, want 1", d)
		}
		return nil
	})
	if n := st.UDPDatagramsIn.Load(); n != 1 {
		t.Errorf("%d datagrams counted as sent to the endpoint, want 1: the dropped one counted as sent", n)
	}

	iptables("-D")
	if got, err := udpExchangeTimeout(uc, []byte("three"), 2*time.Second); err != nil || string(got) != "three" {
		t.Fatalf("after the rule: %q, %v; want the session to go on", got, err)
	}
	if o, a := st.UDPSessionsOpened.Load(), st.UDPSessionsActive.Load(); o != 1 || a != 1 {
		t.Errorf("%d sessions opened, %d active; want the one, still open", o, a)
	}
	// The goroutine build counts a datagram once its write has returned,
	// and the reply, read on another goroutine, may reach the client
	// first (seen in make check, under -race, and on a loaded machine).
	settle(t, "the datagram after the rule counted as sent", func() error {
		if n := st.UDPDatagramsIn.Load(); n != 2 {
			return errorf("%d datagrams counted as sent to the endpoint, want 2", n)
		}
		return nil
	})
}
