//go:build linux && !goroutines

package userspace

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"
)

// A socket bound to a load-balancer IP with loadBalancerSourceRanges
// carries a classic BPF socket filter that admits only those sources, so
// the kernel drops the others' packets before a TCP handshake completes
// or a datagram is queued: the client sees a silent drop, as kube-proxy's
// DROP rule gives it, and the proxy does no work for it. Accepted sockets
// inherit the listener's filter. servicePort.admits stays as the check of
// the builds without one.

// kernelSourceFilter says whether load-balancer IP sockets carry a socket
// filter of their source ranges: they do in this build.
const kernelSourceFilter = true

// skfNetOff makes a BPF load's offset relative to the network header (the
// kernel's SKF_NET_OFF): a TCP or UDP socket's filter sees the packet from
// its transport header.
const skfNetOff = -0x100000

// bpfAccept keeps the whole packet; 0 drops it.
const bpfAccept = 0xffffffff

// sourceFilter returns the socket filter program that admits packets
// whose source address is in one of ranges; every range must be of fam.
// Each range is one block of loads and compares that ends in an accept; a
// mismatch jumps to the next block, and after the last the packet is
// dropped. Blocks are short, so every jump fits BPF's 8-bit offsets.
func sourceFilter(fam family, ranges []netip.Prefix) ([]unix.SockFilter, error) {
	srcOff := 12 // IPv4 header: source address
	if fam == familyIPv6 {
		srcOff = 8
	}
	var prog []unix.SockFilter
	for _, r := range ranges {
		if familyOf(r.Addr()) != fam {
			return nil, fmt.Errorf("source range %s is not of the socket's family", r)
		}
		addr := r.Masked().Addr().AsSlice()
		var block []unix.SockFilter
		// One load and compare per 32-bit word the prefix covers.
		for w := 0; w*32 < r.Bits(); w++ {
			bits := min(r.Bits()-w*32, 32)
			mask := uint32(0xffffffff) << (32 - bits)
			want := binary.BigEndian.Uint32(addr[4*w:])
			block = append(block, unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: uint32(int32(skfNetOff + srcOff + 4*w))})
			if bits < 32 {
				block = append(block, unix.SockFilter{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: mask})
			}
			// Jf is filled in below: to the next block.
			block = append(block, unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: want})
		}
		block = append(block, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: bpfAccept})
		for i := range block {
			if block[i].Code == unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K {
				block[i].Jf = uint8(len(block) - 1 - i)
			}
		}
		prog = append(prog, block...)
	}
	prog = append(prog, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: 0})
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("%d source ranges make a socket filter of %d instructions, more than the kernel's %d", len(ranges), len(prog), unix.BPF_MAXINSNS)
	}
	return prog, nil
}

// attachSourceFilter sets fd's socket filter to admit only ranges, or
// removes it when ranges is nil.
func attachSourceFilter(fd int, fam family, ranges []netip.Prefix) error {
	if ranges == nil {
		err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0)
		if err == unix.ENOENT { // there was none
			err = nil
		}
		return err
	}
	prog, err := sourceFilter(fam, ranges)
	if err != nil {
		return err
	}
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fp)
}

// sameSources reports whether a socket filter for b is the one set for a:
// nil (no filter) differs from any list.
func sameSources(a, b []netip.Prefix) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}

// filterSources makes the listener admit only ranges (nil: everyone).
func (l *tcpListener) filterSources(ranges []netip.Prefix) error {
	if sameSources(l.sources, ranges) {
		return nil
	}
	if err := attachSourceFilter(l.fd, familyOf(l.addr), ranges); err != nil {
		return err
	}
	l.sources = ranges
	return nil
}

// filterSources makes every socket of the group admit only ranges (nil:
// everyone).
func (g *udpGroup) filterSources(ranges []netip.Prefix) error {
	if sameSources(g.sources, ranges) {
		return nil
	}
	for _, l := range g.members {
		if err := attachSourceFilter(l.fd, l.fam, ranges); err != nil {
			return err
		}
	}
	g.sources = ranges
	return nil
}
