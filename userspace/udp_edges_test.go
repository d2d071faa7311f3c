//go:build unix

package userspace

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// TestUDPAnsweredSessionIdlesOut: a session whose datagrams have all been
// answered ends one idle timeout after the last, not one reply timeout:
// the reply timeout is only for datagrams still waiting for an answer. So
// with an idle timeout of 100 ms and a reply timeout of 5 s, the session
// is over long before 5 s from the client's first datagram, whether its
// answer came at once or after the idle timeout (a slow first reply, after
// which the event loops must bring the session's timer forward from the
// reply timeout it was set to). The existing timeout tests set both
// timeouts alike, where the difference does not show.
func TestUDPAnsweredSessionIdlesOut(t *testing.T) {
	const idle, reply = 100 * time.Millisecond, 5 * time.Second
	for _, tc := range []struct {
		name  string
		delay time.Duration // the endpoint's own slowness
	}{
		{"answered at once", 0},
		{"slow first reply", 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := udpEchoAfter(t, tc.delay)
			p := newTestProxier(t, Config{UDPIdleTimeout: idle, UDPReplyTimeout: reply})
			name := spn("dns", "", state.UDP)
			mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(be)})
			c := dialUDP(t, proxyAddr(t, p, name))
			// The session cannot start before this, so an expiry at the
			// reply timeout cannot come before sent+reply.
			sent := time.Now()
			if got, err := udpExchangeTimeout(c, []byte("q"), reply); err != nil || string(got) != "q" {
				t.Fatalf("reply: %q, %v", got, err)
			}
			if n := p.Stats().UDPSessionsOpened.Load(); n != 1 {
				t.Fatalf("%d sessions opened, want 1", n)
			}
			// Polled until 1 s before the reply timeout: an ending seen
			// by then is the idle timeout's.
			settleWithin(t, time.Until(sent.Add(reply-time.Second)), "the answered session idled out", func() error {
				if n := p.Stats().UDPSessionsActive.Load(); n != 0 {
					return fmt.Errorf("%d sessions active %v after the client's datagram (idle timeout %v, reply timeout %v)",
						n, time.Since(sent).Round(time.Millisecond), idle, reply)
				}
				return nil
			})
		})
	}
}

// waitSessionsEnded waits until p has opened want UDP sessions and none
// is active any more; the counts of what they did are final then.
func waitSessionsEnded(t *testing.T, p *Proxier, want uint64) {
	t.Helper()
	settle(t, "the session ended", func() error {
		st := p.Stats()
		if opened, active := st.UDPSessionsOpened.Load(), st.UDPSessionsActive.Load(); opened != want || active != 0 {
			return fmt.Errorf("%d sessions opened (want %d), %d active (want 0); %d refusals", opened, want, active, st.UDPRefused.Load())
		}
		return nil
	})
}

// TestUDPRefusalsBoundedByDialAttempts: a session that every endpoint
// refuses tries as many endpoints as TCP makes dial attempts
// (len(DialTimeouts)), no more: with two attempts and three refusing
// endpoints, it ends after the second refusal, its datagram sent twice.
func TestUDPRefusalsBoundedByDialAttempts(t *testing.T) {
	var dead []netip.AddrPort
	for range 3 {
		dead = append(dead, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t))) // nothing listens there
	}
	p := newTestProxier(t, Config{DialTimeouts: []time.Duration{time.Second, time.Second},
		UDPIdleTimeout: time.Minute, UDPReplyTimeout: time.Minute})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(dead...)})
	c := dialUDP(t, proxyAddr(t, p, name))
	if _, err := c.Write([]byte("who")); err != nil {
		t.Fatal(err)
	}
	// The session ends only by a refusal: its timeouts are a minute.
	waitSessionsEnded(t, p, 1)
	st := p.Stats()
	if refused, in := st.UDPRefused.Load(), st.UDPDatagramsIn.Load(); refused != 2 || in != 2 {
		t.Fatalf("%d refusals and %d datagrams sent to endpoints; want 2 and 2: two attempts of three endpoints", refused, in)
	}
}

// TestUDPLoneRefusingEndpointNotRetried: a session whose only endpoint
// refuses ends at that refusal: the failover has no other endpoint to
// move to, and does not send the datagram to the one that refused again.
func TestUDPLoneRefusingEndpointNotRetried(t *testing.T) {
	dead := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t)) // nothing listens there
	p := newTestProxier(t, Config{UDPIdleTimeout: time.Minute, UDPReplyTimeout: time.Minute})
	name := spn("dns", "", state.UDP)
	mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(dead)})
	c := dialUDP(t, proxyAddr(t, p, name))
	if _, err := c.Write([]byte("who")); err != nil {
		t.Fatal(err)
	}
	waitSessionsEnded(t, p, 1)
	st := p.Stats()
	if refused, in := st.UDPRefused.Load(), st.UDPDatagramsIn.Load(); refused != 1 || in != 1 {
		t.Fatalf("%d refusals and %d datagrams sent to endpoints; want 1 and 1: the lone endpoint is not tried again", refused, in)
	}
}

// TestUDPFailoverHoldsFourDatagrams: a session holds at most
// maxPendingDatagrams (4) client datagrams for a failover before the
// first reply. With four sent when its endpoint refuses, it moves them to
// another endpoint, which answers all four; a fifth sent before any reply
// is not held, and the session holds nothing after it, so the refusal
// ends the session and nothing goes to the other endpoint. The refusal is
// of the last datagram: the endpoint read the others and then stopped.
func TestUDPFailoverHoldsFourDatagrams(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sent  int // before the endpoint stops
		moves bool
	}{
		{"four held", maxPendingDatagrams - 1, true},
		{"a fifth settles", maxPendingDatagrams, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stopping, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t))))
			if err != nil {
				t.Fatal(err)
			}
			defer stopping.Close()
			live := startUDPBackend(t, "live")
			p := newTestProxier(t, Config{UDPIdleTimeout: time.Minute, UDPReplyTimeout: time.Minute})
			name := spn("dns", "", state.UDP)
			first := stopping.LocalAddr().(*net.UDPAddr).AddrPort()
			mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(first)})
			c := dialUDP(t, proxyAddr(t, p, name))
			var msgs []string
			buf := make([]byte, 100)
			for i := range tc.sent {
				msgs = append(msgs, fmt.Sprint("q", i))
				if _, err := c.Write([]byte(msgs[i])); err != nil {
					t.Fatal(err)
				}
				stopping.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := stopping.Read(buf); err != nil || string(buf[:n]) != msgs[i] {
					t.Fatalf("the first endpoint got %q, %v; want %q", buf[:n], err, msgs[i])
				}
			}
			// The live endpoint joins; the session stays on the first,
			// which stops answering, and refuses the next datagram.
			mustApply(t, p, state.ServicePort{Name: name, Port: 53, ClusterEndpoints: eps(first, live.addr())})
			stopping.Close()
			msgs = append(msgs, "last")
			if _, err := c.Write([]byte("last")); err != nil {
				t.Fatal(err)
			}
			if !tc.moves {
				waitSessionsEnded(t, p, 1)
				st := p.Stats()
				if refused, in, out := st.UDPRefused.Load(), st.UDPDatagramsIn.Load(), st.UDPDatagramsOut.Load(); refused != 1 || in != uint64(len(msgs)) || out != 0 {
					t.Fatalf("%d refusals, %d datagrams to endpoints, %d to the client; want 1, %d (none sent again) and 0",
						refused, in, out, len(msgs))
				}
				return
			}
			var got []string
			for range msgs {
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, err := c.Read(buf)
				if err != nil {
					t.Fatalf("answers %q, then %v; want the live endpoint's echo of each of %q", got, err, msgs)
				}
				got = append(got, string(buf[:n]))
			}
			if !slices.Equal(got, msgs) {
				t.Fatalf("answers %q, want %q", got, msgs)
			}
			if n := p.Stats().UDPRefused.Load(); n != 1 {
				t.Fatalf("%d refusals, want 1", n)
			}
		})
	}
}

// TestUDPRememberedEndpointNotForItsOwnPort: the endpoint a session had
// on a proxy port that the Service moved from is for the client's next
// session on the new proxy port; a new session on the old port itself,
// which serves on until the portal syncs, is balanced as usual (here, the
// client's session there idled out and it sent again): round robin gives
// it the next endpoint in turn, not the remembered one.
func TestUDPRememberedEndpointNotForItsOwnPort(t *testing.T) {
	a, b := startUDPBackend(t, "a"), startUDPBackend(t, "b")
	// A fake clock for the remembered endpoints, which so stay; the
	// sessions' timeouts go by the real one.
	clock := newFakeClock()
	p := newTestProxier(t, Config{HoldReleasedPorts: true, Clock: clock, UDPIdleTimeout: time.Second, UDPReplyTimeout: time.Second})
	svc := state.ServicePort{Name: spn("ren", "dns", state.UDP), Port: 53, ClusterEndpoints: eps(a.addr(), b.addr())}
	mustApply(t, p, svc)
	p.PortalSynced()
	from := p.ProxyPort(svc.Name)
	c := newMovingClient(t)
	had := c.who(from)
	svc.Name.Port = "domain" // the proxy port moves; from serves on until the portal syncs
	mustApply(t, p, svc)
	if to := p.ProxyPort(svc.Name); to == from || to == 0 {
		t.Fatalf("the rename moved the proxy port from %d to %d; want another", from, to)
	}
	if n := p.moved.len(); n != 1 {
		t.Fatalf("%d moved sessions remembered, want the client's", n)
	}
	waitSessionsEnded(t, p, 1)
	if got := c.who(from); got == had {
		t.Fatalf("a new session on the old proxy port %d went to %s again, the remembered endpoint; want the next in turn", from, got)
	}
}
