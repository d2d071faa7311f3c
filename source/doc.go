// Package source turns Kubernetes Services and EndpointSlices into the
// state.Snapshot the proxy serves.
//
// It owns kube-proxy's semantics, in one place, for every way the objects
// arrive: which Services are skipped (another proxy's, headless,
// ExternalName), one state.ServicePort per (service, port name, protocol),
// frontends (cluster IPs, node port, external IPs, load-balancer IPs whose
// ipMode is VIP), ClientIP affinity and its default timeout, internal and
// external traffic policies, and the endpoints left after kube-proxy's
// filtering: slices matched to their Service by the kubernetes.io/service-name
// label and to its ports by name and protocol, ready endpoints else serving
// and terminating ones, topology hints all or nothing, node-local sets, and
// addresses the proxy refuses (link-local such as 169.254.169.254,
// multicast, unspecified, and loopback unless allowed). It also reads this
// proxy's own annotation, AnnotationProxyProtocol (the PROXY protocol
// header a Service's endpoints get). BuildSnapshot does all this as a pure
// function of plain API objects.
//
// It also owns the manifest source (--manifests PATH): ParseManifests
// decodes and validates the same YAML documents `kubectl apply -f` takes,
// with messages that name the file, document, object and field, and
// Manifests.Run serves the file and follows edits, keeping the last good
// state when an edit is broken.
//
// It leaves serving the snapshot to package userspace, kernel redirection
// to package portal, and the sync loop (rate limits, retries) to its
// caller. Cluster.Run serves a live cluster through client-go informers
// and rebuilds only the Services that changed, with the same BuildSnapshot,
// so both sources agree on every rule; NewClient connects as kube-proxy
// does.
//
// Usage, in manifest mode:
//
//	src := &source.Manifests{
//		Path: "demo.yaml",
//		Options: source.Options{
//			NodeName:         hostname,
//			AllowLoopback:    true, // the author owns the host
//			AllowNoClusterIP: true, // nothing allocates cluster IPs
//		},
//	}
//	err := src.Run(ctx, proxier.Apply) // fails at once on a broken file
//
// or, with objects from anywhere:
//
//	snap, problems := source.BuildSnapshot(services, slices, source.Options{NodeName: node})
//	for _, p := range problems {
//		klog.ErrorS(p, "Ignoring part of an object")
//	}
package source
