package portal

import (
	"net"
	"net/netip"
	"slices"
	"testing"
)

// TestAddrsInUse: addresses with a socket bound to them, TCP or UDP, IPv4
// or IPv6, are found in /proc/net; others are not.
func TestAddrsInUse(t *testing.T) {
	tcp, err := net.Listen("tcp4", "127.0.0.77:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	udp, err := net.ListenPacket("udp4", "127.0.0.78:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.77"), netip.MustParseAddr("127.0.0.78"), netip.MustParseAddr("127.0.0.79")}
	want := addrs[:2]
	if six, err := net.ListenPacket("udp6", "[::1]:0"); err == nil {
		defer six.Close()
		addrs = append(addrs, netip.MustParseAddr("::1"))
		want = addrs[:2:2]
		want = append(want, netip.MustParseAddr("::1"))
	}
	got, err := AddrsInUse(addrs)
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("AddrsInUse = %v, %v; want %v", got, err, want)
	}
	// A connection the listener's side closed first stays in TIME_WAIT
	// on the address after the listener is gone: it does not count.
	c, err := net.Dial("tcp4", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := tcp.Accept()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	c.Read(make([]byte, 1)) // the FIN
	c.Close()
	tcp.Close()
	udp.Close()
	if got, err := AddrsInUse(addrs[:2]); err != nil || len(got) != 0 {
		t.Errorf("after the sockets closed: %v, %v; want none", got, err)
	}
}

func TestProcAddr(t *testing.T) {
	if bigEndian {
		t.Skip("the cases are little-endian")
	}
	for in, want := range map[string]string{
		"0100007F":                         "127.0.0.1",
		"00000000":                         "0.0.0.0",
		"00000000000000000000000001000000": "::1",
		"B8FE5EFD000000000000000001000000": "fd5e:feb8::1",
	} {
		if got, err := procAddr(in); err != nil || got.String() != want {
			t.Errorf("procAddr(%s) = %v, %v; want %s", in, got, err, want)
		}
	}
}
