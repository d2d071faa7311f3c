//go:build !linux

package proxyserver

import "net/netip"

// addrDAD reports nothing off Linux: an address still in duplicate address
// detection is not told apart from one the host does not have.
func addrDAD(netip.Addr) (tentative, failed bool) { return false, false }
