package conntrack

import "context"

// Noop deletes nothing: for hosts without conntrack and portals without
// NAT.
type Noop struct{}

// ClearUDP does nothing.
func (Noop) ClearUDP(context.Context, ...Filter) (int, error) { return 0, nil }
