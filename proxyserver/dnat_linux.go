package proxyserver

import (
	"bufio"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"unsafe"
)

// inspectRoutes reads the main IPv4 routing table (/proc/net/route), the
// interfaces and their addresses (one rtnetlink dump each, however many
// pod interfaces there are): the up interfaces that routes point at
// without an IPv4 address of their own, and a node address.
func inspectRoutes() (hostRoutes, bool) {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return hostRoutes{}, false
	}
	defer f.Close()
	routed := make(map[string]bool)
	var defaultIface string
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 {
			continue
		}
		routed[fields[0]] = true
		if fields[1] == "00000000" && fields[7] == "00000000" && defaultIface == "" {
			defaultIface = fields[0]
		}
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return hostRoutes{}, false
	}
	v4, err := ipv4Addrs()
	if err != nil {
		return hostRoutes{}, false
	}
	var h hostRoutes
	var first netip.Addr
	for _, ifi := range ifaces {
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs := v4[ifi.Index]
		var global netip.Addr
		for _, a := range addrs {
			if a.IsGlobalUnicast() {
				global = a
				break
			}
		}
		switch {
		case len(addrs) == 0 && routed[ifi.Name]:
			h.addressless = append(h.addressless, ifi.Name)
		case global.IsValid() && ifi.Name == defaultIface:
			h.node = global
		case global.IsValid() && !first.IsValid():
			first = global
		}
	}
	if !h.node.IsValid() {
		h.node = first
	}
	slices.Sort(h.addressless)
	return h, true
}

// ipv4Addrs returns the IPv4 addresses of every interface, by index, in
// the kernel's order (the first is what REDIRECT picks).
func ipv4Addrs() (map[int][]netip.Addr, error) {
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_INET)
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return nil, err
	}
	out := make(map[int][]netip.Addr)
	for _, m := range msgs {
		if m.Header.Type != syscall.RTM_NEWADDR || len(m.Data) < syscall.SizeofIfAddrmsg {
			continue
		}
		ifa := (*syscall.IfAddrmsg)(unsafe.Pointer(&m.Data[0]))
		if ifa.Family != syscall.AF_INET {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			continue
		}
		var addr, local netip.Addr
		for _, a := range attrs {
			ip, ok := netip.AddrFromSlice(a.Value)
			if !ok {
				continue
			}
			switch a.Attr.Type {
			case syscall.IFA_ADDRESS:
				addr = ip
			case syscall.IFA_LOCAL: // on a point-to-point link IFA_ADDRESS is the peer's
				local = ip
			}
		}
		if local.IsValid() {
			addr = local
		}
		if addr.IsValid() {
			out[int(ifa.Index)] = append(out[int(ifa.Index)], addr.Unmap())
		}
	}
	return out, nil
}
