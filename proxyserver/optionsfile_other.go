//go:build !unix

package proxyserver

// openNonblock is none: only unix systems have named pipes in the file
// system.
const openNonblock = 0
