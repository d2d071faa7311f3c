package userspace

import (
	"net"
	"net/netip"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// keepAlive turns TCP keep-alive on for both sides of every proxied
// connection, so a peer that vanished without a FIN or RST is noticed and
// its file descriptors freed. Only the idle time is set; the probe interval
// and count stay the kernel's.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: -1, Count: -1}

// logConnEnded logs, at -v=4, how a proxied connection ended: the bytes it
// carried each way, how long it lasted, and whether it ended with a reset.
func logConnEnded(name state.ServicePortName, client, endpoint netip.AddrPort, moved [2]uint64, since time.Time, reset bool) {
	klog.InfoS("Connection ended", "service", name, "client", client, "endpoint", endpoint,
		"bytesToEndpoint", moved[0], "bytesToClient", moved[1], "duration", time.Since(since).Round(time.Millisecond), "reset", reset)
}
