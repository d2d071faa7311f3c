//go:build unix

package userspace

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// shedFrom sheds one connection waiting on the listening socket rc, whose
// accept has just failed for want of descriptors; the goroutine accept
// loops (TCP where the event loops do not run, and SCTP) call it. It never
// waits: Go's Accept would park on the poller while the spare is given up,
// and a dial on another goroutine would take the freed descriptor, so the
// next client found no spare and waited for as long as descriptors were
// short. So it gives the spare up only when poll(2) says a connection
// waits, accepts without waiting, resets what it got and takes the spare
// back at once.
func (s *shedder) shedFrom(rc syscall.RawConn) shedResult {
	result := shedNone
	if err := rc.Control(func(fd uintptr) { result = s.shedFD(int(fd)) }); err != nil {
		return shedNone // closed: the next accept says so
	}
	return result
}

// shedFD sheds one connection waiting on the non-blocking listening socket
// lfd (see shedFrom).
func (s *shedder) shedFD(lfd int) shedResult {
	if !connWaiting(lfd) {
		return shedNone
	}
	return s.withSpare(func() shedResult {
		for range 8 {
			nfd, err := acceptCloexec(lfd)
			switch err {
			case nil:
				_ = unix.SetsockoptLinger(nfd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
				unix.Close(nfd)
				return shedOne
			case unix.EINTR, unix.ECONNABORTED:
				continue // the next waiting connection, if any
			case unix.EAGAIN:
				return shedNone
			default:
				return shedFailed
			}
		}
		return shedNone
	})
}

// connWaiting reports whether a connection waits to be accepted on the
// listening socket fd, without waiting and without a descriptor. When poll
// fails, it says yes and lets accept tell.
func connWaiting(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for range 4 {
		n, err := unix.Poll(pfd, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0
	}
	return true
}

// acceptCloexec accepts a connection on fd, close-on-exec as Go's own
// accepts are, so a child started meanwhile (iptables) cannot keep it open
// past its reset.
func acceptCloexec(fd int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	nfd, _, err := unix.Accept(fd)
	if err != nil {
		return -1, err
	}
	unix.CloseOnExec(nfd)
	return nfd, nil
}
