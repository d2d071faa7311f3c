//go:build unix

package proxyserver

import "syscall"

// openNonblock opens a named pipe without waiting for a writer; it does
// nothing to a regular file.
const openNonblock = syscall.O_NONBLOCK
