// Package userspace is the data plane of kube-userspace-proxy: it serves a
// state.Snapshot with one listener per service port and moves bytes between
// clients and endpoints.
//
// What it owns:
//   - listeners: a proxy port per service port (from Config.PortRange, or
//     kernel-chosen), one socket per IP family on the same port, and a
//     second proxy port for redirected external traffic when a Local
//     traffic policy gives it other endpoints; optionally the NodePort
//     itself (Config.ServeNodePorts) and the service addresses themselves
//     (Config.ServeFrontends);
//   - endpoint choice: round robin over the current endpoints, ClientIP
//     affinity with a timeout that follows the Service, and connect-time
//     failover to another endpoint when a dial fails (the failed endpoint
//     is passed over for a moment);
//   - TCP: half-close passed on, a bound on half-closed connections, resets
//     passed on, a reset for "no endpoints", splice(2) through pipes
//     taken from a pool only while data is in flight, and the PROXY
//     protocol header ahead of the client's bytes when the Service asks
//     (proxyproto.go);
//   - UDP sessions: batched reads, 64 KiB datagrams passed whole, an idle
//     timeout and a longer wait for replies, a cap per service port,
//     replies sent from the address the client sent to, and a client's
//     endpoint kept when the portal moves it to another proxy port
//     (movedsessions.go);
//   - SCTP (Linux, sctp_linux.go): associations on goroutines and Go's
//     poller, relayed message by message with stream ids and PPIDs kept;
//     SCTP has no half-close, so either side's shutdown ends both;
//   - shedding on resource exhaustion (EMFILE and friends): a connection is
//     reset and counted, and the proxy carries on; and a reserve of file
//     descriptors below RLIMIT_NOFILE that connections, sessions, pipes
//     and (lower still) listeners leave to the rest of the proxy: health,
//     metrics, the API server, iptables (fdreserve.go).
//
// How it runs: on Linux, a few event loops (eventloop_linux.go, one per
// core up to four) own every socket, nginx-style: a loop is a goroutine
// blocked in epoll_wait that accepts, dials, splices and forwards itself,
// with deadlines in a heap. A proxied TCP connection then costs two file
// descriptors and about half a KiB, and no goroutine; a UDP session one
// descriptor. Apply hands sockets to the loops through eventLoop.do.
// Elsewhere (macOS, BSDs, Solaris, AIX, Windows) goroutines serve each
// listener, connection direction and session (tcp_goroutine.go,
// udp_goroutine.go); Windows has no UDP yet (udp_other.go).
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
