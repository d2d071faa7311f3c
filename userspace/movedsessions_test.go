//go:build unix

package userspace

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// movingClient is a UDP client that keeps its source port while the
// portal moves it from one proxy port to another, as a client whose
// conntrack entry the portal's sync deleted: its next datagram is
// redirected to the new proxy port.
type movingClient struct {
	t    *testing.T
	conn *net.UDPConn
	buf  []byte
}

func newMovingClient(t *testing.T) *movingClient {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &movingClient{t: t, conn: conn, buf: make([]byte, 1500)}
}

// who asks the endpoint behind proxy port port for its name.
func (c *movingClient) who(port uint16) string {
	c.t.Helper()
	to := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	if _, err := c.conn.WriteToUDPAddrPort([]byte("who"), to); err != nil {
		c.t.Fatal(err)
	}
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, from, err := c.conn.ReadFromUDPAddrPort(c.buf)
	if err != nil {
		c.t.Fatalf("UDP to %s: %v", to, err)
	}
	if from != to {
		c.t.Fatalf("UDP to %s: reply from %s", to, from)
	}
	return string(c.buf[:n])
}

// TestUDPSessionKeepsEndpointWhenProxyPortMoves: an edit that moves a
// service port's redirected traffic to another proxy port (a renamed
// port, externalTrafficPolicy Local to Cluster or back) keeps a live UDP
// client on its endpoint, as kube-proxy's conntrack entry keeps such a
// flow on its pod. The portal's sync deletes the old mapping's conntrack
// entries, and the client's next datagram reaches the new proxy port:
// it used to open a session there by round robin, often to another
// endpoint, once the socket given up closed (PortalSynced) and ended its
// session. The endpoint is kept only where the new port's balancer may
// use it (a Local policy keeps the clients of other nodes' endpoints
// from them).
func TestUDPSessionKeepsEndpointWhenProxyPortMoves(t *testing.T) {
	var all []netip.AddrPort
	for i := range 4 {
		all = append(all, startUDPBackend(t, fmt.Sprint("u", i)).addr())
	}
	local := eps(all[0], all[1]) // this node's
	nodePortSvc := func(name state.ServicePortName, externalLocal bool) state.ServicePort {
		return state.ServicePort{Name: name, Port: 53, NodePort: 30053, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.53")},
			ClusterEndpoints: eps(all...), LocalEndpoints: local, ExternalLocal: externalLocal}
	}
	// Clients on loopback are not this host's (whose external traffic
	// goes to every endpoint), and there are more than endpoints, but not
	// a multiple of them, so that round robin cannot give each its
	// endpoint back by chance.
	localAddrs := func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil }
	const clients = 6
	for _, tc := range []struct {
		name string
		// before serves the Service and returns the proxy port its
		// clients use; after edits it and returns the one they move to.
		before, after func(*Proxier) uint16
		// allowed are the endpoints clients may keep after the move;
		// nil: every one.
		allowed map[string]bool
	}{{
		name: "service port renamed",
		before: func(p *Proxier) uint16 {
			mustApply(t, p, state.ServicePort{Name: spn("ren", "dns", state.UDP), Port: 53, ClusterEndpoints: eps(all...)})
			return p.ProxyPort(spn("ren", "dns", state.UDP))
		},
		after: func(p *Proxier) uint16 {
			mustApply(t, p, state.ServicePort{Name: spn("ren", "domain", state.UDP), Port: 53, ClusterEndpoints: eps(all...)})
			return p.ProxyPort(spn("ren", "domain", state.UDP))
		},
	}, {
		name: "externalTrafficPolicy Local to Cluster",
		before: func(p *Proxier) uint16 {
			mustApply(t, p, nodePortSvc(spn("etp", "dns", state.UDP), true))
			return p.ExternalProxyPort(spn("etp", "dns", state.UDP))
		},
		after: func(p *Proxier) uint16 {
			mustApply(t, p, nodePortSvc(spn("etp", "dns", state.UDP), false))
			return p.ExternalProxyPort(spn("etp", "dns", state.UDP))
		},
	}, {
		name: "externalTrafficPolicy Cluster to Local",
		before: func(p *Proxier) uint16 {
			mustApply(t, p, nodePortSvc(spn("etp", "dns", state.UDP), false))
			return p.ExternalProxyPort(spn("etp", "dns", state.UDP))
		},
		after: func(p *Proxier) uint16 {
			mustApply(t, p, nodePortSvc(spn("etp", "dns", state.UDP), true))
			return p.ExternalProxyPort(spn("etp", "dns", state.UDP))
		},
		allowed: map[string]bool{"u0": true, "u1": true},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			logs := captureLog(t, "4")
			p := newTestProxier(t, Config{HoldReleasedPorts: true, UDPIdleTimeout: time.Minute, LocalAddrs: localAddrs})
			from := tc.before(p)
			p.PortalSynced()
			// The last client starts after the edit, on the old proxy
			// port, which the portal redirects to until it syncs.
			cs := make([]*movingClient, clients)
			had := make([]string, clients)
			for i := range clients - 1 {
				cs[i] = newMovingClient(t)
				had[i] = cs[i].who(from)
			}
			to := tc.after(p)
			if to == from || to == 0 {
				t.Fatalf("the edit moved the proxy port from %d to %d; want another", from, to)
			}
			cs[clients-1] = newMovingClient(t)
			had[clients-1] = cs[clients-1].who(from)
			for i, c := range cs {
				if got := c.who(from); got != had[i] {
					t.Fatalf("client %d: %s before the portal synced, want %s still", i, got, had[i])
				}
			}
			p.PortalSynced() // the rules point at the new port; the old closes if given up
			kept := 0
			for i, c := range cs {
				got := c.who(to)
				switch {
				case tc.allowed == nil || tc.allowed[had[i]]:
					if got != had[i] {
						t.Errorf("client %d moved from %s to %s with the proxy port", i, had[i], got)
					}
					kept++
				case !tc.allowed[got]:
					t.Errorf("client %d reached %s, which the new policy keeps it from", i, got)
				}
				if again := c.who(to); again != got {
					t.Errorf("client %d: %s, then %s", i, got, again)
				}
			}
			if kept == 0 {
				t.Fatal("no client had an endpoint it may keep")
			}
			if l := logs.lineWith("kept the endpoint"); !strings.Contains(l, `"Chose endpoint"`) {
				t.Errorf("no -v=4 line says a session kept its endpoint; got %q", l)
			}
		})
	}
}

// TestMovedSessionsExpire: the endpoints of the sessions a moved proxy
// port had are remembered a little past the sessions' own timeout, then
// forgotten, and never more than maxMoved of them.
func TestMovedSessionsExpire(t *testing.T) {
	clock := newFakeClock()
	u := startUDPBackend(t, "u")
	p := newTestProxier(t, Config{HoldReleasedPorts: true, Clock: clock, UDPIdleTimeout: time.Minute})
	svc := state.ServicePort{Name: spn("ren", "dns", state.UDP), Port: 53, ClusterEndpoints: eps(u.addr())}
	mustApply(t, p, svc)
	p.PortalSynced()
	from := p.ProxyPort(svc.Name)
	for range 3 {
		newMovingClient(t).who(from)
	}
	svc.Name.Port = "domain"
	mustApply(t, p, svc)
	p.PortalSynced()
	if n := p.moved.len(); n != 3 {
		t.Fatalf("%d moved sessions remembered, want 3", n)
	}
	clock.Step(time.Minute)
	p.PortalSynced()
	if n := p.moved.len(); n != 3 {
		t.Fatalf("%d moved sessions remembered within their timeout, want 3", n)
	}
	clock.Step(movedGrace + time.Second)
	p.PortalSynced()
	if n := p.moved.len(); n != 0 {
		t.Fatalf("%d moved sessions remembered past their timeout and %v, want none", n, movedGrace)
	}

	var m movedSessions
	now := clock.Now()
	ep := u.addr()
	for i := range maxMoved + 10 {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 1000)
		m.remember(svc.Name, []liveSession{{client: client, endpoint: ep, left: time.Second}}, 1, now)
	}
	if n := m.len(); n != maxMoved {
		t.Fatalf("%d moved sessions remembered, want at most %d", n, maxMoved)
	}
	m.sweep(now.Add(time.Second + movedGrace))
	if n := m.len(); n != 0 {
		t.Fatalf("%d moved sessions remembered after they expired, want none", n)
	}
}
