//go:build !linux

package userspace

import "errors"

func sctpAvailable() error { return errors.New("SCTP is served on Linux only") }

func listenSCTP(*servicePort, sockKey) (socket, error) { return nil, sctpAvailable() }

type sctpTracker struct{}

func (sctpTracker) abortAll() {}
