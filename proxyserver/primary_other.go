//go:build !linux

package proxyserver

import (
	"errors"
	"net/netip"
)

func defaultRouteAddrs() ([]netip.Addr, error) {
	return nil, errors.New("default routes are read on Linux only")
}
