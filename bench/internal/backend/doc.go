// Package backend holds the servers that stand behind every peer in the
// benchmark: a TCP echo server (connection rate, latency, idle connections),
// a TCP bulk server that sources or sinks data (throughput) and a UDP echo
// server (datagram rate).
//
// The package owns the servers and their one-byte bulk protocol. Driving load
// is the job of package load; starting proxies in front of the servers is the
// job of package peer. The servers run in their own process (bench/cmd/backend)
// so that their file descriptors never count against the load generator's.
//
//	s, err := backend.Listen(backend.Config{Echo: "127.0.0.1:0", Bulk: "127.0.0.1:0", UDP: "127.0.0.1:0"})
//	if err != nil { ... }
//	go s.Serve()
//	defer s.Close()
package backend
