//go:build !unix

package userspace

// fdLimit returns 0: this system has no per-process limit on descriptors
// (Windows hands out handles, not the lowest free number).
func fdLimit() uint64 { return 0 }
