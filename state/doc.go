// Package state holds the immutable description of what the proxy should
// serve: one ServicePort per (service, port name, protocol), with its
// frontends (ClusterIPs, NodePort, ExternalIPs, load-balancer IPs), its
// session affinity and the endpoints left after kube-proxy's filtering.
//
// The package owns the types only. Turning Kubernetes objects into a
// Snapshot is the job of package source; serving a Snapshot is the job of
// package userspace; kernel redirection is the job of package portal.
// state depends on the standard library alone, so every other package can
// import it.
//
// A Snapshot is built once and never modified afterwards:
//
//	snap := state.NewSnapshot([]state.ServicePort{{
//		Name:     state.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: state.TCP},
//		Port:     80,
//		Affinity: state.Affinity{Type: state.AffinityNone},
//		Endpoints: []state.Endpoint{{Addr: netip.MustParseAddrPort("127.0.0.1:8080"), Ready: true, Serving: true}},
//	}})
//	proxier.Apply(snap)
package state
