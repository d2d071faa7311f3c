package portal

import (
	"encoding/binary"
	"fmt"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// reportKubeProxy says, at start, where kube-proxy's rules are: the nat
// chains of its iptables and ipvs modes in either backend (saves, by
// backend and family), and the tables of its nftables mode. Sync says it
// again when they appear later (noteKubeProxy).
func (p *IPTables) reportKubeProxy(saves map[Backend]map[Family]string) {
	for _, b := range []Backend{p.backend, otherBackend(p.backend)} {
		for _, fam := range p.cfg.Families {
			save, ok := saves[b][fam]
			if !ok {
				continue
			}
			chains, found := kubeProxyInSave(save)
			bin, _, _ := p.binaries(b, fam)
			switch {
			case len(found) > 0:
				klog.ErrorS(nil, msgKubeProxyIPTables, "command", bin, "family", fam, "table", tableNAT, "chains", chains, "jumps", found)
			case len(chains) > 0:
				klog.InfoS("kube-proxy's nat chains are on this host, but no built-in chain jumps to them, so they take no traffic; `kube-proxy --cleanup` on this node removes them", "command", bin, "family", fam, "table", tableNAT, "chains", chains)
			}
			if b != p.backend {
				continue
			}
			for _, ft := range p.fams {
				if ft.fam == fam {
					ft.kubeProxy = found // said: Sync says only a change
				}
			}
		}
	}
	p.noteKubeProxyNFT()
}

// noteKubeProxy reports kube-proxy's jumps in the built-in nat chains of
// ft when they appear (kubeadm re-installed kube-proxy) or go.
func noteKubeProxy(ft *famTables, found []string) {
	switch {
	case len(found) > 0 && len(ft.kubeProxy) == 0:
		klog.ErrorS(nil, msgKubeProxyIPTables, "command", ft.bin, "family", ft.fam, "table", tableNAT, "jumps", found)
	case len(found) == 0 && len(ft.kubeProxy) > 0:
		klog.InfoS(msgKubeProxyIPTablesGone, "command", ft.bin, "family", ft.fam, "table", tableNAT)
	}
	ft.kubeProxy = found
}

// noteKubeProxyNFT reports the tables of kube-proxy's nftables mode when
// they appear or go. One netlink dump; a failure (no nf_tables in the
// kernel) is said at -v=4.
func (p *IPTables) noteKubeProxyNFT() {
	if p.nftTables == nil {
		return
	}
	tables, err := p.nftTables()
	if err != nil {
		klog.V(4).InfoS("Cannot list the nftables tables to look for kube-proxy's", "err", err)
		return
	}
	var found []string
	for _, t := range tables {
		if slices.Contains(kubeProxyNFTables, t) {
			found = append(found, t)
		}
	}
	slices.Sort(found)
	switch {
	case len(found) > 0 && len(p.nftKubeProxy) == 0:
		klog.ErrorS(nil, msgKubeProxyNFTables, "tables", found)
	case len(found) == 0 && len(p.nftKubeProxy) > 0:
		klog.InfoS(msgKubeProxyNFTablesGone, "tables", p.nftKubeProxy)
	}
	p.nftKubeProxy = found
}

// nfnetlinkSocket opens a netfilter netlink socket, bound, whose reads
// give up after 2 s: a kernel that never answers cannot hold a sync for
// long.
func nfnetlinkSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return -1, fmt.Errorf("netfilter netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(int64(2 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("netfilter netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("netfilter netlink socket: %w", err)
	}
	return fd, nil
}

// nftTables lists the nftables tables of this network namespace as nft
// names them ("ip kube-proxy"), with one netlink dump (NFT_MSG_GETTABLE),
// so no nft command is needed: a few microseconds, read-only. It needs
// CAP_NET_ADMIN; a kernel without nf_tables answers with an error.
func nftTables() ([]string, error) {
	fd, err := nfnetlinkSocket()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	const seq = 1
	req := make([]byte, unix.NLMSG_HDRLEN+4) // header, then nfgenmsg: family AF_UNSPEC (every family), version 0, res_id 0
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETTABLE)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], seq)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	families := map[byte]string{
		unix.NFPROTO_IPV4: "ip", unix.NFPROTO_IPV6: "ip6", unix.NFPROTO_INET: "inet",
		unix.NFPROTO_ARP: "arp", unix.NFPROTO_BRIDGE: "bridge", unix.NFPROTO_NETDEV: "netdev",
	}
	var out []string
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("list nftables tables: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("list nftables tables: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
						return nil, fmt.Errorf("list nftables tables: %w", unix.Errno(-errno))
					}
				}
				return out, nil
			case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE:
			default:
				continue
			}
			if len(m.Data) < 4 {
				continue
			}
			fam, ok := families[m.Data[0]]
			if !ok {
				fam = fmt.Sprintf("family%d", m.Data[0])
			}
			if name := nlaString(m.Data[4:], unix.NFTA_TABLE_NAME); name != "" {
				out = append(out, fam+" "+name)
			}
		}
	}
}

// nlaString returns the string attribute typ of netlink attributes b, or
// "" when it is absent.
func nlaString(b []byte, typ uint16) string {
	for len(b) >= unix.NLA_HDRLEN {
		l := int(binary.NativeEndian.Uint16(b))
		t := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.NLA_HDRLEN || l > len(b) {
			return ""
		}
		if t == typ {
			v := b[unix.NLA_HDRLEN:l]
			for len(v) > 0 && v[len(v)-1] == 0 {
				v = v[:len(v)-1]
			}
			return string(v)
		}
		l = (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if l > len(b) {
			return ""
		}
		b = b[l:]
	}
	return ""
}
