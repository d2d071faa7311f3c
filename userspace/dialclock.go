package userspace

import (
	"sync"
	"syscall"
	"time"
)

// dialClock times one dial attempt of dialWithFailover as the event loops
// time theirs (see tcpConn.dial and tcpConn.expired): from when its
// connect is sent, and its time is up only if the kernel has not finished
// the connect by then. In a burst of new connections (every client
// reconnecting after a restart) a goroutine whose connect the endpoint
// answered at once may run only much later, once the runtime's poller and
// scheduler get round to it behind thousands of others; counted from
// before the dial and ended by the timer alone, such an attempt "timed
// out", a second one raced it to another endpoint (an extra connection
// there), and the endpoint was passed over for a failure it never had.
// The event loop reads its events before its timers, so a connect that
// has finished by then is never taken for one that timed out.
type dialClock struct {
	timeout time.Duration
	// up is called, once, when the time is up and the connect has not
	// finished; under mu, so it must not block or use the clock.
	up func()

	mu       sync.Mutex      // guards the fields below
	rc       syscall.RawConn // the socket connecting; nil: one the clock cannot look at
	timer    *time.Timer
	deadline time.Time // when the time is up: from the clock's making until start
	state    clockState
}

type clockState uint8

const (
	clockIdle    clockState = iota // the connect is not sent yet
	clockRunning                   // the connect is sent, the time is running
	clockStopped                   // the dial ended (or its connect did) in time
	clockUp                        // the time was up with the connect unfinished: up was called
)

// newDialClock returns the clock of an attempt about to dial, with its
// timeout and what to do when its time is up.
func newDialClock(timeout time.Duration, up func()) *dialClock {
	return &dialClock{timeout: timeout, up: up, deadline: time.Now().Add(timeout)}
}

// start starts the time, as the connect of rc is about to be sent (nil:
// a socket the clock cannot look at, whose time is up at its deadline
// whatever). A dial must call it before it connects, and only then: a
// dial that ends before connecting has no time to run out.
func (c *dialClock) start(rc syscall.RawConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != clockIdle {
		return
	}
	c.rc = rc
	c.deadline = time.Now().Add(c.timeout)
	c.state = clockRunning
	c.timer = time.AfterFunc(c.timeout, c.fire)
}

// fire ends the time, unless the kernel has finished the connect
// meanwhile (connected, refused, unreachable): then its outcome is only
// waiting for its goroutine, and it counts as being in time.
func (c *dialClock) fire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != clockRunning {
		return
	}
	if c.rc != nil && connectEnded(c.rc) {
		c.state = clockStopped
		return
	}
	c.state = clockUp
	c.up()
}

// stop stops the clock once the dial has ended, and reports whether the
// time was up (up was called) before.
func (c *dialClock) stop() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == clockUp {
		return true
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	c.state = clockStopped
	return false
}

// when returns when the time is up, or was: from the connect, or for a
// dial that ended before it connected, from the clock's making.
func (c *dialClock) when() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline
}
