//go:build linux

package userspace

import (
	"context"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// dialWithClock dials ep as the goroutine build's dials do (see
// dialWithFailover): the clock starts just before the connect, with the
// socket's RawConn. It returns the connection, or the dial's error once
// ctx ends it.
func dialWithClock(ctx context.Context, ep string, clock *dialClock) (net.Conn, error) {
	d := net.Dialer{ControlContext: func(_ context.Context, _, _ string, rc syscall.RawConn) error {
		clock.start(rc)
		return nil
	}}
	return d.DialContext(ctx, "tcp4", ep)
}

// TestDialClockUpWhileConnecting: an attempt whose connect is still under
// way (the endpoint drops SYNs) when its timeout has passed since the
// connect was sent is up: up is called once, no earlier than the timeout
// after start, and stop then says the time was up.
func TestDialClockUpWhileConnecting(t *testing.T) {
	stuck, _ := synDroppingEndpoint(t)
	const timeout = 200 * time.Millisecond
	var ups atomic.Int32
	upAt := make(chan time.Time, 4)
	clock := newDialClock(timeout, func() {
		ups.Add(1)
		upAt <- time.Now()
	})
	var started atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	dialed := make(chan error, 1)
	go func() {
		d := net.Dialer{ControlContext: func(_ context.Context, _, _ string, rc syscall.RawConn) error {
			started.Store(time.Now().UnixNano())
			clock.start(rc)
			return nil
		}}
		c, err := d.DialContext(ctx, "tcp4", stuck.String())
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	select {
	case at := <-upAt:
		if d := at.Sub(time.Unix(0, started.Load())); d < timeout {
			t.Errorf("the time was up %v after the connect was sent, before the %v timeout", d, timeout)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the time was never up while the connect hung")
	}
	if !clock.stop() {
		t.Error("stop says the time was not up, after up was called")
	}
	cancel()
	if err := <-dialed; err == nil {
		t.Error("the dial to an endpoint that drops SYNs connected")
	}
	if !clock.stop() {
		t.Error("a second stop says the time was not up")
	}
	if n := ups.Load(); n != 1 {
		t.Errorf("up was called %d times, want once", n)
	}
}

// TestDialClockConnectEndedIsInTime: when the time runs out (fire) after
// the kernel has finished the connect, but before the dial's goroutine got
// round to stopping the clock, the attempt was in time: up is not called
// and stop says so. Also for a socket already closed: its dial returned.
// fire is called as the timer would call it, so that the connect is
// surely over by then.
func TestDialClockConnectEndedIsInTime(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, closed := range []bool{false, true} {
		var ups atomic.Int32
		clock := newDialClock(time.Hour, func() { ups.Add(1) })
		c, err := dialWithClock(context.Background(), ln.Addr().String(), clock)
		if err != nil {
			t.Fatal(err)
		}
		if closed {
			c.Close()
		}
		clock.fire()
		if clock.stop() || ups.Load() != 0 {
			t.Errorf("closed %v: a connect that had ended counted as out of time (up called %d times)", closed, ups.Load())
		}
		c.Close()
	}
}

// TestDialClockWithoutSocket: a clock started without a socket to look at
// (nil, as SCTP's dial starts it) is up at its deadline whatever.
func TestDialClockWithoutSocket(t *testing.T) {
	var ups atomic.Int32
	clock := newDialClock(time.Hour, func() { ups.Add(1) })
	clock.start(nil)
	clock.fire() // as its timer would, an hour on
	if !clock.stop() || ups.Load() != 1 {
		t.Errorf("a clock without a socket: stop says up %v, up called %d times; want up, once", clock.stop(), ups.Load())
	}
}

// TestDialClockStoppedIsNotUp: once the dial has ended (stop), its time
// is never up: not when its timer fires as stop runs, and not when a
// start comes after the stop (a dial must start its clock only before it
// connects).
func TestDialClockStoppedIsNotUp(t *testing.T) {
	t.Run("FireAfterStop", func(t *testing.T) {
		var ups atomic.Int32
		clock := newDialClock(time.Hour, func() { ups.Add(1) })
		clock.start(nil)
		if clock.stop() {
			t.Fatal("stop says the time was up before it was")
		}
		clock.fire() // a timer that fired as stop ran
		if clock.stop() || ups.Load() != 0 {
			t.Errorf("the timer's firing after stop made the time up (up called %d times)", ups.Load())
		}
	})
	t.Run("StartAfterStop", func(t *testing.T) {
		var ups atomic.Int32
		clock := newDialClock(time.Hour, func() { ups.Add(1) })
		made := clock.when()
		clock.stop() // the dial ended before it connected
		clock.start(nil)
		clock.fire()
		if clock.stop() || ups.Load() != 0 {
			t.Errorf("a start after stop ran the time (up called %d times)", ups.Load())
		}
		if w := clock.when(); !w.Equal(made) {
			t.Errorf("a start after stop moved the deadline from %v to %v", made, w)
		}
	})
}

// TestDialClockWhen: when is the deadline from the clock's making until
// the connect is sent (start), then from the connect: the time the
// attempts not made leave to the racing ones counts from there (see
// failover.run).
func TestDialClockWhen(t *testing.T) {
	const timeout = time.Hour
	before := time.Now()
	clock := newDialClock(timeout, func() {})
	defer clock.stop()
	made := clock.when()
	if made.Before(before.Add(timeout)) || made.After(time.Now().Add(timeout)) {
		t.Fatalf("before start, when is %v from the making, want %v", made.Sub(before), timeout)
	}
	// The connect is sent later than the making: by at least a tick of
	// the clock, which a fast machine may not see pass otherwise.
	for !time.Now().After(made.Add(-timeout)) {
	}
	sent := time.Now()
	clock.start(nil)
	if w := clock.when(); w.Before(sent.Add(timeout)) || w.After(time.Now().Add(timeout)) {
		t.Fatalf("after start, when is %v from the connect, want %v", w.Sub(sent), timeout)
	}
}
