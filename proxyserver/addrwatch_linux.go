package proxyserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// watchAddresses calls changed(true) whenever an address is added to or removed
// from an interface of this host (rtnetlink RTM_NEWADDR and RTM_DELADDR),
// and with routes too an IPv4 route or a link (RTM_NEWROUTE and the like:
// the kernel removes a link's routes without telling; changed(false)), until
// ctx ends. It returns once the subscription is in place, so no change
// after it returns is missed.
func watchAddresses(ctx context.Context, routes bool, changed func(addrs bool)) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("watch addresses: %w", os.NewSyscallError("socket", err))
	}
	groups := uint32(unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR)
	if routes {
		groups |= unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_LINK
	}
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: groups}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return fmt.Errorf("watch addresses: %w", os.NewSyscallError("bind", err))
	}
	// A non-blocking descriptor is served by Go's poller, so Close
	// unblocks the Read below.
	f := os.NewFile(uintptr(fd), "rtnetlink")
	context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) {
					// ENOBUFS means notifications were dropped: an
					// address may have changed.
					if errors.Is(err, unix.ENOBUFS) {
						changed(true)
						continue
					}
					klog.ErrorS(err, "Watching the host's addresses failed; new addresses are picked up at the next resync")
				}
				return
			}
			msgs, err := syscall.ParseNetlinkMessage(buf[:n])
			if err != nil {
				continue
			}
			any, addrs := false, false
			for _, m := range msgs {
				switch m.Header.Type {
				case unix.RTM_NEWADDR, unix.RTM_DELADDR:
					any, addrs = true, true
				case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_NEWLINK, unix.RTM_DELLINK:
					any = true
				}
			}
			if any {
				changed(addrs)
			}
		}
	}()
	return nil
}
