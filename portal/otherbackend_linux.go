package portal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// mayHoldOurs tells, without running a program, whether ot's backend may
// hold our chains in ot's family, for a resync to read it only then
// (IPTables.otherHolds). For legacy: whether the kernel has its nat or
// filter table in this network namespace (/proc/net/ip_tables_names, or
// ip6_tables_names), which it makes only once a program uses it, so a
// host on nft has none. For nft: whether one of our chains is in its nat
// or filter table, asked of the kernel (one netlink request per chain,
// NFT_MSG_GETCHAIN), which is what ownsAnything looks for.
func mayHoldOurs(ot *famTables) (bool, error) {
	if ot.backend == BackendLegacy {
		return legacyTablesInUse(ot.fam)
	}
	family := byte(unix.NFPROTO_IPV4)
	if ot.fam == IPv6 {
		family = unix.NFPROTO_IPV6
	}
	var chains []nftChain
	for _, table := range []string{tableNAT, tableFilter} {
		for _, c := range ownedChains[table] {
			chains = append(chains, nftChain{family, table, c})
		}
	}
	return nftChainsExist(chains)
}

// legacyTablesInUse reports whether the legacy nat or filter table of fam
// is in use in this network namespace. Without the file, no legacy table
// is (ip_tables is not loaded).
func legacyTablesInUse(fam Family) (bool, error) {
	name := "/proc/net/ip_tables_names"
	if fam == IPv6 {
		name = "/proc/net/ip6_tables_names"
	}
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	tables := strings.Fields(string(b))
	return slices.Contains(tables, tableNAT) || slices.Contains(tables, tableFilter), nil
}

// nftChain names a chain of nftables: family (NFPROTO_IPV4 or _IPV6),
// table and name.
type nftChain struct {
	family       byte
	table, chain string
}

// nftChainsExist reports whether any of chains exists in nftables, with
// one NFT_MSG_GETCHAIN each on one netlink socket; a table or chain that
// is not there answers ENOENT. It needs CAP_NET_ADMIN; a kernel without
// nf_tables answers with an error.
func nftChainsExist(chains []nftChain) (bool, error) {
	fd, err := nfnetlinkSocket()
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 64<<10)
	for i, c := range chains {
		seq := uint32(i + 1)
		req := make([]byte, unix.NLMSG_HDRLEN+4) // header, then nfgenmsg: family, version 0, res_id 0
		binary.NativeEndian.PutUint16(req[4:], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETCHAIN)
		binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
		binary.NativeEndian.PutUint32(req[8:], seq)
		req[unix.NLMSG_HDRLEN] = c.family
		req = nlaAppendString(req, unix.NFTA_CHAIN_TABLE, c.table)
		req = nlaAppendString(req, unix.NFTA_CHAIN_NAME, c.chain)
		binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
		if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return false, fmt.Errorf("get nftables chain %s: %w", c.chain, err)
		}
		found, err := nftChainAnswer(fd, buf, seq)
		if err != nil {
			return false, fmt.Errorf("get nftables chain %s: %w", c.chain, err)
		}
		if found {
			return true, nil
		}
	}
	return false, nil
}

// nftChainAnswer reads the answer to GETCHAIN request seq: the chain, or
// an error, ENOENT when there is no such chain.
func nftChainAnswer(fd int, buf []byte, seq uint32) (bool, error) {
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return false, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return false, err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWCHAIN:
				return true, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return false, errors.New("short netlink error")
				}
				switch errno := unix.Errno(-int32(binary.NativeEndian.Uint32(m.Data))); errno {
				case 0:
					return false, errors.New("no chain in the answer")
				case unix.ENOENT:
					return false, nil
				default:
					return false, errno
				}
			}
		}
	}
}

// nlaAppendString appends a NUL-terminated string attribute to b.
func nlaAppendString(b []byte, typ uint16, s string) []byte {
	l := unix.NLA_HDRLEN + len(s) + 1
	a := make([]byte, (l+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1))
	binary.NativeEndian.PutUint16(a, uint16(l))
	binary.NativeEndian.PutUint16(a[2:], typ)
	copy(a[unix.NLA_HDRLEN:], s)
	return append(b, a...)
}
