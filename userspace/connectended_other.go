//go:build !unix

package userspace

import "syscall"

// connectEnded cannot look at a connecting socket here: an attempt's time
// is up at its deadline, however far its connect got.
func connectEnded(syscall.RawConn) bool { return false }
