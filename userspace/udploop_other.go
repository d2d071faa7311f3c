//go:build !linux || goroutines

package userspace

// loopSet is empty where goroutines serve the sockets.
type loopSet struct{}

func (*loopSet) stopLoops() {}
