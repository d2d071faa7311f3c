//go:build !unix

package regularfile

// openNonblock is none: only unix systems have named pipes in the file
// system.
const openNonblock = 0
