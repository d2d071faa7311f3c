package proxyserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/userspace"
)

// healthChecks serves the health-check node ports of Services that have
// one (LoadBalancer Services with externalTrafficPolicy: Local), as
// kube-proxy does. A cloud load balancer asks every node on that port and
// sends the Service's traffic only to the nodes that answer 200, those with
// a ready endpoint of the Service in the IP family the check came by; the
// others answer 503. Without an answer at all, every node looks down and
// the Service gets no traffic.
//
// The port is a plain listener whatever the portal: kube-proxy does not
// redirect it either.
type healthChecks struct {
	// nodePortAddresses restricts the addresses listened on, as for node
	// ports; empty means every address.
	nodePortAddresses []netip.Prefix
	// localAddrs lists this host's addresses, to match nodePortAddresses.
	localAddrs func() ([]netip.Addr, error)
	// proxyHealthy says whether the proxy keeps up with its source; while
	// it does not, every port answers 503, so load balancers send their
	// traffic to other nodes. Nil means it always does.
	proxyHealthy func() bool
	// countListener counts a listening socket among the data plane's
	// (userspace.Proxier.CountListener), under their bound, so that
	// health-check ports take neither the connections' room nor the
	// descriptors kept for /livez, /healthz, /metrics and the API server;
	// a port refused is reported and retried at the next sync, as a
	// service port is. Nil counts nothing.
	countListener func(net.Listener) (net.Listener, error)
	// refused says whether a connection that came to a wildcard socket at
	// local address dst is one node ports refuse there (a bind portal's
	// service address; userspace.Proxier.NodePortAddrRefused): a
	// health-check node port is a node port. Nil refuses none.
	refused func(dst netip.Addr) bool
	// limits bound the ports' connections, timeouts and, all ports
	// together, their number (see httpLimits). If zero, healthCheckLimits.
	limits httpLimits

	mu      sync.Mutex // guards servers and conns; held for a whole sync
	servers map[uint16]*healthServer
	// conns bounds the connections of every port together, so that
	// Services with health-check ports cannot add up to more than the
	// reserve of descriptors spares them; made at the first port.
	conns *connLimit
}

// healthServer answers on one health-check node port.
type healthServer struct {
	port    uint16
	healthy func() bool      // proxyHealthy
	addrs   []netip.AddrPort // listened on; nil for the wildcard
	status  atomic.Pointer[healthService]
	srv     *http.Server
	done    chan struct{} // closed when every Serve has returned
}

// healthService is what a health-check port knows of its Service.
type healthService struct {
	namespace, name string
	// local counts this node's ready endpoints of the Service (distinct
	// addresses over all its ports) in each IP family, as kube-proxy's
	// proxier of that family counts them: it sees only the endpoints of
	// its family, as the family's clients here do (a dual-stack Service's
	// IPv6 traffic goes to its IPv6 endpoints alone).
	local map[state.IPFamily]int
}

// healthStatus is what a health-check port answers, in kube-proxy's shape.
type healthStatus struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	// LocalEndpoints counts this node's ready endpoints of the Service in
	// the IP family the check came in by (see healthService.local).
	LocalEndpoints int `json:"localEndpoints"`
	// ServiceProxyHealthy says whether the proxy keeps up with its source
	// (see proxyHealth).
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// sync serves the health-check ports of s and closes those no Service has
// any more. A port that cannot be opened is reported; the others are
// served.
func (h *healthChecks) sync(s state.Snapshot) error {
	want := make(map[uint16]*healthService)
	addrsOf := make(map[uint16]map[netip.Addr]bool)
	for sp := range s.All {
		port := sp.HealthCheckNodePort
		if port == 0 {
			continue
		}
		// A port is one Service's, whose ports all have it: a cluster's
		// allocator gives each Service its own, and the manifest checks
		// refuse a file that shares one (source's crossCheck).
		if want[port] == nil {
			want[port] = &healthService{namespace: sp.Name.Namespace, name: sp.Name.Name, local: make(map[state.IPFamily]int)}
			addrsOf[port] = make(map[netip.Addr]bool)
		}
		for _, e := range sp.LocalEndpoints {
			if e.Local && e.Ready {
				addrsOf[port][e.Addr.Addr()] = true
			}
		}
	}
	for port, st := range want {
		for a := range addrsOf[port] {
			st.local[familyOf(a)]++
		}
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if len(want) == 0 && len(h.servers) == 0 {
		return nil // nothing to serve or close: no need to list addresses
	}
	if h.servers == nil {
		h.servers = make(map[uint16]*healthServer)
	}
	listen, err := h.listenAddrs()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for port, srv := range h.servers {
		if want[port] == nil || err == nil && !slices.Equal(srv.addrs, listenOn(listen, port)) {
			srv.close()
			delete(h.servers, port)
		}
	}
	for port, st := range want {
		if srv := h.servers[port]; srv != nil {
			srv.status.Store(st)
			continue
		}
		if err != nil || listen != nil && len(listen) == 0 {
			continue // no addresses to listen on (yet)
		}
		if h.conns == nil && h.limitsOrDefault().maxConns > 0 {
			h.conns = newConnLimit("health check node ports", h.limitsOrDefault().maxConns)
		}
		srv, serr := startHealthServer(port, listenOn(listen, port), st, h.proxyHealthy, h.countListener, h.refused, h.limitsOrDefault().server(nil, h.conns))
		if serr != nil {
			errs = append(errs, fmt.Errorf("health check node port %d of Service %s/%s: %w", port, st.namespace, st.name, serr))
			continue
		}
		h.servers[port] = srv
		on := "every address"
		if srv.addrs != nil {
			on = fmt.Sprint(srv.addrs)
		}
		klog.V(1).InfoS("Serving health check node port", "service", st.namespace+"/"+st.name, "port", port, "on", on)
	}
	return errors.Join(errs...)
}

// limitsOrDefault is h.limits, or healthCheckLimits if they are zero.
func (h *healthChecks) limitsOrDefault() httpLimits {
	if h.limits == (httpLimits{}) {
		return healthCheckLimits
	}
	return h.limits
}

// listenAddrs is where health-check ports listen: the host's addresses in
// nodePortAddresses (maybe none), or, with none given, nil for the
// wildcard.
func (h *healthChecks) listenAddrs() ([]netip.Addr, error) {
	if len(h.nodePortAddresses) == 0 {
		return nil, nil
	}
	local, err := h.localAddrs()
	if err != nil {
		return nil, fmt.Errorf("health check node ports: list local addresses: %w", err)
	}
	out := []netip.Addr{} // not nil: nil is the wildcard
	// A family whose node ports are served everywhere (none of the CIDRs
	// is of it) listens on its wildcard address.
	everywhere := [2]bool{state.NodePortsEverywhere(h.nodePortAddresses, false), state.NodePortsEverywhere(h.nodePortAddresses, true)}
	if everywhere[0] {
		out = append(out, netip.IPv4Unspecified())
	}
	if everywhere[1] {
		out = append(out, netip.IPv6Unspecified())
	}
	for _, a := range local {
		if a = a.Unmap(); !everywhere[b2i(a.Is6())] && userspace.InNodePortAddresses(h.nodePortAddresses, a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// listenOn pairs addrs with port; nil (no addresses given) stays nil, the
// wildcard of both families.
func listenOn(addrs []netip.Addr, port uint16) []netip.AddrPort {
	if addrs == nil {
		return nil
	}
	out := make([]netip.AddrPort, len(addrs))
	for i, a := range addrs {
		out[i] = netip.AddrPortFrom(a, port)
	}
	return out
}

// startHealthServer serves port on addrs (nil: the wildcard) with srv,
// whose handler it sets.
func startHealthServer(port uint16, addrs []netip.AddrPort, st *healthService, healthy func() bool, count func(net.Listener) (net.Listener, error), refused func(netip.Addr) bool, srv *http.Server) (*healthServer, error) {
	s := &healthServer{port: port, healthy: healthy, addrs: addrs, done: make(chan struct{})}
	s.status.Store(st)
	srv.Handler = s
	s.srv = srv
	var lns []net.Listener
	listen := func(network, addr string) error {
		ln, err := net.Listen(network, addr)
		if err == nil && count != nil {
			ln, err = count(ln) // closes ln when it refuses it
		}
		if err == nil {
			lns = append(lns, newQuietListener(ln, fmt.Sprintf("health check node port %d", port), refused))
		}
		return err
	}
	var err error
	if addrs == nil {
		err = listen("tcp", fmt.Sprintf(":%d", port)) // both families where the host has both
	}
	for _, a := range addrs {
		network := "tcp6"
		if a.Addr().Is4() {
			network = "tcp4"
		}
		if err = listen(network, a.String()); err != nil {
			break
		}
	}
	if err != nil {
		for _, l := range lns {
			l.Close()
		}
		return nil, err
	}
	var wg sync.WaitGroup
	for _, ln := range lns {
		wg.Go(func() { _ = s.srv.Serve(ln) })
	}
	go func() {
		wg.Wait()
		close(s.done)
	}()
	return s, nil
}

// quietListener keeps an HTTP server's accept errors for want of
// descriptors to itself: it waits and accepts again, saying so once until
// an accept succeeds, where Go's http.Server logs "http: Accept error: ...
// too many open files; retrying in 1s" every second, for every port. It
// serves the health-check node ports, /healthz and /metrics.
type quietListener struct {
	net.Listener
	what      string                // names the server in messages
	refused   func(netip.Addr) bool // see healthChecks.refused; nil refuses none
	closed    chan struct{}
	closeOnce sync.Once
}

func newQuietListener(ln net.Listener, what string, refused func(netip.Addr) bool) *quietListener {
	return &quietListener{Listener: ln, what: what, refused: refused, closed: make(chan struct{})}
}

// emfileRetry is how long a server waits to accept again when the process
// is out of descriptors.
const emfileRetry = 200 * time.Millisecond

func (l *quietListener) Accept() (net.Conn, error) {
	said := false
	for {
		c, err := l.Listener.Accept()
		if err == nil || !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) {
			if said && err == nil {
				klog.InfoS("Accepting again", "server", l.what, "addr", l.Addr())
			}
			if err == nil && l.refused != nil {
				if tc, ok := c.(*net.TCPConn); ok && l.refused(tc.LocalAddr().(*net.TCPAddr).AddrPort().Addr()) {
					_ = tc.SetLinger(0) // a reset, as a refused node port gets
					tc.Close()
					said = false
					continue
				}
			}
			return c, err
		}
		if !said {
			klog.ErrorS(err, "Cannot accept for want of file descriptors; retrying quietly", "server", l.what, "addr", l.Addr())
			said = true
		}
		select {
		case <-time.After(emfileRetry):
		case <-l.closed:
			return nil, net.ErrClosed
		}
	}
}

func (l *quietListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// ServeHTTP answers every request with the Service's status in the IP
// family of the address the check came to: 200 when this node has a ready
// endpoint of that family and the proxy keeps up, else 503. kube-proxy
// serves each family from its own proxier (on an IPv4 and an IPv6 socket
// since kubernetes#137370), so an IPv6 check learns whether IPv6 traffic
// to this node finds an endpoint: a load balancer that checks over IPv6 and
// sends IPv6 must not pick a node that drops it. One dual-stack socket
// serves both families here; an IPv4-mapped address is IPv4.
func (s *healthServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	svc := s.status.Load()
	var st healthStatus
	st.Service.Namespace, st.Service.Name = svc.namespace, svc.name
	st.LocalEndpoints = svc.local[requestFamily(req)]
	st.ServiceProxyHealthy = s.healthy == nil || s.healthy()
	body, _ := json.Marshal(st)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(st.LocalEndpoints))
	if st.LocalEndpoints > 0 && st.ServiceProxyHealthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(body)
}

// requestFamily is the IP family of the local address req came to (its
// connection's); IPv4 when it has none, which no listener's request lacks.
func requestFamily(req *http.Request) state.IPFamily {
	if a, ok := req.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return familyOf(ip)
		}
	}
	return state.IPv4
}

// close stops the server and waits, a bounded time, for its requests.
func (s *healthServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
	<-s.done
}

// closeAll stops every health-check port.
func (h *healthChecks) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, s := range h.servers {
		s.close()
		delete(h.servers, port)
	}
}
