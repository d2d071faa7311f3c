package userspace

import (
	"net/netip"
	"slices"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// What the proxier serves and has carried, read by the debug views,
// metrics and the portals.

// Listener describes one socket the proxier listens on.
type Listener struct {
	Service state.ServicePortName
	Addr    netip.AddrPort
	// Role is "proxy-port", "external-proxy-port", "node-port", "frontend"
	// or "external-frontend"; a proxy port's has givenUpRole after it while
	// it serves on until the portal no longer redirects to it (see
	// Config.HoldReleasedPorts).
	Role string
}

// givenUpRole marks the Role of a proxy-port socket given up (see Listener).
const givenUpRole = ", given up until the portal syncs"

// Activity is what one service port has carried since it was first served.
type Activity struct {
	Connections     uint64 // TCP connections (SCTP associations) proxied to an endpoint
	OpenConnections int64
	GaveUp          uint64 // TCP connections reset after every dial attempt failed
	UDPSessions     uint64 // UDP sessions opened
	OpenUDPSessions int64
}

// Activity returns the activity of every service port served.
func (p *Proxier) Activity() map[state.ServicePortName]Activity {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[state.ServicePortName]Activity, len(p.services))
	for name, sp := range p.services {
		out[name] = Activity{
			Connections: sp.connsProxied.Load(), OpenConnections: sp.connsActive.Load(), GaveUp: sp.connsGaveUp.Load(),
			UDPSessions: sp.udpOpened.Load(), OpenUDPSessions: sp.udpSessions.Load(),
		}
	}
	return out
}

// Unsupported returns why service port name is not served here (its
// protocol is not: SCTP on a kernel without it), or nil.
func (p *Proxier) Unsupported(name state.ServicePortName) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.skipped[name]
}

// ProxyPort returns the proxy port serving name, or 0 if there is none.
func (p *Proxier) ProxyPort(name state.ServicePortName) uint16 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sp, ok := p.services[name]; ok {
		return sp.proxyPort
	}
	return 0
}

// ExternalProxyPort returns the proxy port that redirected node-port,
// external-IP and load-balancer traffic of name must go to: a port of its
// own when a Local traffic policy gives that traffic other endpoints than
// cluster traffic, else the ProxyPort. 0 if there is none, also while the
// port of its own could not be opened: the ProxyPort would send external
// traffic to endpoints its policy keeps it from.
func (p *Proxier) ExternalProxyPort(name state.ServicePortName) uint16 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sp, ok := p.services[name]; ok {
		if sp.separateExternal() {
			return sp.extProxyPort
		}
		return sp.proxyPort
	}
	return 0
}

// Listeners lists every socket the proxier listens on, sorted by service.
func (p *Proxier) Listeners() []Listener {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Listener
	for name, sp := range p.services {
		for k := range sp.sockets {
			out = append(out, Listener{Service: name, Addr: k.addr, Role: k.role.String()})
		}
	}
	for _, r := range p.released {
		out = append(out, Listener{Service: r.sp.name, Addr: r.key.addr, Role: r.key.role.String() + givenUpRole})
	}
	slices.SortFunc(out, func(a, b Listener) int {
		if c := a.Service.Compare(b.Service); c != 0 {
			return c
		}
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		return 0
	})
	return out
}
