//go:build !linux || goroutines

package userspace

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// stallCheck is how long a write that cannot go on (the destination
// takes nothing) waits before it looks at the source for a failure: a
// source that was reset while its data waited would otherwise be noticed
// only once the destination reads again, which a stalled one may never do.
const stallCheck = 5 * time.Second

type progressWriter struct {
	w, src    *net.TCPConn
	progress  func(int)
	srcFailed func(error)
}

// Write writes b to w. A write that cannot go on looks at the source
// every stallCheck: a failure found there is reported to srcFailed, and
// the write goes on, since what the source sent before it is still
// delivered (it ends when the connection is reset).
func (pw progressWriter) Write(b []byte) (int, error) {
	written := 0
	for {
		_ = pw.w.SetWriteDeadline(time.Now().Add(stallCheck))
		n, err := pw.w.Write(b[written:])
		if n > 0 {
			pw.progress(n)
			written += n
		}
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return written, err
		}
		if serr := socketError(pw.src); serr != nil {
			pw.srcFailed(serr)
		}
	}
}

// copyStream copies from src to dst until src reaches EOF (nil error) or
// either side fails; a failure of src found while a write waits is
// reported to srcFailed, and copying goes on (progressWriter).
func copyStream(dst, src *net.TCPConn, progress func(int), srcFailed func(error)) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	_, err := io.CopyBuffer(progressWriter{dst, src, progress, srcFailed}, struct{ io.Reader }{src}, *bp)
	return err
}
