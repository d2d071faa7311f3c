//go:build unix

package userspace

import "golang.org/x/sys/unix"

// fdLimit returns the soft RLIMIT_NOFILE (Go's runtime raised it to the
// hard limit at start), or 0 when it cannot be read. RLIM_INFINITY comes
// back as a huge number, which fdCeilings.set takes for no limit.
func fdLimit() uint64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return uint64(r.Cur) // int64 on some BSDs
}
