//go:build unix

package userspace

import (
	"bufio"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestAcceptCloexecIsCloseOnExec: a connection the shedder accepts is
// close-on-exec, so that a command started meanwhile (iptables-restore)
// cannot hold it open past its reset.
func TestAcceptCloexecIsCloseOnExec(t *testing.T) {
	ln, rc := listenForShed(t)
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitQueued(t, rc)
	var nfd int
	var aerr error
	if err := rc.Control(func(fd uintptr) { nfd, aerr = acceptCloexec(int(fd)) }); err != nil || aerr != nil {
		t.Fatalf("accept: %v, %v", err, aerr)
	}
	defer unix.Close(nfd)
	flags, err := unix.FcntlInt(uintptr(nfd), unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.FD_CLOEXEC == 0 {
		t.Error("the accepted connection is not close-on-exec")
	}
}

// atDescriptorLimit runs f with the soft RLIMIT_NOFILE lowered to the
// lowest free descriptor number, so that every descriptor opened fails
// with EMFILE until one below is closed, and restores the limit after.
// f must be short and must not fail the test: the testing package's own
// work may need a descriptor.
func atDescriptorLimit(t *testing.T, f func()) {
	t.Helper()
	var was syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
		t.Skipf("getrlimit: %v", err)
	}
	low := was
	setLimit(&low.Cur, lowestFreeFD(t))
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
			t.Errorf("RLIMIT_NOFILE not restored: %v", err)
		}
	}()
	f()
}

// setLimit sets a limit of a syscall.Rlimit, an int64 on some systems
// (FreeBSD) and a uint64 on others.
func setLimit[T int64 | uint64](limit *T, n int) { *limit = T(n) }

// TestShedFDAtTheDescriptorLimit: with every descriptor taken, a waiting
// client is accepted on the spare's number and reset, and the spare comes
// back; with no spare, the client cannot be accepted, and shedFD says so
// (shedFailed, for its caller to back off), not that none waited.
func TestShedFDAtTheDescriptorLimit(t *testing.T) {
	ln, rc := listenForShed(t)
	s := newShedder()
	defer s.close()
	s.pause = func() {}
	dial := func() net.Conn {
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		waitQueued(t, rc)
		return c
	}
	shed := func() shedResult {
		r := shedNone
		if err := rc.Control(func(fd uintptr) { r = s.shedFD(int(fd)) }); err != nil {
			t.Fatal(err)
		}
		return r
	}

	first := dial()
	var r shedResult
	var missing bool
	atDescriptorLimit(t, func() { r = shed(); missing = s.missing.Load() })
	if r != shedOne || missing {
		t.Fatalf("at the limit with the spare in hand: shedFD = %v, spare missing %v; want shedOne and the spare back", r, missing)
	}
	first.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := first.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("the shed client read %v, want a reset", err)
	}

	dial()
	dropSpare(s) // the spare is gone
	atDescriptorLimit(t, func() { r = shed(); missing = s.missing.Load() })
	if r != shedFailed || !missing {
		t.Fatalf("at the limit without a spare: shedFD = %v, spare missing %v; want shedFailed, the spare missing", r, missing)
	}
	if !s.retake() || s.spare == nil {
		t.Fatal("the spare not taken back once descriptors were free")
	}
	if r := shed(); r != shedOne {
		t.Fatalf("with the spare back: shedFD = %v, want shedOne", r)
	}
}

// TestResetConnectionsLeaving: the connections that reached a service
// address the next snapshot no longer has are reset (the bind portal is
// about to take the address off the host); those to an address it keeps
// go on.
func TestResetConnectionsLeaving(t *testing.T) {
	const goneIP, keptIP = "127.0.0.21", "127.0.0.22"
	for _, ip := range []string{goneIP, keptIP} {
		ln, err := net.Listen("tcp4", ip+":0")
		if err != nil {
			skipOrFail(t, "cannot listen on %s: %v", ip, err)
		}
		ln.Close()
	}
	be := startTCPBackend(t, "a")
	port := freePort(t, goneIP, keptIP)
	p := newTestProxier(t, Config{ServeFrontends: true, DisableProxyPorts: true})
	svc := func(name, ip string) state.ServicePort {
		return state.ServicePort{Name: spn(name, "", state.TCP), Port: port,
			ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, ClusterEndpoints: eps(be.addr())}
	}
	gone, kept := svc("gone", goneIP), svc("kept", keptIP)
	mustApply(t, p, gone, kept)
	connect := func(ip string) (net.Conn, *bufio.Reader) {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort(ip, strconv.Itoa(int(port))), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		r := bufio.NewReader(c)
		if greeting, err := r.ReadString('\n'); err != nil || greeting != "a\n" {
			t.Fatalf("via %s: greeted %q, %v", ip, greeting, err)
		}
		return c, r
	}
	toGone, _ := connect(goneIP)
	toKept, keptReader := connect(keptIP)

	p.ResetConnectionsLeaving(state.NewSnapshot([]state.ServicePort{kept}))
	toGone.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := toGone.Read(make([]byte, 1)); !isReset(err) {
		t.Errorf("the connection to the address going read %d bytes, %v; want a reset", n, err)
	}
	if _, err := toKept.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	toKept.SetReadDeadline(time.Now().Add(5 * time.Second))
	if echo, err := keptReader.ReadString('\n'); err != nil || echo != "ping\n" {
		t.Errorf("the connection to the address kept: %q, %v; want it served", echo, err)
	}
}

// TestMovedSessionsOnlyForARedirectingPortal: the endpoints of a released
// proxy port's UDP sessions are remembered only for a redirecting portal
// (HoldReleasedPorts), whose sync moves its clients to the new port; with
// none, a client that turns to another proxy port chose to, and its
// session there is balanced as any new one.
func TestMovedSessionsOnlyForARedirectingPortal(t *testing.T) {
	u := startUDPBackend(t, "u")
	for _, hold := range []bool{false, true} {
		p := newTestProxier(t, Config{HoldReleasedPorts: hold, UDPIdleTimeout: time.Minute})
		svc := state.ServicePort{Name: spn("ren", "dns", state.UDP), Port: 53, ClusterEndpoints: eps(u.addr())}
		mustApply(t, p, svc)
		p.PortalSynced()
		if got := newMovingClient(t).who(p.ProxyPort(svc.Name)); got != "u" {
			t.Fatalf("reached %q", got)
		}
		svc.Name.Port = "domain" // renamed: another service port, another proxy port
		mustApply(t, p, svc)
		p.PortalSynced()
		want := 0
		if hold {
			want = 1
		}
		if n := p.moved.len(); n != want {
			t.Errorf("HoldReleasedPorts %v: %d moved sessions remembered, want %d", hold, n, want)
		}
	}
}
