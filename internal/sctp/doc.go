// Package sctp opens one-to-one SCTP sockets (SOCK_STREAM, IPPROTO_SCTP)
// with golang.org/x/sys/unix and hands them to Go's network poller, so
// deadlines, Close and a blocked Accept or Read behave as they do for TCP.
// It reads and writes whole SCTP messages with their stream id and payload
// protocol identifier (RFC 6458 SCTP_RCVINFO and SCTP_SNDINFO).
//
// What it owns: socket options, a non-blocking connect with a timeout,
// message reads and writes, and the check whether the kernel has SCTP.
// What it leaves to others: load balancing and relaying (package
// userspace). It does not use github.com/ishidawataru/sctp, whose sockets
// bypass the poller: no deadlines, and Close does not unblock Accept.
//
// Go classifies these sockets by SO_TYPE and sees TCP; this package wraps
// them so TCP-only calls (CloseWrite, splice through io.Copy) are out of
// reach: SCTP has no half-close, and shutdown(SHUT_WR) on an SCTP socket
// starts a shutdown that loses the peer's reply.
//
// Usage:
//
//	if err := sctp.Available(); err != nil {
//		// this kernel has no SCTP
//	}
//	ln, err := sctp.Listen(netip.MustParseAddrPort("127.0.0.1:3868"), sctp.Options{})
//	c, err := ln.Accept()
//	msg, info, err := c.ReadMsg(buf)
//	_, err = c.WriteMsg(msg, info)
//
// Linux only: elsewhere every call returns ErrUnsupported.
package sctp
