package userspace

import (
	"errors"
	"os"
	"sync"
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
	mu    sync.Mutex // guards spare
	spare *os.File

	logged logThrottle
}

func newShedder() *shedder {
	s := &shedder{}
	s.spare, _ = os.Open(os.DevNull)
	return s
}

// withSpare gives up the spare descriptor while f runs (f accepts and
// resets one connection, and reports whether it could), then takes it
// back. Another goroutine or loop may take the freed descriptor first, and
// then the spare is lost until a descriptor is free again: withSpare
// reports false, and the caller should wait a little before it accepts
// again, or it would spin on a listener it cannot drain.
func (s *shedder) withSpare(f func() bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spare != nil {
		s.spare.Close()
		s.spare = nil
	}
	shed := f()
	s.spare, _ = os.Open(os.DevNull)
	return shed
}

// log logs a resource-exhaustion event at most once a second, with how
// many there were since the last line.
func (s *shedder) log(err error, service string) {
	if n, ok := s.logged.note(time.Second); ok {
		klog.ErrorS(err, "Out of file descriptors or buffers; shedding new connections", "service", service, "shedSinceLastSaid", n)
	}
}

func (s *shedder) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spare != nil {
		s.spare.Close()
		s.spare = nil
	}
}
