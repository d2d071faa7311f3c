//go:build unix

package regularfile

import "syscall"

// openNonblock opens a named pipe without waiting for a writer; it does
// nothing to a regular file.
const openNonblock = syscall.O_NONBLOCK
