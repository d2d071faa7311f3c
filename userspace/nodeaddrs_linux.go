package userspace

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// nodeAddrs reads the host's addresses with their flags (RTM_GETADDR), as
// net.InterfaceAddrs does, but keeps each one's interface and leaves out
// IFA_F_TENTATIVE and IFA_F_DADFAILED addresses: bind(2) refuses them
// (EADDRNOTAVAIL) until DAD succeeds, for ever if it failed.
func nodeAddrs() ([]netip.Addr, error) {
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
	if err != nil {
		return nil, os.NewSyscallError("netlinkrib", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return nil, os.NewSyscallError("parsenetlinkmessage", err)
	}
	names := make(map[int]string)
	var out []netip.Addr
	for _, m := range msgs {
		if m.Header.Type == syscall.NLMSG_DONE {
			break
		}
		if m.Header.Type != syscall.RTM_NEWADDR || len(m.Data) < syscall.SizeofIfAddrmsg {
			continue
		}
		ifa := (*syscall.IfAddrmsg)(unsafe.Pointer(&m.Data[0]))
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			continue
		}
		flags := uint32(ifa.Flags)
		var local, address []byte
		for _, a := range attrs {
			switch a.Attr.Type {
			case syscall.IFA_LOCAL:
				local = a.Value
			case syscall.IFA_ADDRESS:
				address = a.Value
			case unix.IFA_FLAGS:
				if len(a.Value) >= 4 {
					flags = binary.NativeEndian.Uint32(a.Value)
				}
			}
		}
		if flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			continue
		}
		// IFA_LOCAL is the address itself; IFA_ADDRESS is the peer's on a
		// point-to-point link, and the address itself otherwise.
		raw := local
		if raw == nil {
			raw = address
		}
		ip, ok := netip.AddrFromSlice(raw)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is6() && ip.IsLinkLocalUnicast() {
			idx := int(ifa.Index)
			name, ok := names[idx]
			if !ok {
				if ifi, err := net.InterfaceByIndex(idx); err == nil {
					name = ifi.Name
				}
				names[idx] = name
			}
			if name == "" {
				continue // its interface went meanwhile
			}
			ip = ip.WithZone(name)
		}
		out = append(out, ip)
	}
	return out, nil
}
