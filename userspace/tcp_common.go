package userspace

import (
	"net"
	"time"
)

// keepAlive turns TCP keep-alive on for both sides of every proxied
// connection, so a peer that vanished without a FIN or RST is noticed and
// its file descriptors freed. Only the idle time is set; the probe interval
// and count stay the kernel's.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: -1, Count: -1}
