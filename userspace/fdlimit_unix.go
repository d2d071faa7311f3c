//go:build unix

package userspace

import "golang.org/x/sys/unix"

// fdLimit returns the soft RLIMIT_NOFILE (Go's runtime raised it to the
// hard limit at start), or 0 when it cannot be read.
func fdLimit() uint64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return 0
	}
	return r.Cur
}
