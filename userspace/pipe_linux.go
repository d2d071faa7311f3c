//go:build linux && !goroutines

package userspace

import (
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Go's io.Copy between two *net.TCPConn uses splice(2), but it takes a pipe
// (two fds) before it waits for data and keeps it while the connection is
// idle: six fds per idle proxied connection instead of two (DESIGN.md). The
// event loop splices itself and takes a pipe from a small pool only while
// data is in flight, so an idle connection holds no pipe and no buffer.

const (
	spliceChunk  = 256 << 10 // bytes moved per splice call, and the pipe size we ask for
	maxIdlePipes = 64        // pipes kept for reuse; more are closed
	// pipeRetry is how long a loop copies bulk data through its scratch
	// buffer after a pipe could not be had, before it tries pipes again.
	pipeRetry = 100 * time.Millisecond
)

// pipesShort reports whether the loop recently found no descriptors for a
// pipe, so bulk data keeps going through the scratch buffer for now.
func (lp *eventLoop) pipesShort() bool {
	return !lp.noPipesUntil.IsZero() && time.Now().Before(lp.noPipesUntil)
}

type pipe struct{ r, w int }

// idlePipes is shared by the event loops.
var idlePipes = make(chan *pipe, maxIdlePipes)

// getPipe takes a pipe from the pool, or makes one whose descriptors are
// under px's ceiling and not on the spare's number: the pool would keep
// it (tookSpare).
func getPipe(px *Proxier) (*pipe, error) {
	select {
	case p := <-idlePipes:
		return p, nil
	default:
	}
	var pfd [2]int
	if err := unix.Pipe2(pfd[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, err
	}
	closePipe := func() {
		rawClose(pfd[0])
		rawClose(pfd[1])
	}
	if err := px.keepFD(max(pfd[0], pfd[1]), closePipe); err != nil {
		return nil, err
	}
	// Best effort: a larger pipe means fewer splice calls for bulk
	// transfers; the default (64 KiB) is fine too.
	_, _ = unix.FcntlInt(uintptr(pfd[1]), unix.F_SETPIPE_SZ, spliceChunk)
	return &pipe{r: pfd[0], w: pfd[1]}, nil
}

// putPipe returns an empty pipe to the pool.
func putPipe(p *pipe) {
	select {
	case idlePipes <- p:
	default:
		p.close()
	}
}

func (p *pipe) close() {
	rawClose(p.r)
	rawClose(p.w)
}

// pipesLog throttles logPipes.
var pipesLog logThrottle

// logPipes logs, at most once a minute, that bulk data is being copied
// through memory for want of descriptors for splice pipes.
func logPipes(err error, service string) {
	if _, ok := pipesLog.note(sayAgainAfter); ok {
		klog.ErrorS(err, "Out of file descriptors for splice pipes; copying through memory meanwhile (connections are kept)", "service", service)
	}
}
