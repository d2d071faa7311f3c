package userspace

import (
	"errors"
	"net"
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

	logMu   sync.Mutex // guards lastLog
	lastLog time.Time
}

func newShedder() *shedder {
	s := &shedder{}
	s.spare, _ = os.Open(os.DevNull)
	return s
}

// shedTCP accepts and resets one pending connection from ln.
func (s *shedder) shedTCP(ln *net.TCPListener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spare != nil {
		s.spare.Close()
		s.spare = nil
	}
	if c, err := ln.AcceptTCP(); err == nil {
		resetTCP(c)
	}
	s.spare, _ = os.Open(os.DevNull)
}

// logf logs a resource-exhaustion event at most once a second.
func (s *shedder) log(err error, service string) {
	s.logMu.Lock()
	now := time.Now()
	if now.Sub(s.lastLog) < time.Second {
		s.logMu.Unlock()
		return
	}
	s.lastLog = now
	s.logMu.Unlock()
	klog.ErrorS(err, "Out of file descriptors or buffers; shedding new connections", "service", service)
}

func (s *shedder) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spare != nil {
		s.spare.Close()
		s.spare = nil
	}
}

// resetTCP closes c with SO_LINGER 0, so the peer gets a RST instead of a
// FIN and no socket lingers in the kernel.
func resetTCP(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}
