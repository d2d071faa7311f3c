//go:build linux && !goroutines

package userspace

import (
	"context"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// TestSourceFilterPrograms attaches the socket filter of each set of
// ranges to real listening sockets on loopback and checks which clients
// the kernel lets through: whole and partial 32-bit words of IPv6
// prefixes, several ranges, and IPv4.
func TestSourceFilterPrograms(t *testing.T) {
	needIPv6Loopback(t)
	tests := []struct {
		host   string // listen and dial here
		src    string // the client's address
		ranges []string
		admit  bool
	}{
		{"::1", "::1", []string{"::1/128"}, true},
		{"::1", "::1", []string{"::/127"}, true},   // the last word, masked
		{"::1", "::1", []string{"::2/127"}, false}, // the last word, masked, other value
		{"::1", "::1", []string{"::/1"}, true},     // the first word, masked
		{"::1", "::1", []string{"8000::/1"}, false},
		{"::1", "::1", []string{"fd5e:b1b5::/32", "::/96"}, true}, // the second range
		{"::1", "::1", []string{"fd5e:b1b5::/32", "::1:0:0:0/80"}, false},
		{"127.0.0.1", "127.0.0.5", []string{"127.0.0.5/32"}, true},
		{"127.0.0.1", "127.0.0.5", []string{"127.0.0.1/32"}, false}, // the destination is not the source
		{"127.0.0.1", "127.0.0.5", []string{"198.18.0.0/15", "127.0.0.0/8"}, true},
		{"127.0.0.1", "127.0.0.5", []string{"127.0.0.4/31"}, true},
		{"127.0.0.1", "127.0.0.5", []string{"127.0.0.2/31"}, false},
		{"127.0.0.1", "127.0.0.5", []string{"128.0.0.0/1"}, false},
	}
	// Go listens with Multipath TCP where the kernel has it, and an MPTCP
	// socket takes no socket filter; the proxy's sockets are plain TCP.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	for _, tc := range tests {
		var ranges []netip.Prefix
		for _, r := range tc.ranges {
			ranges = append(ranges, netip.MustParsePrefix(r))
		}
		fam := familyOf(netip.MustParseAddr(tc.host))
		attach := func(c syscall.Conn) {
			rc, err := c.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var aerr error
			if err := rc.Control(func(fd uintptr) { aerr = attachSourceFilter(int(fd), fam, ranges) }); err != nil || aerr != nil {
				t.Fatalf("%v: attach: %v, %v", tc.ranges, err, aerr)
			}
		}

		ln, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(tc.host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		attach(ln.(*net.TCPListener))
		src := netip.MustParseAddr(tc.src)
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 300 * time.Millisecond}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		ln.Close()
		if got := err == nil; got != tc.admit {
			t.Errorf("TCP from %s with ranges %v: connected %v (%v), want %v", tc.src, tc.ranges, got, err, tc.admit)
		}

		pc, err := net.ListenPacket("udp", net.JoinHostPort(tc.host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		attach(pc.(*net.UDPConn))
		cl, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), pc.LocalAddr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		cl.Write([]byte("x"))
		cl.Close()
		pc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, _, err = pc.ReadFrom(make([]byte, 8))
		pc.Close()
		if got := err == nil; got != tc.admit {
			t.Errorf("UDP from %s with ranges %v: received %v (%v), want %v", tc.src, tc.ranges, got, err, tc.admit)
		}
	}

	// Removing the filter admits everyone again.
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rc, _ := ln.(*net.TCPListener).SyscallConn()
	rc.Control(func(fd uintptr) {
		if err := attachSourceFilter(int(fd), familyIPv4, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}); err != nil {
			t.Fatal(err)
		}
		if err := attachSourceFilter(int(fd), familyIPv4, nil); err != nil {
			t.Fatal(err)
		}
	})
	c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
	if err != nil {
		t.Fatalf("after the filter was removed: %v", err)
	}
	c.Close()
}
