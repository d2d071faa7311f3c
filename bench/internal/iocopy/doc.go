// Package iocopy is the "go-iocopy" peer of the benchmark: the smallest TCP
// proxy one would write in Go, io.Copy in both directions with CloseWrite for
// half-close, and nothing else. It shows what a plain Go proxy costs (Go's
// io.Copy between two *net.TCPConn splices, holding a pipe per direction), so
// the benchmark can tell which of our numbers come from Go itself.
//
// It owns only the accept and copy loops: no load balancing, no limits.
//
//	p, err := iocopy.Listen("127.0.0.1:0", "127.0.0.1:8080")
//	if err != nil { ... }
//	go p.Serve()
//	defer p.Close()
package iocopy
