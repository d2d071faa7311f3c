//go:build !unix

package userspace

import "syscall"

// shedFrom would shed one connection waiting on the listening socket rc
// without waiting for it; this system's listeners cannot accept so, and
// their accepts do not fail for want of descriptors (Windows has no
// per-process limit on sockets), so it reports that none could be.
func (s *shedder) shedFrom(syscall.RawConn) shedResult { return shedFailed }
