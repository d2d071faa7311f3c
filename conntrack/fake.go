package conntrack

import (
	"context"
	"slices"
	"sync"
)

// Fake is a conntrack table in memory for tests: ClearUDP deletes the
// matching Flows and records the filters it was given.
type Fake struct {
	mu      sync.Mutex // guards the fields below
	flows   []Flow
	cleared [][]Filter
}

var _ Interface = (*Fake)(nil)

// Add puts flows in the table.
func (f *Fake) Add(flows ...Flow) {
	f.mu.Lock()
	f.flows = append(f.flows, flows...)
	f.mu.Unlock()
}

// Flows returns the flows left in the table.
func (f *Fake) Flows() []Flow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flows)
}

// Calls returns the filters of each ClearUDP call so far.
func (f *Fake) Calls() [][]Filter {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.cleared)
}

// ClearUDP deletes the flows that match any filter.
func (f *Fake) ClearUDP(_ context.Context, filters ...Filter) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleared = append(f.cleared, slices.Clone(filters))
	before := len(f.flows)
	f.flows = slices.DeleteFunc(f.flows, func(fl Flow) bool {
		return slices.ContainsFunc(filters, func(ft Filter) bool { return ft.Match(fl) })
	})
	return before - len(f.flows), nil
}
