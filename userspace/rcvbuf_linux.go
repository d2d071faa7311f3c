package userspace

import "golang.org/x/sys/unix"

// growRcvBuf asks for frontendRcvBuf on a UDP service socket: with
// SO_RCVBUFFORCE, which may pass net.core.rmem_max when the proxy holds
// CAP_NET_ADMIN (as it does in its DaemonSet), else with SO_RCVBUF, which
// the kernel caps at rmem_max. Failure leaves the default: it is an
// optimisation, and the socket works without it.
func growRcvBuf(fd int) {
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, frontendRcvBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, frontendRcvBuf)
	}
}
