//go:build !linux

package portal

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
)

// Bind is the bind portal. Off Linux it cannot add addresses: Sync only
// checks that every service address is already on the host, so the data
// plane can listen on it, and says how to add the missing ones.
type Bind struct{}

var _ Interface = (*Bind)(nil)

// BindAddsAddresses says the bind portal puts service addresses on an
// interface itself: off Linux it cannot, and only checks they are there.
const BindAddsAddresses = false

// CheckNetAdmin returns nil: off Linux the proxy changes no network
// configuration.
func CheckNetAdmin() error { return nil }

// NewBind returns the checking bind portal.
func NewBind(_ context.Context, _ BindConfig) (*Bind, error) { return &Bind{}, nil }

// Sync reports the service addresses missing from the host.
func (*Bind) Sync(_ context.Context, portals []Portal) error {
	have := make(map[netip.Addr]bool)
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return fmt.Errorf("portal: bind: list addresses: %w", err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				have[ip.Unmap()] = true
			}
		}
	}
	var missing []string
	for _, ip := range bindAddrs(portals) {
		if !have[ip] {
			missing = append(missing, ip.String())
		}
	}
	if len(missing) == 0 {
		return nil
	}
	how := "add them to a loopback interface"
	switch runtime.GOOS {
	case "darwin":
		how = "add each with: sudo ifconfig lo0 alias ADDRESS"
	case "windows":
		how = `add each with: netsh interface ip add address "Loopback" ADDRESS 255.255.255.255 (IPv4) or netsh interface ipv6 add address "Loopback" ADDRESS (IPv6), on a loopback adapter`
	}
	return fmt.Errorf("portal: bind: service addresses %s are not on this host (%s)", strings.Join(missing, ", "), how)
}

// Cleanup does nothing: this portal adds no addresses.
func (*Bind) Cleanup(context.Context) error { return nil }

// Close does nothing.
func (*Bind) Close() error { return nil }

// Interface is empty: this portal adds addresses nowhere.
func (*Bind) Interface() string { return "" }

// Owned returns nothing: off Linux the bind portal adds no addresses.
func (*Bind) Owned() ([]netip.Addr, error) { return nil, nil }

// AddrsInUse returns nothing: off Linux no bind portal adds addresses a
// proxy without a portal would remove.
func AddrsInUse([]netip.Addr) ([]netip.Addr, error) { return nil, nil }

// BindLeftovers lists the service addresses a bind portal left on this
// host: off Linux it adds none.
func BindLeftovers() []netip.Addr { return nil }
