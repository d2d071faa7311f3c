//go:build linux && !goroutines

package buildinfo

// DataPlane names how this build serves connections: on Linux, unless
// built with -tags goroutines, a few epoll event loops (package userspace).
const DataPlane = "event loops"
