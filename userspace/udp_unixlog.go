//go:build unix

package userspace

import (
	"net/netip"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// Directions of a UDP session's traffic.
const (
	toEndpoint = iota
	toClient
)

// udpTally counts a session's datagrams and bytes each way for the -v=4
// line that ends it; to the endpoint, each client datagram once, though a
// refusal sent it to another endpoint again (udpPending.forward). It counts only when -v=4 was on as the session began,
// as the line that opened it was logged then.
type udpTally struct {
	since     time.Time // zero: not counting
	datagrams [2]atomic.Uint64
	bytes     [2]atomic.Uint64
	reason    atomic.Pointer[string] // why it ended; nil: it idled out
}

// Why a session ends, for the -v=4 line.
var (
	endedRefused  = "the endpoint refused it (ICMP port unreachable)"
	endedStale    = "its endpoint was removed or is no longer serving"
	endedShutDown = "the service port closed"
	endedReadErr  = "reading the endpoint's replies failed"
)

// endBecause records why the session ends; the first reason given stays.
func (t *udpTally) endBecause(reason *string) {
	if !t.since.IsZero() {
		t.reason.CompareAndSwap(nil, reason)
	}
}

func (t *udpTally) start() {
	if klog.V(4).Enabled() {
		t.since = time.Now()
	}
}

func (t *udpTally) add(dir, n int) {
	if t.since.IsZero() {
		return
	}
	t.datagrams[dir].Add(1)
	t.bytes[dir].Add(uint64(n))
}

// logEnd logs the session's end, with its traffic when it was counted.
func (t *udpTally) logEnd(name state.ServicePortName, client, endpoint netip.AddrPort) {
	if !klog.V(4).Enabled() {
		return
	}
	if t.since.IsZero() {
		klog.InfoS("UDP session ended", "service", name, "client", client, "endpoint", endpoint)
		return
	}
	reason := "it idled out"
	if r := t.reason.Load(); r != nil {
		reason = *r
	}
	klog.InfoS("UDP session ended", "service", name, "client", client, "endpoint", endpoint, "reason", reason,
		"datagramsToEndpoint", t.datagrams[toEndpoint].Load(), "bytesToEndpoint", t.bytes[toEndpoint].Load(),
		"datagramsToClient", t.datagrams[toClient].Load(), "bytesToClient", t.bytes[toClient].Load(),
		"duration", time.Since(t.since).Round(time.Millisecond))
}
