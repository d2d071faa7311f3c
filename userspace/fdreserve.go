package userspace

import (
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
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
// instead), and refuses a listening socket that got one. The numbers from
// the ceiling to the limit are then never the data plane's for longer than
// a reset takes, and the rest of the process always finds the reserve
// free. It costs one comparison of a number the system call returned
// anyway: no system call, no shared counter, nothing on the fast path to
// keep in step with every close.
//
// Listening sockets are also counted, where they are opened and closed
// (never per connection): the listeners of many service ports, and the
// health-check node ports' (Proxier.CountListener), stop short of the
// ceiling, so the ports listened on leave room for their connections. A
// count, not a lower ceiling on numbers: connections hold the low numbers
// under load, and a Service added then must still get its listener.

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

// reserveError is what a socket refused for the reserve's sake reports; it
// counts as running out of descriptors (isResourceExhausted) and names the
// reserve of this process's limit.
type reserveError struct{ reserve int64 }

func (e *reserveError) Error() string {
	return fmt.Sprintf("file descriptors down to the last %d or fewer, which are kept for health, metrics, the API server and iptables: %v", e.reserve, syscall.EMFILE)
}

func (e *reserveError) Unwrap() error { return syscall.EMFILE }

// errListenerRoom is what a listening socket refused so that connections
// keep some room reports.
var errListenerRoom = errors.New("too many listening sockets for RLIMIT_NOFILE: the descriptors left are kept for connections and for health, metrics, the API server and iptables")

// ErrListenerRoom is what CountListener returns for a listening socket
// that would take room kept for connections or for the reserve.
var ErrListenerRoom = errListenerRoom

// fdCeilings says which descriptors the data plane may keep.
type fdCeilings struct {
	// conns: connections, sessions, pipes and listening sockets keep no
	// descriptor numbered this or more; math.MaxInt where no limit is
	// known.
	conns atomic.Int64
	// maxListeners bounds how many listening sockets are open at once;
	// math.MaxInt where no limit is known. listeners counts them.
	maxListeners, listeners atomic.Int64
	// measured says the first listening socket took its bound down by
	// the descriptors the rest of the process held then.
	measured atomic.Bool
	// errReserve is what a socket refused at conns reports.
	errReserve atomic.Pointer[reserveError]
	// dialing counts the connections that goroutine accept loops kept
	// and that are still dialing their endpoint (see accepted).
	dialing atomic.Int64
}

// set sets the ceilings for a RLIMIT_NOFILE of limit (0: none known).
// The reserve is fdReserveMax, but at most a quarter of a small limit.
// Listening sockets number another eighth of what is left (at least a
// reserve's worth) fewer than the connections' ceiling, and fewer still by
// what the rest of the process holds (see listenerFD): a service port that
// is listened on but has no descriptor left for its connections serves
// nobody, and its listener only takes what a served port needs.
func (c *fdCeilings) set(limit uint64) {
	if limit == 0 || limit >= math.MaxInt32 {
		c.conns.Store(math.MaxInt)
		c.maxListeners.Store(math.MaxInt)
		c.errReserve.Store(&reserveError{fdReserveMax})
		return
	}
	l := int64(limit)
	reserve := min(fdReserveMax, l/4)
	conns := l - reserve
	c.conns.Store(conns)
	c.maxListeners.Store(conns - max(reserve, conns/8))
	c.errReserve.Store(&reserveError{reserve})
}

// errFDReserve returns the error of a socket refused for the reserve.
func (c *fdCeilings) errFDReserve() error { return c.errReserve.Load() }

// connFD reports whether fd, just created for a connection, a session or a
// pipe, is one the data plane may keep.
func (c *fdCeilings) connFD(fd int) bool { return int64(fd) < c.conns.Load() }

// keepFD checks fd, the highest descriptor just opened for a connection,
// a UDP session or a pipe: it must be under the ceiling (connFD), and not
// hold the spare's number (shedder.tookSpare). It returns nil to keep it;
// otherwise it has ended it with end, and says why: the reserve's error,
// or EMFILE.
func (p *Proxier) keepFD(fd int, end func()) error {
	if !p.fds.connFD(fd) {
		end() // down to the reserve
		return p.fds.errFDReserve()
	}
	if p.shed.tookSpare(end) {
		return syscall.EMFILE
	}
	return nil
}

// keepConn is keepFD for a connection Go's net package (or package sctp)
// opened. Reading its descriptor costs a small allocation and no system
// call; one that cannot be read counts as under the ceiling.
func (p *Proxier) keepConn(sc syscall.Conn, end func()) error {
	return p.keepFD(fdOf(sc), end)
}

// accepted reports whether sc, a connection a goroutine accept loop just
// accepted, may be kept: below the ceiling it must leave a descriptor for
// the dial of each connection accepted and still dialing, its own
// included. Kept, it counts as dialing until dialed. Checked on the accept
// loop, clients are kept or shed in the order they came: under a burst
// the loop accepts faster than the dials take their descriptors, and a
// check on each connection's own goroutine found the numbers accepted
// meanwhile, and left the first clients' dials none (those clients were
// reset, later ones served).
func (c *fdCeilings) accepted(sc syscall.Conn) bool {
	n := c.dialing.Add(1)
	if fd := fdOf(sc); fd < 0 || int64(fd) < c.conns.Load()-n {
		return true
	}
	c.dialing.Add(-1)
	return false
}

// dialed ends what accepted began, once the connection's dial has ended
// (or it was refused before one).
func (c *fdCeilings) dialed() { c.dialing.Add(-1) }

// listenerFD counts fd, a new listening socket's, among the listeners, or
// returns why it may not be kept: listeners are at their bound
// (errListenerRoom), or fd is in the reserve (the reserve's error). Once
// it returned nil, listenerClosed must follow the socket's close.
func (c *fdCeilings) listenerFD(fd int) error {
	if !c.connFD(fd) {
		return c.errFDReserve()
	}
	n := c.listeners.Add(1)
	if c.measured.CompareAndSwap(false, true) {
		// The first listening socket, opened before any connection:
		// the descriptors below its number are the rest of the
		// process's (the health, metrics and API connections, the event
		// loops', the shedder's spare), which stay open as listeners
		// come and go.
		c.maxListeners.Add(-max(0, int64(fd)-(n-1)))
	}
	if n > c.maxListeners.Load() {
		c.listeners.Add(-1)
		return errListenerRoom
	}
	return nil
}

// listenerClosed gives back the place of a listening socket listenerFD
// counted.
func (c *fdCeilings) listenerClosed() { c.listeners.Add(-1) }

// keepListener checks fd, a listening socket just opened: it must have
// room among the listeners (fds.listenerFD), and not hold the spare's
// number (shedder.tookSpare), which it would keep for as long as its port
// is served, leaving new clients waiting instead of reset while
// descriptors run out. It returns nil to keep it, counted; otherwise it
// has closed it with end, and says why: the listeners' or the reserve's
// error, or EMFILE, which the next sync tries again after, as after any
// listener refused for want of descriptors.
func (p *Proxier) keepListener(fd int, end func()) error {
	if err := p.fds.listenerFD(fd); err != nil {
		end()
		return err
	}
	if p.shed.tookSpare(end) {
		p.fds.listenerClosed()
		return syscall.EMFILE
	}
	return nil
}

// keepListenerConn is keepListener for a socket Go's net package (or
// package sctp) opened; one whose descriptor cannot be read is counted
// all the same.
func (p *Proxier) keepListenerConn(sc syscall.Conn, end func()) error {
	return p.keepListener(fdOf(sc), end)
}

// fdOf returns sc's descriptor, or -1 when it cannot be read (which the
// checks take as under every ceiling).
func fdOf(sc syscall.Conn) int {
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	if rc.Control(func(f uintptr) { fd = int(f) }) != nil || fd < 0 {
		return -1
	}
	return fd
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

// CountListener counts ln, a listening socket the proxy opens besides the
// data plane's (a health-check node port), among the data plane's
// listening sockets, under the same bound: it returns ln wrapped so that
// closing it gives its place back, or closes ln and returns an error that
// wraps ErrListenerRoom, or EMFILE for a descriptor in the reserve. A
// listener whose descriptor cannot be read is returned as it is.
func (p *Proxier) CountListener(ln net.Listener) (net.Listener, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return ln, nil
	}
	if err := p.keepListenerConn(sc, func() { ln.Close() }); err != nil {
		return nil, err
	}
	return &countedListener{Listener: ln, fds: &p.fds}, nil
}

// countedListener is a listener CountListener counted.
type countedListener struct {
	net.Listener
	fds  *fdCeilings
	once sync.Once
}

func (l *countedListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(l.fds.listenerClosed)
	return err
}
