package portal

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// AddrsInUse returns those of addrs that some socket of this network
// namespace listens on (a listening TCP socket, or any UDP socket; IPv4
// or IPv6), from /proc/net: a running bind portal's proxy listens on its
// service addresses. Connections a dead one left (TIME_WAIT) do not count.
func AddrsInUse(addrs []netip.Addr) ([]netip.Addr, error) {
	want := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		want[a.Unmap()] = true
	}
	found := make(map[netip.Addr]bool)
	for _, name := range []string{"tcp", "tcp6", "udp", "udp6"} {
		listenOnly := strings.HasPrefix(name, "tcp")
		if err := boundIn("/proc/net/"+name, func(a netip.Addr, state string) {
			if want[a] && (!listenOnly || state == tcpListen) {
				found[a] = true
			}
		}); err != nil {
			return nil, err
		}
	}
	var out []netip.Addr
	for _, a := range addrs {
		if found[a.Unmap()] {
			out = append(out, a)
		}
	}
	return out, nil
}

// tcpListen is TCP_LISTEN as /proc/net/tcp prints a socket's state.
const tcpListen = "0A"

// boundIn calls bound with the local address and state (hexadecimal) of
// each socket in a /proc/net table. A table the kernel lacks (no IPv6) has
// no sockets.
func boundIn(path string, bound func(addr netip.Addr, state string)) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text()) // sl local_address rem_address st ...
		if len(fields) < 4 {
			continue
		}
		hexAddr, _, _ := strings.Cut(fields[1], ":")
		a, err := procAddr(hexAddr)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		bound(a, fields[3])
	}
	return sc.Err()
}

// procAddr decodes an address as /proc/net/tcp and friends print it: each
// 32-bit word of it as a number in the machine's byte order.
func procAddr(s string) (netip.Addr, error) {
	b, err := hex.DecodeString(s)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.Addr{}, fmt.Errorf("bad address %q", s)
	}
	if !bigEndian {
		for i := 0; i < len(b); i += 4 {
			b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a.Unmap(), nil
}
