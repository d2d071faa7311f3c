//go:build linux && !goroutines

package userspace

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketFilterAllowed reports whether the kernel lets this process attach
// a socket filter to a socket of network ("tcp" or "udp"). Kernel 6.18
// refuses one on a TCP socket with EPERM to a process without
// CAP_NET_ADMIN in the socket's network namespace (a UDP socket takes one
// either way); the proxy then refuses those clients itself (see
// filterSockets). Any other error fails the test.
func socketFilterAllowed(t testing.TB, network string) bool {
	t.Helper()
	typ := unix.SOCK_STREAM
	if network == "udp" {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	err = attachSourceFilter(fd, familyIPv4, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
	if errors.Is(err, unix.EPERM) {
		return false
	}
	if err != nil {
		t.Fatalf("attach a socket filter to a %s socket: %v", network, err)
	}
	return true
}

// TestSourceFilterPrograms attaches the socket filter of each set of
// ranges to real listening sockets on loopback and checks which clients
// the kernel lets through: whole and partial 32-bit words of IPv6
// prefixes, several ranges, and IPv4. Where the kernel refuses this
// process a filter on a TCP socket (see socketFilterAllowed), attaching
// one must fail with EPERM, the error the proxy logs before it refuses
// those clients itself, and the programs, which load from the network
// header whatever the transport, are checked on UDP sockets only.
func TestSourceFilterPrograms(t *testing.T) {
	needIPv6Loopback(t)
	tcpFilter := socketFilterAllowed(t, "tcp")
	if !tcpFilter {
		t.Logf("the kernel refuses this process a socket filter on a TCP socket (EPERM; it needs CAP_NET_ADMIN here): TCP checks that attaching fails so, the programs are checked on UDP")
	}
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
		attach := func(c syscall.Conn) error {
			rc, err := c.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var aerr error
			if err := rc.Control(func(fd uintptr) { aerr = attachSourceFilter(int(fd), fam, ranges) }); err != nil {
				t.Fatal(err)
			}
			return aerr
		}
		src := netip.MustParseAddr(tc.src)

		ln, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(tc.host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		if err := attach(ln.(*net.TCPListener)); !tcpFilter {
			if !errors.Is(err, unix.EPERM) {
				t.Errorf("TCP %v: attach: %v; want EPERM, as for a TCP socket before", tc.ranges, err)
			}
		} else if err != nil {
			t.Fatalf("TCP %v: attach: %v", tc.ranges, err)
		} else {
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 300 * time.Millisecond}
			c, err := d.Dial("tcp", ln.Addr().String())
			if err == nil {
				c.Close()
			}
			if got := err == nil; got != tc.admit {
				t.Errorf("TCP from %s with ranges %v: connected %v (%v), want %v", tc.src, tc.ranges, got, err, tc.admit)
			}
		}
		ln.Close()

		pc, err := net.ListenPacket("udp", net.JoinHostPort(tc.host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		if err := attach(pc.(*net.UDPConn)); err != nil {
			t.Fatalf("UDP %v: attach: %v", tc.ranges, err)
		}
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
	if !tcpFilter {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		rc, _ := pc.(*net.UDPConn).SyscallConn()
		rc.Control(func(fd uintptr) {
			if err := attachSourceFilter(int(fd), familyIPv4, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}); err != nil {
				t.Fatal(err)
			}
			if err := attachSourceFilter(int(fd), familyIPv4, nil); err != nil {
				t.Fatal(err)
			}
		})
		cl, err := net.Dial("udp4", pc.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		cl.Write([]byte("x"))
		pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := pc.ReadFrom(make([]byte, 8)); err != nil {
			t.Fatalf("UDP after the filter was removed: %v", err)
		}
		return
	}
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
