package userspace

import (
	"cmp"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// keepAlive turns TCP keep-alive on for both sides of every proxied
// connection, so a peer that vanished without a FIN or RST is noticed and
// its file descriptors freed. Only the idle time is set; the probe interval
// and count stay the kernel's.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: -1, Count: -1}

// resetDrain bounds how long a connection one side of which failed goes
// on passing what that side had sent to the other side, which is reset
// then (see fail, in both builds).
const resetDrain = 2 * time.Second

// drainPoll is how often a connection one side of which failed looks
// whether the other side has acknowledged all it was sent: no event
// says when a socket's send queue is empty.
const drainPoll = 5 * time.Millisecond

// slowDrainPoll is how often a drain without a deadline (a side that
// failed after its FIN, whose data a slow reader is still taking) looks
// once resetDrain has passed.
const slowDrainPoll = 250 * time.Millisecond

// finDrainStall bounds how long a drain without a deadline (a side that
// failed after its FIN, whose data the other side is still taking: see
// fail, in both builds) waits for the other side to make progress: to
// take more, or acknowledge some of what it was sent. As long as it does,
// however slowly, the drain goes on; once it has done neither for
// finDrainStall (a reader that stopped reading, whose kernel answers the
// zero-window probes), it is reset. On a direct connection the sender's
// kernel holds that data in its closed socket (an orphan), and Linux
// drops an orphan whose peer keeps its window shut once the probes have
// backed off to TCP_RTO_MAX, 120 s (tcp_probe_timer, with
// tcp_orphan_retries 0, in net/ipv4/tcp_timer.c): RTO×(2^b-1) + 120 s
// after the last progress, b the first backoff with RTO×2^b ≥ 120 s, so
// 325 s with the 200 ms minimum RTO (340 s measured on loopback, kernel
// 6.18) and 247 s with a 1 s RTO. Five minutes is within that range, and
// is --tcp-half-close-timeout's default. A variable, so tests can shorten
// it.
var finDrainStall = 5 * time.Minute

// drainStalled says why a connection was reset whose side failed after
// its FIN (fail's reason, why) while the other side, reader, took
// nothing for finDrainStall.
func drainStalled(why, reader string) string {
	return why + " after its FIN; then the " + reader + " took nothing for " + finDrainStall.String()
}

// sideNames names side i (and the source of direction i).
var sideNames = [2]string{"client", "endpoint"}

// logConnEnded logs, at -v=4, how a proxied connection ended: the bytes it
// carried each way, how long it lasted, and whether it ended with a reset,
// and if so why (resetWhy).
func logConnEnded(name state.ServicePortName, client, endpoint netip.AddrPort, moved [2]uint64, since time.Time, reset bool, why string) {
	kv := []any{"service", name, "client", client, "endpoint", endpoint,
		"bytesToEndpoint", moved[0], "bytesToClient", moved[1], "duration", time.Since(since).Round(time.Millisecond), "reset", reset}
	if reset {
		kv = append(kv, "reason", cmp.Or(why, whyProxyStopped))
	}
	klog.InfoS("Connection ended", kv...)
}

// Why a connection ended with a reset, for the -v=4 line.
const (
	whyProxyStopped    = "the proxy stopped serving the service port"
	whyHalfCloseSilent = "the half-closed connection stayed silent longer than --tcp-half-close-timeout"
	whyAddressGone     = "the service address it reached left this host"
)

// sideFailed says why a connection was reset after an error on one side
// (side is "client" or "endpoint"), reading from it or writing to it.
// An error of the kernel's is said by its errno alone ("connection timed
// out"), as the event loops have it, where the goroutine build's net.Conn
// wraps it in the operation and addresses ("write tcp4 a->b: write: ...").
func sideFailed(side string, reading bool, err error) string {
	switch {
	case err == nil:
		return "the " + side + " ended the stream unexpectedly"
	case errors.Is(err, syscall.ECONNRESET), reading && errors.Is(err, syscall.EPIPE):
		// A reset that reaches a socket whose peer had sent its FIN
		// (CLOSE_WAIT) leaves EPIPE, not ECONNRESET, for the next read or
		// SO_ERROR: tcp_reset in Linux's net/ipv4/tcp_input.c.
		return "the " + side + " reset the connection"
	case errors.Is(err, syscall.EPIPE):
		return "the " + side + " had closed the connection"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		err = errno
	}
	if reading {
		return "reading from the " + side + " failed: " + err.Error()
	}
	return "sending to the " + side + " failed: " + err.Error()
}
