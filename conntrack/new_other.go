//go:build !linux

package conntrack

// New returns Noop: there is no conntrack off Linux.
func New() (Interface, error) { return Noop{}, nil }
