//go:build !linux || goroutines

package userspace

import "syscall"

// conn reports whether sc, a connection Go's net package opened, may be
// kept (see fdreserve.go). It costs a small allocation and no system call.
func (c *fdCeilings) conn(sc syscall.Conn) bool {
	fd, ok := fdOf(sc)
	return !ok || c.connFD(fd)
}
