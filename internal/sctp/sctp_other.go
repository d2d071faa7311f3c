//go:build !linux

package sctp

import "errors"

// ErrUnsupported is returned where SCTP is not available: on this
// platform, always.
var ErrUnsupported = errors.New("sctp: supported on Linux only")

// Available reports whether SCTP sockets can be opened: never, here.
func Available() error { return ErrUnsupported }
