package userspace

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// What the protocols served by goroutines share: SCTP on every Linux
// build, and TCP where the event loops do not run (see doc.go).

// acceptLoop accepts with accept until the listener is closed, and hands
// each connection to serve on a goroutine of its own; serve must call
// sp.p.wg.Done. keep (keepAccepted) runs first, on the loop's goroutine,
// and may refuse the connection (it ends and counts it). Running out of file
// descriptors sheds one waiting connection (shed, which must not wait, says
// what came of it); nothing wakes the loop when a client comes or
// descriptors are free again (on Linux accept fails so with no client
// waiting, and Go's poller waits only after EAGAIN), so it looks again
// within outOfDescriptorsRetry. Other errors, rare and usually transient,
// back off so a persistent one cannot spin.
func acceptLoop[C any](sp *servicePort, accepted *atomic.Uint64, accept func() (C, error), shed func() shedResult, keep func(C) bool, serve func(C)) {
	p := sp.p
	var backoff time.Duration
	for {
		c, err := accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			limit := time.Second
			if isResourceExhausted(err) {
				switch shed() {
				case shedOne:
					accepted.Add(1) // taken, and shed (see Stats.TCPAccepted)
					p.shed.report(&p.stats, err, sp.name.String(), true)
					continue
				case shedFailed:
					p.shed.report(&p.stats, err, sp.name.String(), false)
				}
				limit = outOfDescriptorsRetry
			} else {
				p.stats.AcceptErrors.Add(1)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), limit)
			klog.V(2).InfoS("Accept failed; retrying", "service", sp.name, "err", err, "backoff", backoff)
			select {
			case <-time.After(backoff):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		accepted.Add(1)
		if !keep(c) {
			continue
		}
		p.wg.Add(1)
		go serve(c)
	}
}

// keepAccepted returns acceptLoop's keep for sp's connections. A
// connection is ended with reset and counted as shed when the descriptor
// ceiling has no room for it (fdCeilings.accepted), or when it took the
// spare's number (shedder.tookSpare). serve must call sp.p.fds.dialed
// once the dial of a kept connection has ended.
func keepAccepted[C syscall.Conn](sp *servicePort, reset func(C)) func(C) bool {
	p := sp.p
	return func(c C) bool {
		if !p.fds.accepted(c) {
			reset(c)
			p.shed.report(&p.stats, p.fds.errFDReserve(), sp.name.String(), true)
			return false
		}
		if p.shed.tookSpare(func() { reset(c) }) {
			p.fds.dialed()
			p.shed.report(&p.stats, syscall.EMFILE, sp.name.String(), true)
			return false
		}
		return true
	}
}

// drainQueued takes the connections queued on a listening socket about to
// close, which closing it would reset, and serves them as acceptLoop serves
// its own (which may take some of them first): their clients' connects had
// succeeded. next returns one, without waiting, or false when none is
// left. It must run while the socket's accept loop does, which holds
// sp.p.wg; not when the proxier is closing, which ends every connection.
func drainQueued[C any](sp *servicePort, accepted *atomic.Uint64, next func() (C, bool), keep func(C) bool, serve func(C)) {
	p := sp.p
	if p.ctx.Err() != nil {
		return
	}
	for range maxDrained {
		c, ok := next()
		if !ok {
			return
		}
		accepted.Add(1)
		if keep(c) {
			p.wg.Add(1)
			go serve(c)
		}
	}
}

// maxDrained bounds how many queued connections a closing listening socket
// takes before it closes: a backlog of 4096, and as many more come
// meanwhile.
const maxDrained = 2 * 4096

// outOfDescriptorsRetry bounds how long a goroutine accept loop that is
// out of descriptors waits before it accepts again, or sheds: about how
// long a client that comes meanwhile waits for its reset.
const outOfDescriptorsRetry = 250 * time.Millisecond

// dialCounters are the counters of a protocol's dials.
type dialCounters struct {
	noEndpoints *atomic.Uint64 // connections refused because the port had no endpoints
	failures    *atomic.Uint64 // failed dials to endpoints (each attempt)
	giveUps     *atomic.Uint64 // connections refused after every dial attempt failed
}

// dialWithFailover connects to an endpoint chosen by b with dial. A failed
// attempt moves on at once to another endpoint with the next, longer
// timeout and replaces the client's affinity; at most len(DialTimeouts)
// attempts are made. An attempt whose time is up goes on connecting while
// the next one starts ("happy eyeballs" across endpoints, RFC 8305, as
// the event loops do: see tcpConn.dialTimedOut), and the first to connect
// wins; the others are closed. Attempts run on the caller's goroutine
// until one's time is up; then the race takes over (see failover.run),
// and ends when watch (nil: none) says the client has failed.
//
// An attempt's time counts from its connect, and is up only if the
// kernel has not finished the connect by then (see dialClock): dial must
// call clock.start just before it connects.
func dialWithFailover[C io.Closer](p *Proxier, b *balancer, role socketRole, client netip.AddrPort, sp *servicePort, n dialCounters, watch clientWatch, dial func(ctx context.Context, ep netip.AddrPort, clock *dialClock) (C, error)) (C, netip.AddrPort, error) {
	f := &failover[C]{p: p, b: b, role: role, client: client, sp: sp, n: n, watch: watch, dial: dial}
	var zero C
	for {
		ep, err := f.choose()
		if err != nil {
			f.noEndpoints()
			return zero, ep, err
		}
		if !ep.IsValid() {
			return zero, ep, f.giveUp()
		}
		ctx, cancel := context.WithCancel(p.ctx)
		f.ep, f.cancel = ep, cancel
		f.clock = newDialClock(p.cfg.DialTimeouts[f.attempt], f.timedOut)
		conn, err := dial(ctx, ep, f.clock)
		if f.clock.stop() {
			// Its time was up: it has joined the race, which decides.
			f.results <- dialResult[C]{conn: conn, err: err}
			w := <-f.won
			return w.conn, w.ep, w.err
		}
		cancel()
		if err == nil {
			return conn, ep, nil
		}
		if isResourceExhausted(err) {
			p.stats.Shed.Add(1)
			p.shed.log(err, sp.name.String())
			return zero, ep, err
		}
		if p.ctx.Err() != nil {
			return zero, ep, p.ctx.Err()
		}
		f.attemptFailed(ep, err)
		f.tried = append(f.tried, ep)
		f.lastErr = err
		f.attempt++
		if f.attempt == len(p.cfg.DialTimeouts) {
			return zero, netip.AddrPort{}, f.giveUp()
		}
	}
}

// failover is the state of one connection's dial attempts.
type failover[C io.Closer] struct {
	p      *Proxier
	b      *balancer
	role   socketRole
	client netip.AddrPort
	sp     *servicePort
	n      dialCounters
	watch  clientWatch
	dial   func(context.Context, netip.AddrPort, *dialClock) (C, error)

	attempt int              // the current attempt, from 0
	tried   []netip.AddrPort // the endpoints of the attempts before it
	lastErr error
	ep      netip.AddrPort     // the current attempt's endpoint
	cancel  context.CancelFunc // ends the current attempt
	clock   *dialClock         // times the current attempt

	// Made once an attempt on the caller's goroutine is out of time (see
	// timedOut), before its clock.stop returns.
	results chan dialResult[C] // every racing attempt's outcome, one each
	won     chan dialResult[C] // the race's outcome, for the caller
	expired chan int           // the racing attempts whose time is up
}

// clientWatch tells a dial race when its client has failed (reset), so
// that the race ends at once rather than dial on for nobody, as the
// event loops end it (see connSide.event).
type clientWatch interface {
	// wait returns the client's failure once it comes, or nil once
	// interrupt was called (at once where a failure cannot be waited
	// for).
	wait() error
	// interrupt makes wait return.
	interrupt()
	// resume undoes interrupt, after wait returned.
	resume()
}

// dialResult is the outcome of attempt i of a race.
type dialResult[C any] struct {
	conn C
	ep   netip.AddrPort
	err  error
	i    int
}

// choose picks the current attempt's endpoint, or the zero address when
// the last failure makes the pick not worth dialing (see worthDialing).
func (f *failover[C]) choose() (netip.AddrPort, error) {
	ep, why, err := f.b.choose(f.client.Addr(), f.tried)
	if err != nil {
		return ep, err
	}
	if !worthDialing(ep, f.tried, f.lastErr) {
		return netip.AddrPort{}, nil
	}
	if klog.V(4).Enabled() {
		f.sp.explainPick(f.b, f.role, f.client, ep, why, f.attempt+1)
	}
	return ep, nil
}

// noEndpoints counts and logs a connection refused for want of an
// endpoint to dial.
func (f *failover[C]) noEndpoints() {
	f.n.noEndpoints.Add(1)
	if klog.V(4).Enabled() {
		klog.InfoS("No endpoints; resetting connection", "service", f.sp.name, "client", f.client)
	}
}

// attemptFailed counts and logs a failed dial attempt to ep, and passes
// over ep for a while.
func (f *failover[C]) attemptFailed(ep netip.AddrPort, err error) {
	f.n.failures.Add(1)
	f.b.penalize(ep, f.p.cfg.EndpointPenalty)
	klog.V(3).InfoS("Dial to endpoint failed", "service", f.sp.name, "endpoint", ep, "client", f.client, "err", err)
}

func (f *failover[C]) giveUp() error {
	f.n.giveUps.Add(1)
	f.sp.dialGaveUp(f.lastErr)
	klog.V(2).InfoS("Every dial attempt failed; resetting connection", "service", f.sp.name, "client", f.client, "tried", len(f.tried), "err", f.lastErr)
	return f.lastErr
}

// timedOut runs when the time of the attempt on the caller's goroutine is
// up (its clock's up): that attempt goes on, and the race starts beside
// it (the allocations racing adds, with its goroutines).
func (f *failover[C]) timedOut() {
	f.results = make(chan dialResult[C], len(f.p.cfg.DialTimeouts))
	f.won = make(chan dialResult[C], 1)
	f.expired = make(chan int, len(f.p.cfg.DialTimeouts))
	f.p.wg.Add(1) // the caller's goroutine holds the proxier's count
	go f.run()
}

// raceAttempt is one attempt of a race.
type raceAttempt struct {
	ep       netip.AddrPort
	cancel   context.CancelFunc
	clock    *dialClock
	timedOut bool // its time is up: it races the later ones
	done     bool // its outcome has come
}

// run is the race, from the end of the first racing attempt's time (that
// attempt, on the caller's goroutine, is attempt 0 here and sends its
// outcome to f.results like the others). When the current attempt's time
// is up and attempts remain, the next starts; when it fails outright, the
// next starts at once. The first to connect wins, and goes to the caller
// at once; every other attempt is cancelled, and closed if it connected
// all the same, and the attempts that timed out to other endpoints count
// as failed (an endpoint whose attempt timed out and then won is not
// penalized). When the last attempt's time is up, or none is left, the
// connection is given up. The proxier stopping, or the client failing,
// ends every attempt. run returns once every attempt has ended, so
// nothing it started outlives it. Each attempt's time is its clock's
// (see dialClock); the timer is for the time that attempts not made
// leave to those running.
func (f *failover[C]) run() {
	defer f.p.wg.Done()
	p := f.p
	timeouts := p.cfg.DialTimeouts
	attempts := make([]raceAttempt, 1, len(timeouts)-f.attempt)
	attempts[0] = raceAttempt{ep: f.ep, cancel: f.cancel, clock: f.clock}
	running, current := 1, 0
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var gone chan error // the client's failure, while it is watched
	if f.watch != nil {
		gone = make(chan error, 1)
		go func() { gone <- f.watch.wait() }()
	}
	decided := false
	finish := func(r dialResult[C]) {
		decided = true
		timer.Stop()
		for _, a := range attempts {
			a.cancel()
		}
		if gone != nil {
			// The watch ends before the caller uses the client.
			f.watch.interrupt()
			<-gone
			gone = nil
			f.watch.resume()
		}
		f.won <- r
	}
	giveUp := func() {
		for i, a := range attempts {
			if !a.done && a.timedOut {
				f.attemptFailed(a.ep, errDialTimedOut)
				attempts[i].done = true // counted; its outcome is only closed
			}
		}
		finish(dialResult[C]{err: f.giveUp()})
	}
	// next starts the next attempt. With none left worth starting, those
	// running keep the time the attempts not made would have had: the
	// current one's deadline plus their timeouts (as the event loops do:
	// see tcpConn.keepRacing), and no attempt is started after them. So
	// do they when no endpoint is left (they went, or the Service did).
	// With none running, the connection is given up.
	last := false // no attempt is started any more
	next := func() {
		rest := sumDurations(timeouts[f.attempt+1:])
		if f.attempt+1 < len(timeouts) && !last {
			f.attempt++
			ep, err := f.choose()
			if err != nil && running == 0 {
				f.noEndpoints()
				finish(dialResult[C]{ep: ep, err: err})
				return
			}
			if err == nil && ep.IsValid() {
				ctx, cancel := context.WithCancel(p.ctx)
				i := len(attempts)
				clock := newDialClock(timeouts[f.attempt], func() { f.expired <- i })
				attempts = append(attempts, raceAttempt{ep: ep, cancel: cancel, clock: clock})
				current = i
				running++
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					conn, err := f.dial(ctx, ep, clock)
					clock.stop() // its time, if up, is in f.expired
					f.results <- dialResult[C]{conn: conn, ep: ep, err: err, i: i}
				}()
				return
			}
		}
		if running == 0 {
			giveUp()
			return
		}
		if !last {
			last = true
			timer.Reset(time.Until(attempts[current].clock.when()) + rest)
		}
	}
	// timeUp handles the end of the current attempt's time.
	timeUp := func() {
		a := &attempts[current]
		if !a.done {
			a.timedOut = true
			f.tried = append(f.tried, a.ep)
			f.lastErr = errDialTimedOut
			if f.attempt+1 < len(timeouts) && !last {
				next()
				return
			}
		}
		giveUp()
	}
	timeUp()
	stopping := p.ctx.Done()
	for running > 0 {
		select {
		case r := <-f.results:
			running--
			a := &attempts[r.i]
			r.ep = a.ep
			counted := a.done
			a.done = true
			switch {
			case decided || counted:
				if r.err == nil {
					r.conn.Close() // never carried data: a plain close
				}
			case r.err == nil:
				if r.ep != attempts[len(attempts)-1].ep {
					f.b.remember(f.client.Addr(), r.ep)
				}
				for i, b := range attempts {
					if !b.done && b.timedOut && b.ep != r.ep {
						f.attemptFailed(b.ep, errDialTimedOut)
						attempts[i].done = true
					}
				}
				finish(r)
			case isResourceExhausted(r.err):
				p.stats.Shed.Add(1)
				p.shed.log(r.err, f.sp.name.String())
				finish(r)
			case p.ctx.Err() != nil:
				finish(dialResult[C]{ep: r.ep, err: p.ctx.Err()})
			default:
				f.attemptFailed(r.ep, r.err)
				if !a.timedOut {
					f.tried = append(f.tried, r.ep)
				}
				f.lastErr = r.err
				if r.i == current {
					next()
				} else if running == 0 && attempts[current].done {
					giveUp()
				}
			}
		case i := <-f.expired:
			// The time of attempt i is up. One that is no longer the
			// current one, or whose outcome came first, has nothing
			// left to time; with no attempt to start any more (last),
			// the timer has the time.
			if !decided && i == current && !attempts[i].done && !last {
				timeUp()
			}
		case <-timer.C:
			if !decided {
				timeUp()
			}
		case <-stopping:
			stopping = nil // the attempts end with it
			if !decided {
				finish(dialResult[C]{err: p.ctx.Err()})
			}
		case err := <-gone:
			gone = nil
			if err != nil && !decided {
				// Nobody is left to dial for: no attempt counts as
				// failed, and the connection is not given up.
				klog.V(3).InfoS("Client failed while dialing; ending its dial attempts", "service", f.sp.name, "client", f.client, "err", err)
				finish(dialResult[C]{err: err})
			}
		}
	}
	if !decided {
		giveUp()
	}
}

// errDialTimedOut is why an attempt that had no answer in its time
// failed: the event loops' word for it too (the kernel's ETIMEDOUT), so
// that the logs of both builds say the same.
var errDialTimedOut error = syscall.ETIMEDOUT

// sumDurations is the sum of ds.
func sumDurations(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum
}

// worthDialing reports whether ep deserves a dial after the failures so
// far (lastErr, nil before the first). A dial that timed out may succeed
// with the next, longer timeout even on an endpoint already tried (its SYN
// or the answer may have been lost); one refused or unreachable at once
// would fail the same way again, so the connection is given up instead.
func worthDialing(ep netip.AddrPort, tried []netip.AddrPort, lastErr error) bool {
	return lastErr == nil || !slices.Contains(tried, ep) || isDialTimeout(lastErr)
}

func isDialTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) ||
		errors.As(err, &ne) && ne.Timeout()
}

// liveSet lets Close find and end the live connections of one kind that
// goroutines serve.
type liveSet[C interface {
	comparable
	abort()
}] struct {
	mu sync.Mutex // guards m
	m  map[C]struct{}
}

// add records c, unless ctx (the proxier's) has ended: then the caller
// must end c itself.
func (s *liveSet[C]) add(ctx context.Context, c C) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		return false
	}
	if s.m == nil {
		s.m = make(map[C]struct{})
	}
	s.m[c] = struct{}{}
	return true
}

func (s *liveSet[C]) remove(c C) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

func (s *liveSet[C]) abortAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.m {
		c.abort()
	}
}
