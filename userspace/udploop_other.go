//go:build !linux || goroutines

package userspace

// eventLoop exists on Linux only; elsewhere each socket has goroutines.
type eventLoop struct{}

func (p *Proxier) stopLoops() {}
