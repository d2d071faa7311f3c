//go:build linux && !goroutines

package userspace

import (
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// The endpoint side of a connection of the event loops (tcploop_linux.go):
// dial attempts, failover past those that fail, and the race of those
// that timed out against the current one.

// dial starts a non-blocking connect to ep with the timeout of this
// attempt.
func (c *tcpConn) dial(ep netip.AddrPort) {
	p := c.l.sp.p
	c.endpoint = ep
	c.deadline = time.Now().Add(p.cfg.DialTimeouts[c.attempt])
	fam := familyOf(ep.Addr())
	fd, err := rawSocket(domainOf(fam), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		err = p.keepFD(fd, func() { rawClose(fd) })
	}
	if err != nil {
		if isResourceExhausted(err) {
			p.stats.Shed.Add(1)
			p.shed.log(err, c.l.sp.name.String())
		}
		c.abort()
		return
	}
	c.bfd = fd // its options are set once they matter (see keepAliveAfter)
	err = rawConnect(fd, fam, ep)
	if err != nil && err != unix.EINPROGRESS {
		c.dialFailed(err)
		return
	}
	if err := c.lp.register(fd, connEvents, &c.backendSide); err != nil {
		c.dialFailed(err)
		return
	}
	if err == nil {
		c.connected()
		return
	}
	c.dialing = true
	c.lp.schedule(&c.timer, c.deadline)
}

// dialProgress looks at the endpoint socket while connecting.
func (c *tcpConn) dialProgress(ev uint32) {
	if ev&(unix.EPOLLERR|unix.EPOLLHUP) == 0 {
		if ev&unix.EPOLLOUT != 0 {
			c.connected() // writable without an error: the handshake is done
		}
		return
	}
	soErr, err := rawGetsockoptInt(c.bfd, unix.SOL_SOCKET, unix.SO_ERROR)
	switch {
	case err != nil:
		c.dialFailed(err)
	case soErr != 0:
		c.dialFailed(unix.Errno(soErr))
	case ev&unix.EPOLLOUT != 0:
		c.connected()
	}
}

// dialFailed handles the failure of the current dial attempt (refused,
// unreachable): it moves on at once to another endpoint with the next,
// longer timeout (the failed one is passed over for a while and the
// client's affinity replaced). With no attempt left worth making, or no
// endpoint left at all, the earlier attempts that still connect (see
// dialTimedOut) keep the time the attempts not made would have had (see
// keepRacing). With none still connecting, the client is reset.
func (c *tcpConn) dialFailed(err error) {
	p := c.l.sp.p
	c.closeBackend()
	if isResourceExhausted(err) {
		p.stats.Shed.Add(1)
		p.shed.log(err, c.l.sp.name.String())
		c.abort()
		return
	}
	c.attemptFailed(c.endpoint, err)
	r := c.racing()
	r.tried = append(r.tried, c.endpoint)
	c.attempt++
	if c.attempt < len(p.cfg.DialTimeouts) {
		ep, why, perr := c.b.choose(c.client.Addr(), r.tried)
		if perr != nil {
			if r.pending() {
				c.keepRacing(err)
				return
			}
			p.stats.TCPNoEndpoints.Add(1)
			c.abort()
			return
		}
		if worthDialing(ep, r.tried, err) {
			if klog.V(4).Enabled() {
				c.l.sp.explainPick(c.b, c.l.role, c.client, ep, why, c.attempt+1)
			}
			c.dial(ep)
			return
		}
	}
	if r.pending() {
		c.keepRacing(err)
		return
	}
	c.giveUp(err)
}

// keepRacing is what is left when no further attempt is made (none is
// worth making, or no endpoint is left: they went, or the Service did)
// while earlier ones still connect: they keep the time the attempts not
// made would have had, from the deadline of the current one, the bound a
// connection whose attempts all time out has. (Under kube-proxy's kernel
// modes, a SYN that was sent goes on being retransmitted to its endpoint
// after the Service changed.) Then the timer gives up (see
// dialTimedOut); err is why the last attempt failed.
func (c *tcpConn) keepRacing(err error) {
	c.race.lastErr = err
	c.deadline = c.deadline.Add(sumDurations(c.l.sp.p.cfg.DialTimeouts[c.attempt:]))
	c.lp.schedule(&c.timer, c.deadline)
}

// attemptFailed counts and logs a failed dial attempt to ep, and passes
// over ep for a while.
func (c *tcpConn) attemptFailed(ep netip.AddrPort, err error) {
	p := c.l.sp.p
	p.stats.TCPDialFailures.Add(1)
	c.b.penalize(ep, p.cfg.EndpointPenalty)
	klog.V(3).InfoS("Dial to endpoint failed", "service", c.l.sp.name, "endpoint", ep, "client", c.client, "err", err)
}

// giveUp resets the client once every dial attempt has failed.
func (c *tcpConn) giveUp(err error) {
	p := c.l.sp.p
	p.stats.TCPDialGiveUps.Add(1)
	c.l.sp.dialGaveUp(err)
	klog.V(2).InfoS("Every dial attempt failed; resetting connection", "service", c.l.sp.name, "client", c.client, "tried", len(c.race.tried), "err", err)
	c.abort()
}

// dialTimedOut handles the end of the current attempt's time. While
// attempts remain, the next one starts, to the next endpoint in turn
// past those tried, and the current one goes on connecting meanwhile
// ("happy eyeballs" across endpoints, RFC 8305): an endpoint more than
// the first timeout away, or whose first SYN was lost (the kernel sends
// it again after 1 s), is still reached by its first attempt, where a
// new socket would start over. The first attempt to connect wins (see
// raceWon). After the last attempt's time, the connection is given up.
//
// The time is up only if the kernel has not finished the connect by then,
// nor that of an earlier attempt still racing (see connectFinished and
// racerFinished): the loop reads at most a round's events before
// it runs its timers, so a connect the endpoint answered at once can wait
// behind others, in epoll's ready list or in this round, longer than a
// short first timeout when thousands of connections arrive at once.
func (c *tcpConn) dialTimedOut() {
	p := c.l.sp.p
	if c.connectFinished() || c.racerFinished() {
		return
	}
	r := c.racing()
	if c.bfd >= 0 && c.attempt+1 < len(p.cfg.DialTimeouts) {
		klog.V(3).InfoS("Dial to endpoint timed out; it goes on connecting while the next attempt starts", "service", c.l.sp.name, "endpoint", c.endpoint, "client", c.client)
		r.add(c, c.bfd, c.endpoint)
		c.bfd = -1
		c.readable[1], c.hup[1] = false, false
		r.tried = append(r.tried, c.endpoint)
		c.attempt++
		ep, why, err := c.b.choose(c.client.Addr(), r.tried)
		if err != nil {
			c.keepRacing(unix.ETIMEDOUT)
			return
		}
		// A timeout leaves every endpoint worth dialing (worthDialing).
		if klog.V(4).Enabled() {
			c.l.sp.explainPick(c.b, c.l.role, c.client, ep, why, c.attempt+1)
		}
		c.dial(ep)
		return
	}
	err := r.lastErr
	if c.bfd >= 0 {
		c.closeBackend()
		c.attemptFailed(c.endpoint, unix.ETIMEDOUT)
		r.tried = append(r.tried, c.endpoint)
		err = unix.ETIMEDOUT
	}
	for i := range r.racers {
		if a := &r.racers[i]; a.fd >= 0 {
			c.attemptFailed(a.endpoint, unix.ETIMEDOUT)
			c.lp.closeFD(a.fd)
			a.fd = -1
		}
	}
	c.giveUp(err)
}

// connectFinished reports whether the kernel has finished the current
// attempt's connect, connected or failed, whose event the loop has not
// read yet: the socket is registered edge-triggered, so the end of its
// connect queued an event (registering a socket whose connect had ended
// queues one too), which a later round reads (dialProgress). Until then
// the attempt counts as in time, and its timer, which expired leaves at
// its deadline, comes back (a millisecond on, after the next round's
// events) to look again. One poll, only when an attempt's time is up: an
// ordinary connection, connected in time, makes no more system calls.
// Without it, a round longer than the timeout (a burst of new
// connections) started a race against a connect already done: a second
// connection, to another endpoint (see TestTCPDialBurstOpensNoExtraConnections).
func (c *tcpConn) connectFinished() bool {
	return c.bfd >= 0 && fdConnectEnded(c.bfd)
}

// racerFinished is connectFinished for the earlier attempts that race
// the current one: one whose connect ended, its event not read yet, may
// have won. Without it, an earlier attempt that connected in the round
// its connection's last attempt ran out of time (a long round, or a
// stalled loop) was closed as timed out, and its client reset.
func (c *tcpConn) racerFinished() bool {
	if c.race == nil {
		return false
	}
	for i := range c.race.racers {
		if a := &c.race.racers[i]; a.fd >= 0 && fdConnectEnded(a.fd) {
			return true
		}
	}
	return false
}

// racing returns the connection's dialRace, made on the first attempt
// that fails or times out: the one allocation failover adds.
func (c *tcpConn) racing() *dialRace {
	if c.race == nil {
		c.race = &dialRace{}
		c.race.tried = c.race.triedBuf[:0]
		for i := range c.race.racers {
			c.race.racers[i] = racer{c: c, fd: -1}
		}
	}
	return c.race
}

// dialRace is what a connection's dial needs once an attempt failed or
// timed out: the endpoints tried, and the attempts that timed out and go
// on connecting. One allocation, for the default four attempts.
type dialRace struct {
	tried    []netip.AddrPort // the endpoints of the attempts before the current one
	triedBuf [maxRacers + 1]netip.AddrPort
	racers   [maxRacers]racer // fd -1: a free slot
	lastErr  error            // why the last attempt failed, while the earlier ones go on
}

// maxRacers is how many attempts that timed out go on connecting at once:
// all of them with DefaultDialTimeouts. With more attempts configured,
// the oldest gives way to the next (see add).
const maxRacers = 3

// racer is an attempt that timed out and goes on connecting: the epoll
// handler of its socket.
type racer struct {
	c        *tcpConn
	fd       int
	attempt  int
	endpoint netip.AddrPort
}

// add takes over the socket of c's current attempt, which timed out.
func (r *dialRace) add(c *tcpConn, fd int, ep netip.AddrPort) {
	slot := &r.racers[0]
	for i := range r.racers {
		if a := &r.racers[i]; a.fd < 0 {
			slot = a
			break
		} else if a.attempt < slot.attempt {
			slot = a
		}
	}
	if slot.fd >= 0 {
		c.attemptFailed(slot.endpoint, unix.ETIMEDOUT)
		c.lp.closeFD(slot.fd)
	}
	slot.fd, slot.attempt, slot.endpoint = fd, c.attempt, ep
	c.lp.handlers[int32(fd)] = slot // epoll knows the socket already
}

// pending reports whether an attempt that timed out still connects.
func (r *dialRace) pending() bool {
	for i := range r.racers {
		if r.racers[i].fd >= 0 {
			return true
		}
	}
	return false
}

func (a *racer) event(ev uint32) {
	c := a.c
	if c.closed || a.fd < 0 {
		return
	}
	if ev&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
		soErr, err := rawGetsockoptInt(a.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err == nil && soErr != 0 {
			err = unix.Errno(soErr)
		}
		if err != nil {
			c.racerFailed(a, err)
			return
		}
	}
	if ev&unix.EPOLLOUT != 0 {
		c.raceWon(a, ev) // writable without an error: the handshake is done
	}
}

func (a *racer) shut() { a.c.abort() }

// racerFailed drops an attempt that timed out and then failed outright
// (refused, unreachable). The current attempt goes on; with none (no
// attempt was left to make), and no other that timed out, the connection
// is given up.
func (c *tcpConn) racerFailed(a *racer, err error) {
	c.lp.closeFD(a.fd)
	a.fd = -1
	c.attemptFailed(a.endpoint, err)
	if c.bfd < 0 && !c.race.pending() {
		c.giveUp(err)
	}
}

// raceWon makes attempt a, which timed out and then connected, the
// connection's: the current attempt's socket is closed (it never carried
// data), and so are the other racers' (see endRace). A client with
// ClientIP affinity, which the later attempts moved, goes to a's
// endpoint from now on.
func (c *tcpConn) raceWon(a *racer, ev uint32) {
	chosen := c.endpoint
	c.closeBackend()
	c.bfd, c.endpoint = a.fd, a.endpoint
	a.fd = -1
	c.lp.handlers[int32(c.bfd)] = &c.backendSide
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP) != 0 {
		c.readable[1] = true
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP) != 0 {
		c.hup[1] = true
	}
	if c.endpoint != chosen {
		c.b.remember(c.client.Addr(), c.endpoint)
	}
	c.connected()
}

// endRace closes the attempts still racing the one that connected. Those
// to other endpoints timed out: they count as failed, and their endpoints
// are passed over for a while. One to the endpoint that connected only
// lost the race.
func (c *tcpConn) endRace() {
	for i := range c.race.racers {
		if a := &c.race.racers[i]; a.fd >= 0 {
			c.lp.closeFD(a.fd)
			a.fd = -1
			if a.endpoint != c.endpoint {
				c.attemptFailed(a.endpoint, unix.ETIMEDOUT)
			}
		}
	}
	c.race = nil
}

// closeBackend drops a failed attempt's socket, and what its events said,
// so the next attempt's socket starts with nothing read from it.
func (c *tcpConn) closeBackend() {
	if c.bfd >= 0 {
		c.lp.closeFD(c.bfd)
		c.bfd = -1
	}
	c.readable[1], c.hup[1] = false, false
}
