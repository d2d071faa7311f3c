//go:build !linux || goroutines

package userspace

import "testing"

// socketFilterAllowed reports whether the kernel lets this process attach
// a socket filter to a socket of network: this build attaches none.
func socketFilterAllowed(testing.TB, string) bool { return false }
