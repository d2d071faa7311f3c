//go:build linux

package userspace

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Go's io.Copy between two *net.TCPConn uses splice(2), but it takes a pipe
// (two fds) before it waits for data and keeps it while the connection is
// idle: six fds per idle proxied connection instead of two (DESIGN.md). We
// splice ourselves and take a pipe from a small pool only once the socket is
// readable, so an idle connection holds no pipe and no buffer.

const (
	spliceChunk  = 256 << 10 // bytes moved per splice call, and the pipe size we ask for
	maxIdlePipes = 64        // pipes kept for reuse; more are closed
	bufSize      = 32 << 10  // buffer size of the read/write fallback
)

type pipe struct{ r, w int }

var idlePipes = make(chan *pipe, maxIdlePipes)

func getPipe() (*pipe, error) {
	select {
	case p := <-idlePipes:
		return p, nil
	default:
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, err
	}
	// Best effort: a larger pipe means fewer splice calls for bulk
	// transfers; the default (64 KiB) is fine too.
	_, _ = unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, spliceChunk)
	return &pipe{r: fds[0], w: fds[1]}, nil
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
	unix.Close(p.r)
	unix.Close(p.w)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// copyStream copies from src to dst until src reaches EOF (nil error) or
// either side fails. progress is called with the size of every chunk
// written.
func copyStream(dst, src *net.TCPConn, progress func(int)) error {
	srcRC, err := src.SyscallConn()
	if err != nil {
		return err
	}
	dstRC, err := dst.SyscallConn()
	if err != nil {
		return err
	}
	canSplice := true
	for {
		var n int
		var done bool
		var err error
		if canSplice {
			n, done, err = spliceChunkOnce(dstRC, srcRC)
			switch {
			case errors.Is(err, errNoPipe):
				// Out of fds for a pipe: move this chunk through memory.
				n, done, err = bufferedChunkOnce(dst, srcRC)
			case errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSYS):
				// This pair of sockets cannot splice at all.
				canSplice = false
				continue
			}
		} else {
			n, done, err = bufferedChunkOnce(dst, srcRC)
		}
		if n > 0 {
			progress(n)
		}
		if err != nil || done {
			return err
		}
	}
}

var errNoPipe = errors.New("no pipe available")

// spliceChunkOnce waits until src is readable, then moves one chunk from src
// to dst through a pooled pipe. done reports EOF on src.
func spliceChunkOnce(dstRC, srcRC syscall.RawConn) (n int, done bool, err error) {
	var p *pipe
	var serr error
	rerr := srcRC.Read(func(fd uintptr) bool {
		if p == nil {
			if p, serr = getPipe(); serr != nil {
				return true
			}
		}
		for {
			var m int64
			m, serr = unix.Splice(int(fd), nil, p.w, nil, spliceChunk, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			n = int(m)
			if serr != unix.EINTR {
				break
			}
		}
		if serr == unix.EAGAIN {
			// Nothing to read: give the pipe back before waiting.
			putPipe(p)
			p = nil
			return false
		}
		return true
	})
	if p == nil && serr != nil && rerr == nil {
		return 0, false, errNoPipe
	}
	if rerr != nil || serr != nil {
		if p != nil {
			putPipe(p) // nothing was moved into it
		}
		if rerr != nil {
			return 0, false, rerr
		}
		return 0, false, os.NewSyscallError("splice", serr)
	}
	if n == 0 {
		putPipe(p)
		return 0, true, nil
	}
	left := n
	var werr error
	err = dstRC.Write(func(fd uintptr) bool {
		for left > 0 {
			m, e := unix.Splice(p.r, nil, int(fd), nil, left, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch e {
			case nil:
				left -= int(m)
			case unix.EINTR:
			case unix.EAGAIN:
				return false
			default:
				werr = e
				return true
			}
		}
		return true
	})
	if err == nil && werr != nil {
		err = os.NewSyscallError("splice", werr)
	}
	if left > 0 {
		p.close() // data left in it; never reuse
	} else {
		putPipe(p)
	}
	return n - left, false, err
}

// bufferedChunkOnce is the read/write fallback. Like the splice path it
// waits for readability before it takes a buffer from the pool.
func bufferedChunkOnce(dst *net.TCPConn, srcRC syscall.RawConn) (n int, done bool, err error) {
	var bp *[]byte
	var rerr error
	err = srcRC.Read(func(fd uintptr) bool {
		if bp == nil {
			bp = bufPool.Get().(*[]byte)
		}
		for {
			n, rerr = unix.Read(int(fd), *bp)
			if rerr != unix.EINTR {
				break
			}
		}
		if rerr == unix.EAGAIN {
			bufPool.Put(bp)
			bp = nil
			return false
		}
		return true
	})
	if err == nil && rerr != nil {
		err = os.NewSyscallError("read", rerr)
	}
	if err != nil || n <= 0 {
		if bp != nil {
			bufPool.Put(bp)
		}
		return 0, err == nil, err
	}
	_, err = dst.Write((*bp)[:n])
	bufPool.Put(bp)
	return n, false, err
}
