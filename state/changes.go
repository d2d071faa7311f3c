package state

import (
	"cmp"
	"maps"
	"slices"
)

// Changes names the Services whose change a snapshot brings since the
// snapshot before it, as kube-proxy's change trackers name those whose
// Service or endpoints changed since its last sync. A Service appears at
// most once in each list, and may appear in both.
type Changes struct {
	// Services are those whose service ports came, went or changed in
	// anything but their endpoints: the Service object changed what is
	// served.
	Services []ServiceName
	// Endpoints are those whose service ports' endpoints changed, those of
	// a port that came or went included: the endpoints changed what is
	// served.
	Endpoints []ServiceName
}

// Empty reports whether c names no Service.
func (c Changes) Empty() bool { return len(c.Services) == 0 && len(c.Endpoints) == 0 }

// ChangeSet collects Changes, a Service at a time. The zero value is an
// empty set.
type ChangeSet struct {
	services, endpoints map[ServiceName]bool
}

// Add records how the service ports of the Service name changed from old
// to cur (each in any order, and all of name): see Changes.
func (c *ChangeSet) Add(name ServiceName, old, cur []ServicePort) {
	service, endpoints := compare(old, cur)
	if service {
		if c.services == nil {
			c.services = make(map[ServiceName]bool)
		}
		c.services[name] = true
	}
	if endpoints {
		if c.endpoints == nil {
			c.endpoints = make(map[ServiceName]bool)
		}
		c.endpoints[name] = true
	}
}

// Changes returns what was added, each list sorted.
func (c *ChangeSet) Changes() Changes {
	sorted := func(m map[ServiceName]bool) []ServiceName {
		return slices.SortedFunc(maps.Keys(m), func(a, b ServiceName) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
		})
	}
	return Changes{Services: sorted(c.services), Endpoints: sorted(c.endpoints)}
}

// ChangesBetween returns the changes from the service ports of old to
// those of cur.
func ChangesBetween(old, cur Snapshot) Changes {
	byService := func(s Snapshot) map[ServiceName][]ServicePort {
		out := make(map[ServiceName][]ServicePort)
		for sp := range s.All {
			out[sp.Name.Service()] = append(out[sp.Name.Service()], *sp)
		}
		return out
	}
	before, after := byService(old), byService(cur)
	var c ChangeSet
	for name, ports := range before {
		c.Add(name, ports, after[name])
	}
	for name, ports := range after {
		if _, ok := before[name]; !ok {
			c.Add(name, nil, ports)
		}
	}
	return c.Changes()
}

// compare reports whether the service ports of one Service changed from
// old to cur in anything but their endpoints (service), and in their
// endpoints (endpoints).
func compare(old, cur []ServicePort) (service, endpoints bool) {
	was := make(map[ServicePortName]*ServicePort, len(old))
	for i := range old {
		was[old[i].Name] = &old[i]
	}
	for i := range cur {
		sp := &cur[i]
		o, ok := was[sp.Name]
		if !ok {
			service = true
			endpoints = endpoints || sp.HasEndpoints()
			continue
		}
		delete(was, sp.Name)
		a, b := *o, *sp
		a.ClusterEndpoints, a.LocalEndpoints, b.ClusterEndpoints, b.LocalEndpoints = nil, nil, nil, nil
		a.ServingEndpoints, b.ServingEndpoints = nil, nil
		a.TopologyHintsIgnored, b.TopologyHintsIgnored = "", "" // the hints are the slices'
		service = service || !a.Equal(&b)
		endpoints = endpoints || !slices.Equal(o.ClusterEndpoints, sp.ClusterEndpoints) || !slices.Equal(o.LocalEndpoints, sp.LocalEndpoints) ||
			!slices.Equal(o.ServingEndpoints, sp.ServingEndpoints) || o.TopologyHintsIgnored != sp.TopologyHintsIgnored
	}
	for _, o := range was { // ports gone
		service = true
		endpoints = endpoints || o.HasEndpoints()
	}
	return service, endpoints
}
