// Package userspace is the data plane of kube-userspace-proxy: it serves a
// state.Snapshot with one listener per service port and moves bytes between
// clients and endpoints.
//
// What it owns:
//   - listeners: a proxy port per service port (from Config.PortRange, or
//     kernel-chosen), one socket per IP family on the same port; optionally
//     the NodePort itself (Config.ServeNodePorts) and the service addresses
//     themselves (Config.ServeFrontends);
//   - endpoint choice: round robin over the current endpoints, ClientIP
//     affinity with a timeout that follows the Service, and connect-time
//     failover to another endpoint when a dial fails;
//   - TCP copy loops with half-close, a bound on half-closed connections,
//     resets on errors and on "no endpoints", and splice(2) that holds no
//     pipe while a connection is idle (two fds per idle connection);
//   - UDP sessions: batched reads, 64 KiB datagrams passed whole, an idle
//     timeout and a longer wait for replies, a cap per service port, and
//     replies sent from the address the client sent to. On Linux every UDP
//     socket is served by one epoll event loop (udploop_linux.go), with no
//     goroutine or timer per session; elsewhere each listener and session
//     has a goroutine (udp_goroutine.go);
//   - shedding on resource exhaustion (EMFILE and friends): a connection is
//     reset and counted, and the proxy carries on.
//
// What it leaves to others: turning Kubernetes objects into a Snapshot
// (package source), steering service addresses to the listeners (package
// portal) and conntrack cleanup (package conntrack). It contains no
// iptables code.
//
// Usage:
//
//	p := userspace.New(userspace.Config{PortRange: r})
//	defer p.Close()
//	if err := p.Apply(snapshot); err != nil {
//		// some service ports could not be served; Apply again retries them
//	}
//	port := p.ProxyPort(name)
package userspace
