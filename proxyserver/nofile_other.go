//go:build !unix

package proxyserver

// openFilesLimit returns 0, no limit known, where there is no
// RLIMIT_NOFILE: the HTTP servers keep their bounds as they are.
func openFilesLimit() uint64 { return 0 }
