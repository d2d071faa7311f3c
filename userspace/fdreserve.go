package userspace

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"syscall"
)

// The data plane keeps a reserve of file descriptors for the proxy's own
// control work: the health and metrics server (a kubelet probe that finds
// /livez unanswered restarts the proxy and cuts every connection), the API
// server's watch, iptables-restore and the other commands it runs, and
// conntrack's netlink socket. Without one, clients that hold every
// descriptor, or listeners for more service ports than the limit allows,
// leave the proxy deaf to its probes exactly when it is in trouble.
//
// How it is counted: the kernel hands out the lowest free descriptor
// number (POSIX requires it of socket, accept and pipe, and Linux's
// alloc_fd does it), so a new descriptor numbered n says that n others are
// open. The data plane keeps no descriptor numbered at or above its
// ceiling, RLIMIT_NOFILE minus the reserve: it resets a connection
// accepted onto one (counted and logged as shed, as at EMFILE), closes a
// dialed socket, session socket or splice pipe that got one (the
// connection is shed, the session refused, the data copied through memory
// instead), and it refuses a listening socket numbered at or above a
// lower ceiling, so the listeners of many service ports leave room for
// their connections. The numbers from the ceiling to the limit are then
// never the data plane's for longer than a reset takes, and the rest of
// the process always finds the reserve free. It costs one comparison of a
// number the system call returned anyway: no system call, no shared
// counter, nothing on the fast path to keep in step with every close.

// fdReserveMax is the reserve, in descriptors, above the data plane's
// ceiling. What the rest of the proxy holds at once stays well under it:
// a connection per health probe, metrics scrape and /debug request (a
// kubelet probes liveness and readiness, Prometheus scrapes), one or two
// HTTP/2 connections to the API server, the pipes and pidfd of an
// iptables-restore or ip6tables-restore run (about eight), a netlink
// socket for conntrack, inotify for the manifest file, and the spare the
// shedder keeps. 64 is twice that, and a rounding error at the limits
// nodes run with (0.3% of 20,000).
const fdReserveMax = 64

// errFDReserve is what a socket refused for the reserve's sake reports; it
// counts as running out of descriptors (isResourceExhausted).
var errFDReserve = fmt.Errorf("file descriptors down to the last %d or fewer, which are kept for health, metrics, the API server and iptables: %w", fdReserveMax, syscall.EMFILE)

// errListenerRoom is what a listening socket refused so that connections
// keep some room reports.
var errListenerRoom = errors.New("too many listening sockets for RLIMIT_NOFILE: the descriptors left are kept for connections and for health, metrics, the API server and iptables")

// fdCeilings says which descriptor numbers the data plane may keep.
type fdCeilings struct {
	// conns: connections, sessions and pipes keep no descriptor numbered
	// this or more. listeners: listening sockets keep none numbered this or
	// more. Both are math.MaxInt where no limit is known.
	conns, listeners atomic.Int64
}

// set sets the ceilings for a RLIMIT_NOFILE of limit (0: none known).
// The reserve is fdReserveMax, but at most a quarter of a small limit.
// Listening sockets stop another eighth of what is left (at least a
// reserve's worth) below the connections' ceiling: a service port that is
// listened on but has no descriptor left for its connections serves
// nobody, and its listener only takes what a served port needs.
func (c *fdCeilings) set(limit uint64) {
	if limit == 0 || limit >= math.MaxInt32 {
		c.conns.Store(math.MaxInt)
		c.listeners.Store(math.MaxInt)
		return
	}
	l := int64(limit)
	reserve := min(fdReserveMax, l/4)
	conns := l - reserve
	c.conns.Store(conns)
	c.listeners.Store(conns - max(reserve, conns/8))
}

// connFD reports whether fd, just created for a connection, a session or a
// pipe, is one the data plane may keep.
func (c *fdCeilings) connFD(fd int) bool { return int64(fd) < c.conns.Load() }

// listenerFD returns errListenerRoom when fd, a new listening socket's, is
// one listeners may not keep.
func (c *fdCeilings) listenerFD(fd int) error {
	if int64(fd) >= c.listeners.Load() {
		return errListenerRoom
	}
	return nil
}

// listenerConn is listenerFD for a socket Go's net package opened.
func (c *fdCeilings) listenerConn(sc syscall.Conn) error {
	fd, ok := fdOf(sc)
	if !ok {
		return nil
	}
	return c.listenerFD(fd)
}

// fdOf returns sc's descriptor.
func fdOf(sc syscall.Conn) (int, bool) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	fd := -1
	if rc.Control(func(f uintptr) { fd = int(f) }) != nil || fd < 0 {
		return 0, false
	}
	return fd, true
}

// readFDLimit sets p's ceilings from the process's RLIMIT_NOFILE. New
// calls it once: the limit is the one the proxy started with (Go raises
// the soft limit to the hard one at start), and a limit lowered later
// (prlimit) is met with shedding at EMFILE, as before, until a restart.
// A test may replace p.fdLimit first.
func (p *Proxier) readFDLimit() {
	if p.fdLimit == nil {
		p.fdLimit = fdLimit
	}
	p.fds.set(p.fdLimit())
}
