//go:build !linux

package portal

import (
	"context"
	"fmt"
	"net/netip"
)

// IPTables is the iptables portal; it exists only on Linux.
type IPTables struct{}

var _ Interface = (*IPTables)(nil)

// NewIPTables fails: iptables is Linux only.
func NewIPTables(_ context.Context, _ IPTablesConfig) (*IPTables, error) {
	return nil, fmt.Errorf("portal: iptables: %w", ErrNotSupported)
}

// Sync fails: iptables is Linux only.
func (*IPTables) Sync(context.Context, []Portal) error {
	return fmt.Errorf("portal: iptables: %w", ErrNotSupported)
}

// Cleanup does nothing: there is nothing to remove off Linux.
func (*IPTables) Cleanup(context.Context) error { return nil }

// Backend is empty off Linux.
func (*IPTables) Backend() Backend { return "" }

// Existing fails: iptables is Linux only.
func (*IPTables) Existing(context.Context) ([]Portal, error) {
	return nil, fmt.Errorf("portal: iptables: %w", ErrNotSupported)
}

// Removed returns nothing: there are no rules off Linux.
func (*IPTables) Removed() []Portal { return nil }

// ExistingTargets fails: iptables is Linux only.
func (*IPTables) ExistingTargets(context.Context) ([]Portal, map[Family][]netip.Addr, error) {
	return nil, nil, fmt.Errorf("portal: iptables: %w", ErrNotSupported)
}

// InSync fails: iptables is Linux only.
func (*IPTables) InSync(context.Context, []Portal) (bool, error) {
	return false, fmt.Errorf("portal: iptables: %w", ErrNotSupported)
}
