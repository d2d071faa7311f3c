//go:build linux && !goroutines

package userspace

import (
	"container/heap"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// On Linux the data plane runs on a few event loops, nginx-style: each is a
// goroutine blocked in epoll_wait(2) that accepts, dials, splices and
// forwards datagrams itself. A connection or UDP session then costs its
// syscalls and a little memory, and nothing else: no goroutines, no
// hand-off between goroutines for every chunk of data, no runtime timer
// (deadlines sit in a heap the loop checks). Every loop waits on every TCP
// listening socket, with EPOLLEXCLUSIVE: the kernel wakes one loop that is
// waiting, so a new connection goes to an idle loop, and stays there. A UDP
// service address has a socket in every loop, all on one port with
// SO_REUSEPORT (udpGroup); a session stays on the loop of the socket its
// client's datagrams arrive on.

// eventLoop owns a set of sockets. Everything it owns is touched only on
// its goroutine; other goroutines hand it work through do.
type eventLoop struct {
	p      *Proxier
	epfd   int
	wakefd int // eventfd that interrupts epoll_wait when work is queued

	mu      sync.Mutex // guards the fields below
	cmds    []loopCmd
	stopped bool

	// Owned by the loop goroutine.
	handlers map[int32]loopHandler
	timers   timerHeap
	batch    *recvBatch // UDP receive batch
	tcpBuf   []byte     // TCP scratch buffer for small reads
	events   []unix.EpollEvent
	toClose  []int // closed at the end of the batch (see closeFD)
	quit     bool
	done     chan struct{}
	// quietSince is when the loop's waits started to come back empty
	// (zero: the last one had events); see waitBusy.
	quietSince time.Time
	parked     atomic.Bool // waiting in the runtime's poller (see park)
	// noPipesUntil: a pipe could not be had; splice no bulk data before
	// then (see pipesShort).
	noPipesUntil time.Time
}

// loopCmd is work handed to the loop; done is closed once it has run and
// the descriptors it closed are closed.
type loopCmd struct {
	f    func()
	done chan struct{}
}

// loopHandler is told about epoll events on a socket it registered.
type loopHandler interface{ event(ev uint32) }

// timed is something with a deadline in the loop's heap. expired is called
// once the deadline has passed; it returns the next deadline, or the zero
// time when it is done with the timer.
type timed interface{ expired(now time.Time) time.Time }

type timerEntry struct {
	deadline time.Time
	index    int // in the heap; -1 when not in it
	owner    timed
}

// loopSet is the proxier's event loops.
type loopSet struct {
	loopOnce sync.Once // starts the loops on first use
	loops    []*eventLoop
	loopErr  error
	procs    int // Ps added for the loops (see addProcs)
}

// loops returns the proxier's event loops, starting them on first use.
func (p *Proxier) eventLoops() ([]*eventLoop, error) {
	p.loopOnce.Do(func() {
		n := min(runtime.GOMAXPROCS(0), 4)
		p.procs = n
		addProcs(n)
		for range n {
			lp, err := startEventLoop(p)
			if err != nil {
				p.loopErr = err
				return
			}
			p.loops = append(p.loops, lp)
		}
	})
	if p.loopErr != nil {
		return nil, p.loopErr
	}
	return p.loops, nil
}

// stopLoops ends every event loop; Close calls it once the listeners are
// closed.
func (s *loopSet) stopLoops() {
	for _, lp := range s.loops {
		lp.stop()
	}
	addProcs(-s.procs)
	s.procs = 0
}

// A busy loop waits in epoll_wait itself, through a raw system call that
// keeps its P (see eventLoop.run), so each loop costs the scheduler one P
// while it is busy. GOMAXPROCS is raised by the number of loops running,
// so the rest of the program (informers, metrics, the garbage collector)
// keeps the Ps it would have had, and set back when they stop.
var procs struct {
	sync.Mutex
	base  int // GOMAXPROCS before any loop started
	added int
}

func addProcs(n int) {
	if n == 0 {
		return
	}
	procs.Lock()
	defer procs.Unlock()
	if procs.added == 0 {
		procs.base = runtime.GOMAXPROCS(0)
	}
	procs.added += n
	runtime.GOMAXPROCS(procs.base + procs.added)
}

func startEventLoop(p *Proxier) (*eventLoop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	// Non-blocking, so os.NewFile hands it to the runtime's poller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	lp := &eventLoop{
		p: p, epfd: epfd, wakefd: wakefd,
		handlers: make(map[int32]loopHandler),
		batch:    newRecvBatch(),
		tcpBuf:   make([]byte, smallRead),
		events:   make([]unix.EpollEvent, 128),
		done:     make(chan struct{}),
	}
	if err := lp.register(wakefd, unix.EPOLLIN, nil); err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return nil, err
	}
	p.wg.Add(1)
	go lp.run()
	return lp, nil
}

// register adds fd to the loop with the given epoll events.
func (lp *eventLoop) register(fd int, events uint32, h loopHandler) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	if err := rawEpollCtl(lp.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl add: %w", err)
	}
	if h != nil {
		lp.handlers[int32(fd)] = h
	}
	return nil
}

// unregister takes fd out of the loop without closing it.
func (lp *eventLoop) unregister(fd int) {
	delete(lp.handlers, int32(fd))
	_ = rawEpollCtl(lp.epfd, unix.EPOLL_CTL_DEL, fd, &unix.EpollEvent{})
}

// closeFD drops fd's handler and closes fd once the current batch of
// events has been handled. Closing a descriptor that was never duplicated
// takes it out of the epoll set, which saves an EPOLL_CTL_DEL; waiting for
// the end of the batch keeps a later event of the batch, meant for this
// fd, from reaching a new socket that reused its number.
func (lp *eventLoop) closeFD(fd int) {
	delete(lp.handlers, int32(fd))
	lp.toClose = append(lp.toClose, fd)
}

func (lp *eventLoop) flushCloses() {
	for _, fd := range lp.toClose {
		rawClose(fd)
	}
	lp.toClose = lp.toClose[:0]
}

// do runs f on the loop goroutine and waits for it. Once the loop has
// stopped it does nothing.
func (lp *eventLoop) do(f func()) {
	done := make(chan struct{})
	lp.mu.Lock()
	if lp.stopped {
		lp.mu.Unlock()
		return
	}
	lp.cmds = append(lp.cmds, loopCmd{f: f, done: done})
	lp.mu.Unlock()
	lp.wake()
	<-done
}

// wake interrupts the loop's wait so it runs the queued commands.
func (lp *eventLoop) wake() {
	var one [8]byte
	one[0] = 1
	_, _ = rawWrite(lp.wakefd, one[:])
}

// stop ends the loop after closing everything it owns.
func (lp *eventLoop) stop() {
	lp.do(func() { lp.quit = true })
	<-lp.done
}

// closer is a handler the loop closes when it stops. shut must be
// idempotent: one owner may be registered for several sockets.
type closer interface{ shut() }

func (lp *eventLoop) run() {
	defer lp.p.wg.Done()
	defer close(lp.done)
	// A busy loop waits in epoll_wait itself, through a raw system call:
	// the goroutine keeps its P (the runtime sees it running), so nothing
	// in the runtime stands between the kernel's wake-up and the loop.
	// That is what nginx's workers do, and it saves several µs per wake-up
	// over the runtime's poller, which must wake an M, find it a P and
	// switch to the goroutine; it also lets every loop wake at once,
	// where the poller wakes the others only as one M gets round to them.
	// A wait through syscall.Syscall instead would have its P taken by
	// sysmon and handed back, which cost more than the proxying.
	//
	// The scheduler preempts a goroutine that seems to run for 10 ms with
	// a signal, which ends the wait early (EINTR); a stop-the-world does the
	// same. Each wait is also bounded by busyWait, for when asynchronous
	// preemption is turned off. An idle loop must hold no P and take no
	// signals: once its waits have come back empty for busyWait, it parks
	// in the runtime's poller (see park) until something happens.
	now := time.Now() // read once per round: by the timers, then the next wait
	for !lp.quit {
		n, idle, werr := lp.waitBusy(now)
		if idle {
			n, werr = lp.park()
		}
		if n > 0 {
			lp.quietSince = time.Time{}
		}
		if werr != nil && werr != unix.EINTR {
			klog.ErrorS(werr, "Event loop: epoll_wait failed")
			time.Sleep(10 * time.Millisecond)
			continue
		}
		woken := false
		for i := range max(n, 0) {
			ev := lp.events[i]
			if ev.Fd == int32(lp.wakefd) {
				woken = true
				continue
			}
			if h := lp.handlers[ev.Fd]; h != nil {
				h.event(ev.Events)
			}
		}
		if woken {
			var buf [8]byte
			_, _ = rawRead(lp.wakefd, buf[:])
			lp.mu.Lock()
			cmds := lp.cmds
			lp.cmds = nil
			lp.mu.Unlock()
			for _, c := range cmds {
				c.f()
			}
			// The batch's events are handled: close now, so a caller that
			// closed a listener finds its port closed when do returns.
			lp.flushCloses()
			for _, c := range cmds {
				if c.done != nil {
					close(c.done)
				}
			}
		}
		now = time.Now()
		lp.fire(now)
		lp.flushCloses()
	}
	// Take no more work, run what was handed over already, then close what
	// is left: connections that outlived their listeners, and anything
	// Close did not reach.
	lp.mu.Lock()
	lp.stopped = true
	cmds := lp.cmds
	lp.cmds = nil
	lp.mu.Unlock()
	for _, c := range cmds {
		c.f()
		if c.done != nil {
			close(c.done)
		}
	}
	for _, h := range maps.Clone(lp.handlers) {
		if c, ok := h.(closer); ok {
			c.shut()
		}
	}
	lp.flushCloses()
	unix.Close(lp.epfd)
	unix.Close(lp.wakefd)
}

// busyWait is how long a loop waits for events in epoll_wait itself,
// holding its P, before it parks in the runtime's poller.
const busyWait = 50 * time.Millisecond

// waitBusy waits in epoll_wait until an event, the next timer deadline, or
// busyWait after the loop's waits started to come back empty. idle says
// that time has come. now is the time the loop last read: a few µs old at
// most, which a wait counted in whole milliseconds, rounded up, absorbs.
func (lp *eventLoop) waitBusy(now time.Time) (n int, idle bool, err error) {
	if lp.quietSince.IsZero() {
		lp.quietSince = now
	}
	until := lp.quietSince.Add(busyWait)
	if !now.Before(until) {
		return 0, true, nil
	}
	n, err = lp.waitUntil(now, until)
	return n, false, err
}

// waitUntil waits in epoll_wait itself for an event, until until or the
// next timer deadline, whichever comes first. epoll_wait counts whole
// milliseconds: the wait is rounded up, so a timer is never checked before
// it is due.
func (lp *eventLoop) waitUntil(now, until time.Time) (int, error) {
	if next := lp.nextDeadline(); !next.IsZero() && next.Before(until) {
		until = next
	}
	ms := max(0, int((until.Sub(now)+time.Millisecond-1)/time.Millisecond))
	return rawEpollWait(lp.epfd, lp.events, ms)
}

// park waits for events in the runtime's poller, holding no P, until one
// comes or the next timer is due. The epoll descriptor is pollable
// (readable while events are pending), but the poller gets it only while
// the loop is parked, through a duplicate closed on the way out: were it
// registered all the time, every event would also wake the runtime's
// poller for nothing. Without a descriptor to spare, the loop waits in
// epoll_wait itself again.
func (lp *eventLoop) park() (int, error) {
	wait := func() (int, error) {
		now := time.Now()
		return lp.waitUntil(now, now.Add(busyWait))
	}
	dup, err := unix.FcntlInt(uintptr(lp.epfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return wait()
	}
	if !lp.p.fds.connFD(dup) {
		unix.Close(dup) // down to the reserve (fdreserve.go)
		return wait()
	}
	f := os.NewFile(uintptr(dup), "epoll")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return wait()
	}
	if next := lp.nextDeadline(); !next.IsZero() {
		_ = f.SetReadDeadline(next)
	}
	var n int
	var werr error
	lp.parked.Store(true)
	err = rc.Read(func(fd uintptr) bool {
		n, werr = rawEpollWait(int(fd), lp.events, 0)
		return n != 0 || (werr != nil && werr != unix.EINTR)
	})
	lp.parked.Store(false)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, err
	}
	return n, werr
}

// nextDeadline is the earliest timer deadline, or zero when there is none.
func (lp *eventLoop) nextDeadline() time.Time {
	if len(lp.timers) == 0 {
		return time.Time{}
	}
	return lp.timers[0].deadline
}

// schedule puts e in the heap at deadline, or moves it there.
func (lp *eventLoop) schedule(e *timerEntry, deadline time.Time) {
	e.deadline = deadline
	if e.index >= 0 {
		heap.Fix(&lp.timers, e.index)
		return
	}
	heap.Push(&lp.timers, e)
}

// unschedule takes e out of the heap.
func (lp *eventLoop) unschedule(e *timerEntry) {
	if e.index >= 0 {
		heap.Remove(&lp.timers, e.index)
	}
}

// fire runs the timers whose deadline has passed.
func (lp *eventLoop) fire(now time.Time) {
	for len(lp.timers) > 0 {
		e := lp.timers[0]
		if e.deadline.After(now) {
			return
		}
		next := e.owner.expired(now)
		if next.IsZero() {
			lp.unschedule(e)
			continue
		}
		if !next.After(now) {
			next = now.Add(time.Millisecond) // never spin on a deadline in the past
		}
		e.deadline = next
		heap.Fix(&lp.timers, e.index)
	}
}

// timerHeap orders timer entries by deadline (container/heap).
type timerHeap []*timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timerHeap) Push(x any) {
	e := x.(*timerEntry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *timerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.index = -1
	*h = old[:len(old)-1]
	return e
}
