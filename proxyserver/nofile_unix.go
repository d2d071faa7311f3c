//go:build unix

package proxyserver

import "golang.org/x/sys/unix"

// openFilesLimit returns the soft RLIMIT_NOFILE, which Go's runtime
// raised to the hard limit at start and the data plane reads too (see
// httpLimits.scaled), or 0 when it cannot be read. RLIM_INFINITY comes
// back as a huge number, which scaled takes for a large limit.
func openFilesLimit() uint64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return uint64(r.Cur) // int64 on some BSDs
}
