//go:build !linux

package userspace

// udpLoop exists on Linux only; elsewhere each UDP socket has goroutines.
type udpLoop struct{}

func (*udpLoop) stop() {}
