package userspace

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// isResourceExhausted reports errors that mean "this process or host is out
// of file descriptors or buffers" rather than "this endpoint is bad".
func isResourceExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// shedder keeps one spare file descriptor. When accept fails with EMFILE the
// pending connection would sit in the backlog and make the listener spin;
// instead we give up the spare, accept the connection, reset it and take the
// spare back. The client sees a reset at once and the proxy keeps running
// (the legacy proxier panicked here: kubernetes/kubernetes#6716).
type shedder struct {
	open  func() (*os.File, error) // opens a spare; a test may replace it
	pause func()                   // withSpare's wait between attempts; a test may replace it

	mu    sync.Mutex // guards spare and closed
	spare *os.File
	// closed: close was called; no spare is opened again, since nothing
	// would close it (a loop may shed after the proxier closed it, before
	// the loop stops).
	closed bool
	// missing says the spare is given up (withSpare) or could not be
	// taken back: retake tries again after each socket opened for a
	// connection, which a free descriptor allowed.
	missing atomic.Bool

	logged  logThrottle
	noSpare logThrottle
}

func newShedder() *shedder {
	s := &shedder{
		open:  func() (*os.File, error) { return os.Open(os.DevNull) },
		pause: func() { time.Sleep(spareRetry) },
	}
	_ = s.retakeLocked()
	return s
}

// withSpare gives up the spare descriptor while f runs (f accepts and
// resets one connection, and says what came of it), then takes it back.
// Another goroutine or loop may take the freed descriptor first (a dial,
// an accept, a scrape of /metrics reading /proc/self/fd): f then fails,
// and withSpare tries again, twice at most, a moment later, since such a
// descriptor is usually given back at once. The spare counts as missing
// from the moment it is given up, so that a socket opened for a connection
// meanwhile waits for the attempt to end and then, if it holds the spare's
// number, gives it back (tookSpare); withSpare waits between attempts
// unlocked, to let it. If f still fails, the spare may be missing until
// retake gets it back: withSpare reports shedFailed, and the caller should
// wait a little before it accepts again, or it would spin on a listener it
// cannot drain.
func (s *shedder) withSpare(f func() shedResult) shedResult {
	var r shedResult
	for try := range spareTries {
		if try > 0 {
			s.pause()
		}
		if r = s.shedOnce(f); r != shedFailed {
			break
		}
	}
	return r
}

// shedOnce is one attempt of withSpare.
func (s *shedder) shedOnce(f func() shedResult) shedResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spare != nil {
		s.missing.Store(true) // before the number is free (see withSpare)
		s.dropSpareLocked()
	}
	r := f()
	_ = s.retakeLocked()
	return r
}

// spareTries and spareRetry bound how often and how long apart withSpare
// tries to shed a connection when its freed descriptor was taken.
const (
	spareTries = 3
	spareRetry = time.Millisecond
)

// shedResult is what an attempt to shed a connection came to.
type shedResult int

const (
	// shedNone: no connection was waiting, so none was shed and the spare
	// stayed in hand. On Linux accept fails with EMFILE whether or not one
	// waits: the kernel takes the new descriptor before it looks at the
	// queue.
	shedNone shedResult = iota
	// shedOne: one waiting connection was accepted with the spare and reset.
	shedOne
	// shedFailed: a connection waits but could not be accepted: the spare
	// was missing, or another goroutine took the descriptor it freed.
	shedFailed
)

// retake takes the spare back if it is missing. It reports false only
// when the spare is missing for want of descriptors: the socket the
// caller just opened for a connection took the last one, and ending it
// gives the spare its number (see tookSpare). A descriptor was free when
// the caller opened it, and the check costs one atomic load while the
// spare is in hand. A spare that cannot be opened for another reason (no
// /dev/null) never costs a connection.
func (s *shedder) retake() bool {
	if !s.missing.Load() {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !isResourceExhausted(s.retakeLocked())
}

// tookSpare checks a socket just opened for a connection (accepted or
// dialed), a UDP session, a splice pipe or a listener: when the spare is
// missing for want of descriptors (retake), the socket took the number a
// shed elsewhere had freed for a moment while the spare was closed. Then
// it ends the socket with end, so that the spare takes the number back and
// the clients after it are reset, not left waiting; and it reports true,
// for the caller to count a shed (or, for a listener, refuse it).
func (s *shedder) tookSpare(end func()) bool {
	if s.retake() {
		return false
	}
	end()
	s.retake()
	return true
}

// retakeLocked reopens a missing spare, unless the shedder is closed, and
// returns why it could not.
func (s *shedder) retakeLocked() error {
	if s.spare != nil || s.closed {
		return nil
	}
	f, err := s.open()
	if err == nil {
		s.spare = f
	}
	s.missing.Store(err != nil)
	return err
}

// report counts and logs one connection shed for want of descriptors (err),
// or, when none could be (shed false: no spare), says that new connections
// wait; both at most once a second, with how many there were since.
func (s *shedder) report(stats *Stats, err error, service string, shed bool) {
	if !shed {
		if n, ok := s.noSpare.note(time.Second); ok {
			klog.ErrorS(err, "Out of file descriptors, without a spare one to shed a connection with; new connections wait until descriptors are free", "service", service, "timesSinceLastSaid", n)
		}
		return
	}
	stats.Shed.Add(1)
	s.log(err, service)
}

// log logs a resource-exhaustion event at most once a second, with how
// many there were since the last line.
func (s *shedder) log(err error, service string) {
	if n, ok := s.logged.note(time.Second); ok {
		klog.ErrorS(err, "Out of file descriptors or buffers; shedding new connections", "service", service, "shedSinceLastSaid", n)
	}
}

// close closes the spare for good. The spare then counts as in hand, so
// that no socket is ended for want of it.
func (s *shedder) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.dropSpareLocked()
	s.missing.Store(false)
}

// dropSpareLocked closes the spare, if it is open.
func (s *shedder) dropSpareLocked() {
	if s.spare != nil {
		s.spare.Close()
		s.spare = nil
	}
}
