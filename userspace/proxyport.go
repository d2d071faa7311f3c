package userspace

// The proxy ports of service ports: opening them (a previous run's port
// first), moving them, and giving them up, held from other service ports
// and, with a redirecting portal, still serving until the portal no
// longer redirects to them (see Config.HoldReleasedPorts).

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// PortalSynced tells the proxier that the portal now redirects only to
// the proxy ports of the last Apply: the sockets given up before are
// closed, and their ports are free for any service port. It reports
// whether a service port is waiting for one of them, and so wants Apply
// again.
func (p *Proxier) PortalSynced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.moved.sweep(p.cfg.Clock.Now())
	for sp := range p.externalMoved {
		if p.services[sp.name] == sp && sp.extProxyPort != 0 {
			sp.rememberSessions(roleProxyPort)
		}
	}
	p.externalMoved = nil
	p.closeReleased()
	p.held = nil
	return p.waiting
}

// releasedSocket is a proxy-port socket service port sp gave up, open
// until the portal no longer redirects to it. A failed sync leaves them
// open: the rules of the last sync that worked still redirect to them.
type releasedSocket struct {
	sp  *servicePort
	key sockKey
	s   socket
}

// maxReleased bounds the sockets given up that wait for the portal to
// sync: beyond it, the oldest close (see servicePort.release).
const maxReleased = 256

// closeReleased closes the sockets given up since the portal last synced
// and empties the balancers of the deleted service ports they served.
// Called with p.mu held.
func (p *Proxier) closeReleased() {
	p.closeSockets(p.released)
	for _, sp := range p.deleted {
		sp.drain()
	}
	p.released, p.deleted = nil, nil
}

// closeSockets closes rs, first remembering where their UDP sessions
// went: the portal now sends their clients to another proxy port (see
// movedSessions). Called with p.mu held.
func (p *Proxier) closeSockets(rs []releasedSocket) {
	for _, r := range rs {
		if !p.closed {
			klog.V(2).InfoS("Closing listener", "service", r.sp.name, "addr", r.key.addr, "role", r.key.role)
		}
		p.rememberSessions(r.sp, r.s, r.key.addr.Port())
		r.s.close()
	}
}

// hold keeps port, which owner gave up, from other service ports until
// the portal has synced (see Config.HoldReleasedPorts). Called with p.mu
// held.
func (p *Proxier) hold(port uint16, owner state.ServicePortName) {
	if !p.cfg.HoldReleasedPorts || port == 0 {
		return
	}
	if p.held == nil {
		p.held = make(map[uint16]state.ServicePortName)
	}
	p.held[port] = owner
}

// heldFrom reports whether port is held from service port name, and for
// whom. Called with p.mu held.
func (p *Proxier) heldFrom(port uint16, name state.ServicePortName) (state.ServicePortName, bool) {
	owner, ok := p.held[port]
	return owner, ok && owner != name
}

// release closes the socket k and forgets it. With HoldReleasedPorts, a
// proxy-port socket serves on until the portal no longer redirects to it
// (see Proxier.closeReleased), unless its port is now a node port, which
// is to listen at once; release reports whether the close waits so. The
// endpoints of a proxy-port socket's UDP sessions are remembered for the
// proxy port the portal moves their clients to (see movedSessions).
func (sp *servicePort) release(k sockKey) bool {
	s := sp.sockets[k]
	delete(sp.sockets, k)
	p := sp.p
	if k.role == roleProxyPort || k.role == roleExternalProxyPort {
		p.rememberSessions(sp, s, k.addr.Port())
	}
	switch {
	case p.closed:
		s.close()
		return false
	case p.cfg.HoldReleasedPorts && (k.role == roleProxyPort || k.role == roleExternalProxyPort) && !p.ports.isReserved(k.addr.Port()):
		klog.V(2).InfoS("Listener given up; it serves on until the portal no longer redirects to it", "service", sp.name, "addr", k.addr, "role", k.role)
		p.released = append(p.released, releasedSocket{sp, k, s})
		if n := len(p.released) - maxReleased; n > 0 {
			// The portal has not synced for many edits: the oldest
			// close, so that descriptors stay bounded.
			p.closeSockets(p.released[:n])
			p.released = slices.Delete(p.released, 0, n)
		}
		return true
	}
	klog.V(2).InfoS("Closing listener", "service", sp.name, "addr", k.addr, "role", k.role)
	s.close()
	return false
}

// reclaim takes back, as the sockets of role on port, those this service
// port gave up there that still serve until the portal syncs (see
// release): when it wants its previous port back before then (an
// externalTrafficPolicy flipped twice between syncs), the port is still
// bound by them. It does so only when they are a socket for each of addrs,
// and reports whether it did.
func (sp *servicePort) reclaim(addrs []netip.Addr, port uint16, role socketRole) bool {
	p := sp.p
	want := make(map[sockKey]bool, len(addrs))
	for _, a := range addrs {
		want[sockKey{netip.AddrPortFrom(a, port), role}] = true
	}
	found := 0
	for _, r := range p.released {
		if r.sp == sp && want[r.key] {
			found++
		}
	}
	if found != len(want) {
		return false
	}
	p.released = slices.DeleteFunc(p.released, func(r releasedSocket) bool {
		if r.sp == sp && want[r.key] {
			sp.sockets[r.key] = r.s
			return true
		}
		return false
	})
	return true
}

// ensureProxyPort opens the proxy-port sockets of a role, one per IP
// family, all on the same port, if *port is not set yet.
func (sp *servicePort) ensureProxyPort(role socketRole, port *uint16) error {
	if *port != 0 {
		return nil
	}
	addrs := sp.p.proxyPortAddrs(sp.spec)
	if pref := sp.preferredPort(role); pref != 0 {
		if sp.reclaim(addrs, pref, role) {
			*port = pref
			klog.V(1).InfoS("Serving service port again on the proxy port it gave up, which the portal still redirects to", "service", sp.name, "proxyPort", pref, "role", role)
			return nil
		}
		opened, _, err := sp.listenAll(addrs, pref, role)
		if err == nil {
			*port = pref
			for k, s := range opened {
				sp.sockets[k] = s
			}
			klog.V(1).InfoS("Serving service port on its previous proxy port", "service", sp.name, "proxyPort", pref, "role", role)
			return nil
		}
		sp.p.ports.release(pref)
		klog.V(2).InfoS("Previous proxy port not available; taking another", "service", sp.name, "proxyPort", pref, "err", err)
	}
	const attempts = 16
	var lastErr error
	var busy []uint16 // held by other programs: kept from the next attempts, then given back
	defer func() {
		for _, b := range busy {
			sp.p.ports.release(b)
		}
	}()
	for range attempts {
		want, err := sp.p.ports.allocate(sp.name.String()+"/"+role.String(), sp.name.String())
		if err != nil && lastErr != nil {
			break // the free ports were all tried: say why the last failed
		}
		if err != nil {
			return portErrorf(sp.name, "%w", err)
		}
		if owner, held := sp.p.heldFrom(want, sp.name); held {
			// The portal may still redirect another Service's traffic
			// to it.
			lastErr = errPortHeld{want, owner}
			busy = append(busy, want)
			continue
		}
		opened, actual, err := sp.listenAll(addrs, want, role)
		if err == nil && sp.p.ports.isReserved(actual) {
			// The kernel chose a port that a Service has as its node port.
			for _, o := range opened {
				o.close()
			}
			err = fmt.Errorf("port %d: %w (it is a node port)", actual, syscall.EADDRINUSE)
		}
		if owner, held := sp.p.heldFrom(actual, sp.name); err == nil && held {
			// The kernel chose a port given up at this sync.
			for _, o := range opened {
				o.close()
			}
			err = fmt.Errorf("port %d: %w (%w)", actual, syscall.EADDRINUSE, errPortHeld{actual, owner})
		}
		if err == nil {
			if want == 0 {
				sp.p.ports.claim(actual) // a kernel-chosen port inside the range is ours
			}
			*port = actual
			for k, s := range opened {
				sp.sockets[k] = s
			}
			klog.V(2).InfoS("Serving service port", "service", sp.name, "proxyPort", actual, "role", role)
			return nil
		}
		lastErr = err
		if !errors.Is(err, syscall.EADDRINUSE) {
			sp.p.ports.release(want)
			break
		}
		busy = append(busy, want)
	}
	return portErrorf(sp.name, "open proxy port: %w", lastErr)
}

// errPortHeld says a proxy port was passed over because another service
// port gave it up at this sync, and the portal may still redirect that
// one's traffic to it (see Config.HoldReleasedPorts).
type errPortHeld struct {
	port  uint16
	owner state.ServicePortName
}

func (e errPortHeld) Error() string {
	return fmt.Sprintf("proxy port %d is held for %s until the portal no longer redirects to it", e.port, e.owner)
}

// extendProxyPort opens the proxy-port sockets of a role that an IP family
// the service port gained needs. When another program holds the port in
// that family, the proxy port moves: the role gets a port free in every
// family, and the old sockets are closed (connections they accepted go on;
// the portal follows the new port at this sync).
func (sp *servicePort) extendProxyPort(role socketRole, port *uint16) error {
	taken := false
	for _, a := range sp.p.proxyPortAddrs(sp.spec) {
		k := sockKey{netip.AddrPortFrom(a, *port), role}
		if _, ok := sp.sockets[k]; ok {
			continue
		}
		s, err := sp.listen(k)
		if errors.Is(err, syscall.EADDRINUSE) {
			taken = true
			continue
		}
		if err != nil {
			return portErrorf(sp.name, "listen on %s (%s): %w", k.addr, role, err)
		}
		klog.V(3).InfoS("Listening", "service", sp.name, "addr", k.addr, "role", role)
		sp.sockets[k] = s
	}
	if !taken {
		return nil
	}
	old := *port
	*port = 0
	if err := sp.ensureProxyPort(role, port); err != nil {
		*port = old
		return err
	}
	for k := range sp.sockets {
		if k.role == role && k.addr.Port() == old {
			sp.release(k)
		}
	}
	gone := old
	sp.giveUp(&gone)
	klog.InfoS("Moved a proxy port: another program holds it in an IP family the service port now has",
		"service", sp.name, "role", role, "oldProxyPort", old, "proxyPort", *port)
	return nil
}

// preferredPort returns the configured previous proxy port of a role, once
// it is claimed from the range (or the range is kernel-chosen); else 0.
func (sp *servicePort) preferredPort(role socketRole) uint16 {
	f := sp.p.cfg.PreferredProxyPort
	if f == nil {
		return 0
	}
	pref := f(sp.spec, role == roleExternalProxyPort)
	if pref == 0 || pref == sp.proxyPort || pref == sp.extProxyPort {
		return 0
	}
	if _, held := sp.p.heldFrom(pref, sp.name); held {
		return 0
	}
	if sp.p.ports.isReserved(pref) {
		return 0 // now a node port this host serves, whatever the range
	}
	if r := sp.p.cfg.PortRange; r.Size > 0 && !sp.p.ports.claim(pref) {
		return 0 // outside the range now, or taken by another service port
	}
	return pref
}

// listenAll opens a proxy-port socket on each address, all with the same
// port; port 0 lets the kernel choose it for the first address.
func (sp *servicePort) listenAll(addrs []netip.Addr, port uint16, role socketRole) (map[sockKey]socket, uint16, error) {
	opened := make(map[sockKey]socket, len(addrs))
	for _, a := range addrs {
		k := sockKey{netip.AddrPortFrom(a, port), role}
		s, err := sp.listen(k)
		if err != nil {
			for _, o := range opened {
				o.close()
			}
			return nil, 0, fmt.Errorf("listen on %s: %w", k.addr, err)
		}
		if port == 0 {
			port = s.(interface{ port() uint16 }).port()
			k.addr = netip.AddrPortFrom(a, port)
		}
		opened[k] = s
	}
	return opened, port, nil
}

// giveUp returns the proxy port *port to the range, held from other service
// ports until the portal stops redirecting to it, and sets *port to 0.
func (sp *servicePort) giveUp(port *uint16) {
	sp.p.ports.retire(*port, sp.name.String())
	sp.p.hold(*port, sp.name)
	*port = 0
}
