//go:build !linux || goroutines

package userspace

import (
	"io"
	"net"
	"sync"
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

type progressWriter struct {
	w        io.Writer
	progress func(int)
}

func (pw progressWriter) Write(b []byte) (int, error) {
	n, err := pw.w.Write(b)
	if n > 0 {
		pw.progress(n)
	}
	return n, err
}

// copyStream copies from src to dst until src reaches EOF (nil error) or
// either side fails.
func copyStream(dst, src *net.TCPConn, progress func(int)) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	_, err := io.CopyBuffer(progressWriter{dst, progress}, struct{ io.Reader }{src}, *bp)
	return err
}
