package proxyserver

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// httpLimits bound what the clients of one of the proxy's own HTTP servers
// (/healthz and /livez, /metrics and /debug/services, the health-check
// node ports) may hold, so that a hostile or broken client can keep
// neither descriptors nor memory for ever, nor take the data plane's.
//
// Their connections are not the data plane's: they take whatever
// descriptor numbers are free, and the data plane's ceiling (userspace's
// fdReserveMax, 64 below RLIMIT_NOFILE, or a quarter of a limit under 256)
// counts them among the reserve's users. Unbounded, 400 slow clients of
// /healthz took every descriptor of a 256 limit: the data plane shed its
// clients, and /healthz itself answered in 2 s, past a kubelet probe's
// 1 s. So each server holds at most maxConns connections at once, all
// three together 32, half the reserve: the other half is the API server's
// connections, iptables-restore's pipes, conntrack's netlink socket, the
// manifest file's inotify, these servers' listening sockets and the
// shedder's spare. Under a limit below 256, where the reserve is a
// quarter of it (16 at 64), the bounds shrink with it (scaled), so that
// they stay half of it, but never below minConns each.
type httpLimits struct {
	// maxConns bounds the connections open at once (see connLimit). If
	// zero, there is no bound.
	maxConns int
	// readHeaderTimeout bounds the wait for a request's header, from its
	// first byte (a slowloris client sends one header line at a time).
	readHeaderTimeout time.Duration
	// writeTimeout bounds a request from the end of its header to the end
	// of its answer (http.Server.WriteTimeout): a client that asks for a
	// large page and never reads it is cut off then, and its goroutine and
	// buffered answer freed. It is the server's ReadTimeout as well, so a
	// request body sent a byte at a time is cut off too (the server
	// reads what a handler left unread before it answers). Not while the
	// connection waits for its next request: see idleTimeout.
	writeTimeout time.Duration
	// idleTimeout bounds the wait for the next request on a kept-alive
	// connection.
	idleTimeout time.Duration
}

// The servers' limits, their bounds scaled to the RLIMIT_NOFILE the
// process started with (the one the data plane reads; Go's runtime
// raised the soft limit to the hard one before this package's variables
// are set).
var (
	// healthLimits are /healthz's and /livez's: a kubelet probes liveness
	// and readiness (a connection each, not kept alive), load balancers
	// and node monitors ask now and then. Answers are a few hundred bytes
	// and immediate, so 10 s to write one is generous.
	healthLimits = httpLimits{maxConns: 12, readHeaderTimeout: 5 * time.Second, writeTimeout: 10 * time.Second, idleTimeout: 30 * time.Second}.scaled(openFilesLimit())
	// metricsLimits are /metrics's and /debug/services's: a Prometheus
	// scrape or two and people. /debug/services runs to megabytes with
	// thousands of service ports (2.8 MB in a tester's run), so an answer
	// may take two minutes: 10 MB at 1 Mbit/s, or a slow kubectl
	// port-forward.
	metricsLimits = httpLimits{maxConns: 8, readHeaderTimeout: 5 * time.Second, writeTimeout: 2 * time.Minute, idleTimeout: 30 * time.Second}.scaled(openFilesLimit())
	// healthCheckLimits are the health-check node ports', every port's
	// connections together: cloud load balancers' probes, short and
	// small.
	healthCheckLimits = httpLimits{maxConns: 12, readHeaderTimeout: 5 * time.Second, writeTimeout: 10 * time.Second, idleTimeout: 30 * time.Second}.scaled(openFilesLimit())
)

// limitsOf returns the limits of the server that serves what.
func limitsOf(what string) httpLimits {
	if what == metricsWhat {
		return metricsLimits
	}
	return healthLimits
}

const (
	// dataPlaneReserve is the data plane's reserve of descriptors at a
	// RLIMIT_NOFILE of 256 or more (userspace's fdReserveMax); below, a
	// quarter of the limit. The bounds above are for this reserve.
	dataPlaneReserve = 64
	// minConns is the least a bound is scaled down to: a kubelet's
	// liveness and readiness probes at once, or a load balancer's probes
	// from two addresses.
	minConns = 2
)

// scaled returns l with maxConns scaled to a RLIMIT_NOFILE of limit (0:
// not known, l as it is): under 256, where the data plane's reserve is a
// quarter of the limit rather than dataPlaneReserve, the bound shrinks in
// proportion, to no fewer than minConns. At 64 the three servers hold 3,
// 2 and 3 (8, half the reserve of 16) where 12, 8 and 12 took twice the
// reserve and left the data plane's connections the rest.
func (l httpLimits) scaled(limit uint64) httpLimits {
	if l.maxConns == 0 || limit == 0 || limit/4 >= dataPlaneReserve {
		return l
	}
	l.maxConns = max(minConns, l.maxConns*int(limit/4)/dataPlaneReserve)
	return l
}

// server returns an HTTP server of h under l, whose connections cl (if
// not nil) bounds; cl may be shared by several servers. h's requests
// have contexts that end at the write timeout (see withDeadline).
func (l httpLimits) server(h http.Handler, cl *connLimit) *http.Server {
	if h != nil && l.writeTimeout > 0 {
		h = withDeadline(h, l.writeTimeout)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.readHeaderTimeout,
		ReadTimeout:       l.writeTimeout,
		WriteTimeout:      l.writeTimeout,
		IdleTimeout:       l.idleTimeout,
	}
	if cl != nil {
		srv.ConnState = cl.track
	}
	return srv
}

// withDeadline gives each request of h a context that ends after d, the
// server's write timeout, when its answer can no longer be sent: net/http
// ends a request's context only when its client goes away or the handler
// returns (the connection's deadline fails writes, and no more), so work
// that follows the context (a large /debug/services page) went on until
// it was done, for nobody.
func withDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// connLimit bounds the connections one or more HTTP servers hold open
// (their http.Server.ConnState is track). Every connection is accepted;
// one over the bound closes another at once, with a reset: of the client
// that holds the most connections, the one that has waited longest for
// a request (a slowloris client's header that never ends, or a kept-alive
// connection left idle), else its oldest request.
//
// Why not leave the connections over the bound in the kernel's accept
// queue (netutil.LimitListener)? A kubelet probe would wait there behind
// every slow client's connection, each taking a place only as another's
// ReadHeaderTimeout (5 s) ends: far past the probe's 1 s timeout. Nor
// refuse the newest at once: the probe is the newest. The newest is what a
// prober sends now, with its whole request, so it is answered at once;
// what goes is what has held a place longest, from whoever holds most of
// them, so a slowloris from one address closes its own connections, not
// a kubelet's, a load balancer's or Prometheus's. A well-behaved client
// that meets it sees a kept-alive connection closed, which HTTP clients
// open again. Descriptors held: at most max, and, while one is closed,
// one more per listening socket (each accepts on its own).
type connLimit struct {
	max  int    // connections held at once; at least 1
	what string // names the servers in messages

	mu     sync.Mutex // guards the fields below
	conns  map[net.Conn]*limitedConn
	stamp  uint64    // counts state changes, to order them
	closed int       // connections closed for the bound not yet logged
	said   time.Time // when closed connections were last logged
}

// limitedConn is what connLimit knows of a connection.
type limitedConn struct {
	client  netip.Addr
	waiting bool   // for a request: new, or idle between requests
	since   uint64 // the stamp of its last state change
}

func newConnLimit(what string, n int) *connLimit {
	return &connLimit{max: max(n, 1), what: what, conns: make(map[net.Conn]*limitedConn)}
}

// connLimitLogEvery is how often, at most, closing connections for the
// bound is logged.
const connLimitLogEvery = time.Minute

// track follows c's state (http.Server.ConnState): a new connection over
// the bound closes another.
func (l *connLimit) track(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stamp++
	switch st {
	case http.StateNew:
		l.conns[c] = &limitedConn{client: clientOf(c), waiting: true, since: l.stamp}
		if len(l.conns) > l.max {
			l.closeOne()
		}
	case http.StateActive, http.StateIdle:
		// A connection closed for the bound may still report its
		// request: it is gone already.
		if lc := l.conns[c]; lc != nil {
			lc.waiting, lc.since = st == http.StateIdle, l.stamp
		}
	case http.StateClosed, http.StateHijacked:
		delete(l.conns, c)
	}
}

// closeOne closes the connection to go (see connLimit).
func (l *connLimit) closeOne() {
	held := make(map[netip.Addr]int)
	for _, lc := range l.conns {
		held[lc.client]++
	}
	var victim net.Conn
	var v *limitedConn
	for c, lc := range l.conns {
		if v == nil || closesBefore(lc, v, held) {
			victim, v = c, lc
		}
	}
	delete(l.conns, victim)
	if tc, ok := victim.(interface{ SetLinger(int) error }); ok { // a *net.TCPConn
		// A reset frees the socket at once, with what it had queued to
		// send: a FIN leaves it to the kernel until the client reads.
		_ = tc.SetLinger(0)
	}
	_ = victim.Close()
	klog.V(4).InfoS("Closed a connection for the connection limit", "server", l.what, "client", victim.RemoteAddr(), "waiting", v.waiting)
	l.closed++
	if now := time.Now(); now.Sub(l.said) >= connLimitLogEvery {
		klog.InfoS("Connections over the limit: closing those of the client that holds the most, the one that waited longest for a request first",
			"server", l.what, "limit", l.max, "closed", l.closed, "client", v.client)
		l.said, l.closed = now, 0
	}
}

// closesBefore reports whether a goes before b when one must: its client
// holds more connections; or, as many, it waits for a request and b
// serves one; or it has been so longer.
func closesBefore(a, b *limitedConn, held map[netip.Addr]int) bool {
	if ha, hb := held[a.client], held[b.client]; ha != hb {
		return ha > hb
	}
	if a.waiting != b.waiting {
		return a.waiting
	}
	return a.since < b.since
}

// clientOf is the address c comes from (IPv4-mapped as IPv4); the zero
// address if it has none.
func clientOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
