package portal

import "context"

// Noop is the "none" portal: it programs nothing. Clients reach the proxy
// ports and node ports directly.
type Noop struct{}

var _ Interface = Noop{}

// Sync does nothing.
func (Noop) Sync(context.Context, []Portal) error { return nil }

// Cleanup does nothing.
func (Noop) Cleanup(context.Context) error { return nil }
