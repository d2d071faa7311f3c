//go:build linux && !goroutines

package userspace

import (
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Moving a connection's bytes once its endpoint is connected
// (tcploop_linux.go): both directions, half-close, and the failure of a
// side.

// spliceDir is one direction of a proxied connection.
//
// Small reads go through the loop's scratch buffer (read, then write), which
// costs less than two splices for a request or a reply; once a read fills
// the buffer the direction switches to splice, which moves bulk data
// without copying it, and back when reads get small again.
type spliceDir struct {
	p       *pipe  // holds spliced data in flight; nil when empty
	pending int    // bytes in p
	buf     []byte // read data the destination could not take yet
	bulk    bool   // splice rather than read
	eof     bool   // the source has sent FIN
	shut    bool   // the FIN has been passed on (or the connection is done)
}

// smallRead is the scratch buffer size: reads that fill it switch the
// direction to splice.
const smallRead = 16 << 10

// connected starts proxying once the endpoint accepted the connection.
func (c *tcpConn) connected() {
	c.dialing = false
	// Always: the line that ends the connection is logged from another
	// file, which --vmodule may set to another level than this one.
	c.since = time.Now()
	c.setTimer(time.Time{}) // keep-alive's time, see keepAliveAfter
	if c.race != nil {
		c.endRace()
	}
	c.active = true
	c.l.sp.connOpened(&c.l.sp.p.stats.TCPActive)
	if klog.V(4).Enabled() {
		klog.InfoS("Proxying connection", "service", c.l.sp.name, "client", c.client, "endpoint", c.endpoint)
	}
	c.pump()
}

// pump moves whatever can move in both directions without blocking.
func (c *tcpConn) pump() {
	if !c.failing {
		for i := range c.dirs {
			if !c.pumpDir(i) {
				break // aborted, or a side failed
			}
		}
	}
	switch {
	case c.closed:
	case c.failing:
		c.drain()
	case c.dirs[0].shut && c.dirs[1].shut:
		c.finish()
	}
}

// fail handles the failure of side x (0: the client, 1: the endpoint),
// most often a reset, found by reading from it or writing to it. A
// direct connection or kernel NAT would still deliver what x sent before
// it failed (Linux keeps data that arrived before a reset readable, and
// a write that finds the reset does not read it, e.g. an HTTP server's
// "413" sent before it closed with an upload unread), so direction x goes
// on until it reads x's EOF or error, as far as the other side takes it;
// what was on its way to x is dropped. The other side is reset only when
// it has acknowledged all it was sent, since closing with SO_LINGER 0
// discards the socket's send queue, or after resetDrain (see drain).
// A failure of the other side meanwhile aborts at once.
//
// finFirst says x had sent its FIN before it failed: a reset from its
// kernel once its closed socket was gone (a keep-alive probe, or more
// data, reaching an orphan that tcp_fin_timeout expired), or a keep-alive
// timeout. All x sent is then in this proxy's hands, as it would be in
// the other side's kernel on a direct connection, so the drain passes
// x's FIN on after it and has no deadline: the other side reads all of
// it and its EOF, and is reset once it has acknowledged both. A slow
// reader keeps the connection as long as it takes or acknowledges data;
// one that takes nothing for finDrainStall is reset (see stalled), as
// the failed side's kernel would have given up on its orphaned socket.
func (c *tcpConn) fail(x int, why string, finFirst bool) {
	if c.why == "" {
		c.why = why
	}
	if c.closed {
		return
	}
	if c.failing {
		c.abort() // both have failed: nobody is left to deliver to
		return
	}
	c.failing, c.failedSide, c.finFirst = true, x, finFirst
	c.halfClosed = false
	d := &c.dirs[1-x] // what was on its way to x
	if d.p != nil {
		if d.pending > 0 {
			d.p.close() // data left in it; never reuse
		} else {
			putPipe(d.p)
		}
		d.p, d.pending = nil, 0
	}
	d.buf, d.eof, d.shut = nil, true, true
	// Read x until it says EOF or fails again, whatever events came.
	c.readable[x], c.hup[x] = true, true
	now := time.Now()
	c.deadline = now.Add(resetDrain)
	c.setTimer(c.deadline)
	if finFirst {
		c.lastProgress = now
		c.drainUnacked = c.unackedBy(1 - x)
	}
}

// stalled reports whether the side that a drain without a deadline
// delivers to has taken nothing and acknowledged nothing for
// finDrainStall: written to or acknowledged data (its send queue
// shrank) is progress.
func (c *tcpConn) stalled(now time.Time) bool {
	q := c.unackedBy(1 - c.failedSide)
	if q < c.drainUnacked {
		c.lastProgress = now
	}
	c.drainUnacked = q // more than before: written, which pumpDir counted
	return now.Sub(c.lastProgress) >= finDrainStall
}

// unackedBy returns what side i has not acknowledged of what it was
// sent (SIOCOUTQ), or 0 when that cannot be told.
func (c *tcpConn) unackedBy(i int) int32 {
	n, err := unix.IoctlGetInt(c.socket(i), unix.SIOCOUTQ)
	if err != nil {
		return 0
	}
	return int32(n)
}

// drain moves what the failed side sent to the other side, and resets
// the connection once the other side has acknowledged all of it.
func (c *tcpConn) drain() {
	c.pumpDir(c.failedSide)
	switch {
	case c.closed:
	case c.delivered():
		c.abort()
	case c.dirs[c.failedSide].shut:
		// All written, not all acknowledged: look again soon.
		if next := c.nextDrainPoll(time.Now()); !next.IsZero() {
			c.setTimer(next)
		}
	}
}

// nextDrainPoll returns when a draining connection that has written all
// the failed side sent looks again whether it was acknowledged, or zero
// when the drain's deadline comes first. Without a deadline (finFirst),
// it looks every drainPoll for resetDrain, then every slowDrainPoll: a
// slow reader may take minutes.
func (c *tcpConn) nextDrainPoll(now time.Time) time.Time {
	next := now.Add(drainPoll)
	switch {
	case next.Before(c.deadline):
		return next
	case c.finFirst:
		return now.Add(slowDrainPoll)
	}
	return time.Time{}
}

// failWriting handles an error writing to (or shutting down) side x,
// named to. EPIPE there says x's kernel reset the connection after x
// had sent its FIN (tcp_reset leaves EPIPE for a socket in CLOSE_WAIT):
// errors a reset leaves otherwise, or that a read takes, say ECONNRESET,
// and a read or SO_ERROR that takes one fails the side itself.
func (c *tcpConn) failWriting(x int, to string, err error) {
	c.fail(x, sideFailed(to, false, err), err == unix.EPIPE)
}

// delivered reports whether the failed side's EOF has been reached and
// everything before it written to the other side and acknowledged by it
// (or what it has not acknowledged cannot be told).
func (c *tcpConn) delivered() bool {
	return c.dirs[c.failedSide].shut && c.unackedBy(1-c.failedSide) == 0
}

// pumpDir moves data from one socket to the other until either would
// block. It reports false if it aborted the connection or found a side
// failed (c.failing). With the source failed, it reads on to its EOF,
// taking an error or EAGAIN for the EOF, and passes no FIN on.
func (c *tcpConn) pumpDir(i int) bool {
	p := c.l.sp.p
	src, dst := c.cfd, c.bfd
	from, to := "client", "endpoint"
	counter := &p.stats.BytesToBackend
	if i == 1 {
		src, dst = c.bfd, c.cfd
		from, to = to, from
		counter = &p.stats.BytesToClient
	}
	if i == 0 && c.header != nil && !c.sendHeader() {
		return !c.closed && !c.failing // the client's bytes wait for the header
	}
	failed := c.failing // and the source is the side that failed
	d := &c.dirs[i]
	progress := func(n int) {
		counter.Add(uint64(n))
		c.moved[i] += uint64(n)
		if c.halfClosed || c.finFirst {
			c.lastProgress = time.Now()
		}
	}
	for {
		if len(d.buf) > 0 {
			c.beforeWrite(i, len(d.buf))
			n, err := rawWrite(dst, d.buf)
			switch err {
			case nil:
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return true // dst is full: EPOLLOUT will bring us back
			default:
				c.failWriting(1-i, to, err)
				return false
			}
			d.buf = d.buf[n:]
			progress(n)
			continue
		}
		d.buf = nil
		if d.pending > 0 {
			c.beforeWrite(i, d.pending)
			n, err := rawSplice(d.p.r, dst, d.pending, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch err {
			case nil:
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return true // dst is full: EPOLLOUT will bring us back
			default:
				c.failWriting(1-i, to, err)
				return false
			}
			d.pending -= int(n)
			progress(int(n))
			continue
		}
		if d.p != nil {
			putPipe(d.p)
			d.p = nil
		}
		if d.eof {
			if !d.shut {
				d.shut = true
				if failed && c.finFirst {
					// The source sent its FIN before it failed: pass
					// it on after all it sent (see fail).
					if err := rawShutdown(dst, unix.SHUT_WR); err != nil {
						c.failWriting(1-i, to, err)
						return false
					}
				} else if !c.dirs[1-i].shut {
					// Pass the FIN on and bound the other direction. When
					// both sides are done, finish closes both sockets
					// instead, which sends the FIN without a shutdown.
					if err := rawShutdown(dst, unix.SHUT_WR); err != nil {
						c.failWriting(1-i, to, err)
						return false
					}
					c.halfClosed = true
					c.lastProgress = time.Now()
					c.setTimer(c.lastProgress.Add(p.cfg.TCPHalfCloseTimeout))
				}
			}
			return true
		}
		if !c.readable[i] {
			return true // drained: the next EPOLLIN brings us back
		}
		if !d.bulk {
			scratch := c.lp.tcpBuf
			n, err := rawRead(src, scratch)
			switch {
			case err == unix.EINTR:
				continue
			case failed && err != nil:
				d.eof = true // all it sent has been read
				continue
			case err == unix.EAGAIN:
				c.readable[i] = false
				return true
			case err != nil:
				d.eof = true
				c.fail(i, sideFailed(from, true, err), false) // e.g. a reset: pass it on as a reset, after what it sent
				return false
			case n == 0:
				d.eof = true
				continue
			}
			d.bulk = n == len(scratch) && !c.lp.pipesShort()
			if n < len(scratch) && !c.hup[i] {
				c.readable[i] = false
			}
			c.beforeWrite(i, n)
			m, err := rawWrite(dst, scratch[:n])
			switch err {
			case nil:
			case unix.EAGAIN, unix.EINTR:
				m = 0
			default:
				c.failWriting(1-i, to, err)
				return false
			}
			progress(m)
			if m < n {
				d.buf = append([]byte(nil), scratch[m:n]...)
			}
			continue
		}
		var err error
		if d.p, err = getPipe(p); err != nil {
			// Out of descriptors for a pipe: copy through the scratch
			// buffer instead, as for small reads. A connection already
			// being served must not be cut for want of a pipe; pipes are
			// tried again after a pause.
			c.lp.noPipesUntil = time.Now().Add(pipeRetry)
			logPipes(err, c.l.sp.name.String())
			d.bulk = false
			continue
		}
		n, err := rawSplice(src, d.p.w, spliceChunk, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		switch {
		case err == unix.EINTR:
			continue
		case failed && err != nil:
			putPipe(d.p)
			d.p = nil
			d.eof = true // all it sent has been read
		case err == unix.EAGAIN:
			putPipe(d.p) // nothing to read: hold no pipe while idle
			d.p = nil
			c.readable[i] = false
			return true
		case err != nil:
			putPipe(d.p)
			d.p = nil
			d.eof = true
			c.fail(i, sideFailed(from, true, err), false) // e.g. a reset: pass it on as a reset, after what it sent
			return false
		case n == 0:
			d.eof = true
		default:
			d.pending = int(n)
			// A short splice may only mean the pipe is full, so it says
			// nothing about the socket: read on until EAGAIN.
			d.bulk = n >= smallRead // small again: back to read and write
		}
	}
}
