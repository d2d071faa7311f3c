//go:build !linux

package proxyserver

import "context"

// watchAddresses is Linux only; elsewhere new addresses are picked up at
// the next resync.
func watchAddresses(context.Context, bool, func(bool)) error { return nil }
