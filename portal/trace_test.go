package portal

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/state"
)

// tracePacket follows a packet through the rendered nat rules as the
// kernel would with our jumps in place: the portal chain of its hook, then
// the node-port chain when its destination is local. It returns the
// REDIRECT port and the rule that took it, or ok false.
func tracePacket(t *testing.T, ruleText, hook, proto string, src netip.Addr, dst netip.AddrPort, local bool) (port uint16, rule string, ok bool) {
	t.Helper()
	tables, err := parseSave(ruleText)
	if err != nil {
		t.Fatalf("parse rendered rules: %v", err)
	}
	chains := map[string][]string{
		"PREROUTING": {ChainPortalsContainer, ChainNodePortContainer},
		"OUTPUT":     {ChainPortalsHost, ChainNodePortHost},
	}[hook]
	var walk func(chain string) (uint16, string, bool)
	walk = func(chain string) (uint16, string, bool) {
		for _, args := range tables[tableNAT].rules[chain] {
			if into, ok := strings.CutPrefix(args[strings.LastIndex(args, " -j ")+1:], "-j KUBE-"); ok {
				if p, rule, ok := walk("KUBE-" + into); ok { // a jump that matches everything
					return p, rule, true
				}
				continue
			}
			if p, ok := matchRule(t, args, proto, src, dst); ok {
				if strings.HasSuffix(args, " -j RETURN") {
					return 0, "", false // back to the calling chain, which goes on
				}
				return p, chain + " " + args, true
			}
		}
		return 0, "", false
	}
	for i, chain := range chains {
		if i == 1 && !local { // the node-port jump has --dst-type LOCAL
			break
		}
		if p, rule, ok := walk(chain); ok {
			return p, rule, true
		}
	}
	return 0, "", false
}

// matchRule reports whether a rule matches a packet, and the port it
// redirects to; a rule that does not redirect (DROP) matches with port 0.
func matchRule(t *testing.T, args, proto string, src netip.Addr, dst netip.AddrPort) (uint16, bool) {
	words, err := splitArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	var to uint16
	for i := 0; i+1 < len(words); i++ {
		v := words[i+1]
		switch words[i] {
		case "-s":
			if !netip.MustParsePrefix(v).Contains(src) {
				return 0, false
			}
		case "-d":
			if !netip.MustParsePrefix(v).Contains(dst.Addr()) {
				return 0, false
			}
		case "-p":
			if v != proto {
				return 0, false
			}
		case "--dport":
			if v != strconv.Itoa(int(dst.Port())) {
				return 0, false
			}
		case "--to-ports":
			n, _ := strconv.Atoi(v)
			to = uint16(n)
		}
	}
	return to, to != 0 || strings.HasSuffix(args, " -j DROP") || strings.HasSuffix(args, " -j RETURN")
}

// dropped reports whether the firewall chain of the rendered filter table
// drops a new packet that the nat rules left alone.
func dropped(t *testing.T, ruleText, proto string, src netip.Addr, dst netip.AddrPort) bool {
	t.Helper()
	tables, err := parseSave(ruleText)
	if err != nil {
		t.Fatalf("parse rendered rules: %v", err)
	}
	for _, args := range tables[tableFilter].rules[ChainFirewall] {
		if _, ok := matchRule(t, args, proto, src, dst); ok {
			return true
		}
	}
	return false
}

func TestTrace(t *testing.T) {
	nodeAddrs := []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}
	node6Addrs := []netip.Prefix{netip.MustParsePrefix("fd5e:b1b5:1::/64")}
	loAddrs := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	wideAddrs := []netip.Prefix{netip.MustParsePrefix("64.0.0.0/2"), netip.MustParsePrefix("198.18.0.0/15")} // 64.0.0.0/2 holds 127.0.0.0/8
	pod, outside, node6 := "198.18.10.2", "198.18.11.2", "fd5e:b1b5:1::1"
	tests := []struct {
		hook, proto, src, dst string
		local                 bool
		nodePortAddrs         []netip.Prefix
		want                  uint16 // 0: not redirected
		drop                  bool   // not redirected, then dropped
	}{
		{"PREROUTING", "tcp", pod, "198.18.0.10:80", false, nil, 41234, false},
		{"OUTPUT", "tcp", pod, "198.18.0.10:80", false, nil, 41234, false},
		{"PREROUTING", "udp", pod, "198.18.0.10:80", false, nil, 0, false}, // wrong protocol
		{"PREROUTING", "tcp", pod, "198.18.0.10:81", false, nil, 0, false}, // wrong port
		{"PREROUTING", "tcp", pod, "198.19.0.5:80", false, nil, 41234, false},
		{"OUTPUT", "tcp", outside, "198.19.1.1:80", false, nil, 41234, false},
		{"PREROUTING", "tcp", "203.0.113.9", "198.19.1.1:80", false, nil, 41234, false},
		{"PREROUTING", "tcp", pod, "198.19.1.1:80", false, nil, 0, true},      // outside the source ranges
		{"PREROUTING", "tcp", outside, "198.19.1.1:81", false, nil, 0, false}, // another port: not ours to drop
		{"PREROUTING", "udp", pod, "198.18.0.53:53", false, nil, 41235, false},
		{"OUTPUT", "udp", pod, "198.18.0.53:53", false, nil, 41235, false},
		{"PREROUTING", "sctp", pod, "198.18.0.99:3868", false, nil, 41236, false},
		{"PREROUTING", "tcp", node6, "[fd5e:b1b5::10]:80", false, nil, 41234, false},
		{"OUTPUT", "tcp", node6, "[fd5e:b1b5::80]:8080", false, nil, 41237, false},
		{"PREROUTING", "tcp", outside, "198.18.1.1:30080", true, nil, 41234, false},
		{"OUTPUT", "udp", "127.0.0.1", "127.0.0.1:30053", true, nil, 41235, false},
		{"PREROUTING", "tcp", outside, "198.18.9.9:30080", false, nil, 0, false}, // not a local address
		{"PREROUTING", "tcp", node6, "[fd5e:b1b5:1::1]:30081", true, nil, 41237, false},
		{"PREROUTING", "tcp", outside, "198.18.1.1:30080", true, nodeAddrs, 41234, false},
		{"OUTPUT", "tcp", "127.0.0.1", "127.0.0.1:30080", true, nodeAddrs, 0, false}, // outside --nodeport-addresses
		// CIDRs of IPv4 alone leave IPv6 node ports on every address, as
		// kube-proxy reads --nodeport-addresses per family.
		{"PREROUTING", "tcp", node6, "[fd5e:b1b5:1::1]:30081", true, nodeAddrs, 41237, false},
		{"PREROUTING", "tcp", node6, "[fd5e:b1b5:1::1]:30081", true, node6Addrs, 41237, false},
		{"PREROUTING", "tcp", node6, "[fd5e:b1b5:7::1]:30081", true, node6Addrs, 0, false},
		{"PREROUTING", "tcp", outside, "198.18.1.1:30080", true, node6Addrs, 41234, false},
		// Loopback node ports are the node's own: a packet to 127.0.0.1
		// that comes in (PREROUTING, from a host with route_localnet) is
		// never redirected, whatever --nodeport-addresses says
		// (CVE-2020-8558); the node's own (OUTPUT) is.
		{"PREROUTING", "tcp", outside, "127.0.0.1:30080", true, nil, 0, false},
		{"PREROUTING", "udp", outside, "127.0.0.1:30053", true, nil, 0, false},
		{"PREROUTING", "tcp", outside, "127.0.0.1:30080", true, loAddrs, 0, false},
		{"PREROUTING", "tcp", outside, "127.0.0.1:30080", true, wideAddrs, 0, false},
		{"PREROUTING", "tcp", outside, "127.1.2.3:30080", true, nil, 0, false},
		{"PREROUTING", "tcp", node6, "[::1]:30081", true, nil, 0, false},
		{"OUTPUT", "tcp", "127.0.0.1", "127.0.0.1:30080", true, loAddrs, 41234, false},
		{"OUTPUT", "tcp", "127.0.0.1", "127.0.0.1:30080", true, wideAddrs, 41234, false},
		{"OUTPUT", "tcp", "::1", "[::1]:30081", true, nil, 41237, false},
		{"OUTPUT", "tcp", "127.0.0.1", "198.18.1.1:30080", true, loAddrs, 0, false},
		{"PREROUTING", "tcp", outside, "198.18.1.1:30080", true, wideAddrs, 41234, false},
	}
	for _, tc := range tests {
		src, dst := netip.MustParseAddr(tc.src), netip.MustParseAddrPort(tc.dst)
		name := fmt.Sprintf("%s %s to %s/%s local=%v nodeports=%v", tc.hook, tc.src, tc.dst, strings.ToUpper(tc.proto), tc.local, tc.nodePortAddrs)
		t.Run(name, func(t *testing.T) {
			text := Render(fixedPortals(), FamilyOf(dst.Addr()), IPTablesConfig{NodePortAddresses: tc.nodePortAddrs})
			got, rule, ok := tracePacket(t, text, tc.hook, tc.proto, src, dst, tc.local)
			switch {
			case tc.want == 0 && ok:
				t.Errorf("%s redirects to :%d by %q, want no redirect", tc.dst, got, rule)
			case tc.want != 0 && (!ok || got != tc.want):
				t.Errorf("%s/%s redirects to :%d (%v), want :%d", tc.dst, strings.ToUpper(tc.proto), got, ok, tc.want)
			}
			if drop := dropped(t, text, tc.proto, src, dst); tc.want == 0 && drop != tc.drop {
				t.Errorf("dropped = %v, want %v", drop, tc.drop)
			}
			// The fake agrees with the rules for address portals (it
			// leaves to its caller whether a node-port dst is local).
			if tc.local || tc.want == 0 && !tc.drop {
				return
			}
			f := &Fake{NodePortAddresses: tc.nodePortAddrs}
			f.Sync(t.Context(), fixedPortals())
			if fp, _ := f.Lookup(strings.ToUpper(tc.proto), src, dst); fp != got {
				t.Errorf("Fake.Lookup = :%d, rules say :%d", fp, got)
			}
		})
	}
}

// TestTraceNoLocalhostNodePorts: with kube-proxy's
// --iptables-localhost-nodeports=false node ports are not served on
// loopback addresses at all, not even to the node itself; its other
// addresses still serve them.
func TestTraceNoLocalhostNodePorts(t *testing.T) {
	for _, cidrs := range [][]netip.Prefix{nil, {netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("198.18.1.0/24")}} {
		tests := []struct {
			hook, src, dst string
			want           uint16
		}{
			{"OUTPUT", "127.0.0.1", "127.0.0.1:30080", 0},
			{"OUTPUT", "::1", "[::1]:30081", 0},
			{"PREROUTING", "198.18.11.2", "127.0.0.1:30080", 0},
			{"OUTPUT", "198.18.1.1", "198.18.1.1:30080", 41234},
			{"PREROUTING", "198.18.11.2", "198.18.1.1:30080", 41234},
		}
		for _, tc := range tests {
			src, dst := netip.MustParseAddr(tc.src), netip.MustParseAddrPort(tc.dst)
			text := Render(fixedPortals(), FamilyOf(dst.Addr()), IPTablesConfig{NodePortAddresses: cidrs, NoLocalhostNodePorts: true})
			if got, rule, ok := tracePacket(t, text, tc.hook, "tcp", src, dst, true); got != tc.want {
				t.Errorf("nodeports=%v: %s %s redirects to :%d (%v, %q), want :%d", cidrs, tc.hook, tc.dst, got, ok, rule, tc.want)
			}
		}
	}
}

// TestTraceLoopbackFrontends: an external or load-balancer IP in
// 127.0.0.0/8 or ::1 (manifests accept them) is this host's own, as
// loopback node ports are: its traffic from the node itself (OUTPUT) is
// redirected, but a packet to it that comes in (PREROUTING, from a host
// with route_localnet that routes 127.0.0.0/8 through this one) is not
// (CVE-2020-8558), whatever else the container chain holds.
func TestTraceLoopbackFrontends(t *testing.T) {
	ext := state.ServicePortName{Namespace: "t", Name: "ext", Port: "http", Protocol: state.TCP}
	portals := append(fixedPortals(),
		Portal{Service: ext, Kind: ExternalIP, Family: IPv4, IP: netip.MustParseAddr("127.0.0.2"), Port: 8888, ProxyPort: 41300},
		Portal{Service: ext, Kind: LoadBalancerIP, Family: IPv4, IP: netip.MustParseAddr("127.0.0.3"), Port: 8888, ProxyPort: 41300,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
		Portal{Service: ext, Kind: ExternalIP, Family: IPv6, IP: netip.IPv6Loopback(), Port: 8888, ProxyPort: 41300},
		Portal{Service: ext, Kind: ExternalIP, Family: IPv4, IP: netip.MustParseAddr("198.19.0.88"), Port: 8888, ProxyPort: 41300})
	tests := []struct {
		hook, src, dst string
		want           uint16
	}{
		{"PREROUTING", "198.18.11.2", "127.0.0.2:8888", 0},
		{"PREROUTING", "198.18.11.2", "127.0.0.3:8888", 0},
		{"PREROUTING", "fd5e:b1b5:11::2", "[::1]:8888", 0},
		{"OUTPUT", "127.0.0.1", "127.0.0.2:8888", 41300},
		{"OUTPUT", "127.0.0.1", "127.0.0.3:8888", 41300},
		{"OUTPUT", "::1", "[::1]:8888", 41300},
		{"PREROUTING", "198.18.11.2", "198.19.0.88:8888", 41300}, // not loopback: served as before
		{"OUTPUT", "198.18.1.1", "198.19.0.88:8888", 41300},
		{"PREROUTING", "198.18.10.2", "198.18.0.10:80", 41234},
	}
	for _, tc := range tests {
		src, dst := netip.MustParseAddr(tc.src), netip.MustParseAddrPort(tc.dst)
		text := Render(portals, FamilyOf(dst.Addr()), IPTablesConfig{})
		if got, rule, ok := tracePacket(t, text, tc.hook, "tcp", src, dst, false); got != tc.want {
			t.Errorf("%s %s redirects to :%d (%v, %q), want :%d", tc.hook, tc.dst, got, ok, rule, tc.want)
		}
		tables, _ := parseSave(text)
		if first := tables[tableNAT].rules[ChainPortalsContainer]; len(first) == 0 || !strings.HasSuffix(first[0], " -j RETURN") {
			t.Errorf("%s: the container portal chain does not start with the loopback guard: %q", FamilyOf(dst.Addr()), first)
		}
	}
	// What the rules hold reads back as what was written.
	for _, fam := range []Family{IPv4, IPv6} {
		tables, _ := parseSave(Render(portals, fam, IPTablesConfig{}))
		got, bad := portalsInSave(tables, fam)
		if bad != 0 || !slices.ContainsFunc(got, func(p Portal) bool { return p.Service == ext && p.IP.IsLoopback() }) {
			t.Errorf("%s: portalsInSave = %v (%d unreadable), want the loopback frontend", fam, got, bad)
		}
	}
}

// TestTraceOneSourceRange: a load-balancer IP with a single
// loadBalancerSourceRange (per family) is redirected for that range alone,
// by one rule with -s, and the firewall chain drops every other source, as
// with several ranges: a single range limits the sources as much as two.
func TestTraceOneSourceRange(t *testing.T) {
	lb := state.ServicePortName{Namespace: "t", Name: "lb", Port: "http", Protocol: state.TCP}
	ep := []state.Endpoint{{Addr: netip.MustParseAddrPort("198.18.12.2:8080"), Ready: true, Serving: true}}
	snap := state.NewSnapshot([]state.ServicePort{{Name: lb, Port: 80, ClusterIPs: addrs("198.18.0.20", "fd5e:b1b5::20"),
		LoadBalancerIPs: addrs("198.19.2.1", "fd5e:b1b5:19::1"), ClusterEndpoints: ep,
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.18.11.0/24"), netip.MustParsePrefix("fd5e:b1b5:11::/64")}}})
	portals := FromSnapshot(snap, func(state.ServicePortName) uint16 { return 41400 }, nil)
	want := map[Family][]string{
		IPv4: {
			`-A KUBE-PORTALS-CONTAINER -s 198.18.11.0/24 -d 198.19.2.1/32 -p tcp -m comment --comment "t/lb:http" -m tcp --dport 80 -j REDIRECT --to-ports 41400`,
			`-A KUBE-PORTALS-FIREWALL -d 198.19.2.1/32 -p tcp -m comment --comment "t/lb:http source not in loadBalancerSourceRanges" -m tcp --dport 80 -j DROP`,
		},
		IPv6: {
			`-A KUBE-PORTALS-CONTAINER -s fd5e:b1b5:11::/64 -d fd5e:b1b5:19::1/128 -p tcp -m comment --comment "t/lb:http" -m tcp --dport 80 -j REDIRECT --to-ports 41400`,
			`-A KUBE-PORTALS-FIREWALL -d fd5e:b1b5:19::1/128 -p tcp -m comment --comment "t/lb:http source not in loadBalancerSourceRanges" -m tcp --dport 80 -j DROP`,
		},
	}
	lbIP := map[Family]string{IPv4: "198.19.2.1/", IPv6: "fd5e:b1b5:19::1/"}
	for fam, rules := range want {
		var got []string
		for line := range strings.Lines(Render(portals, fam, IPTablesConfig{})) {
			if strings.Contains(line, "-d "+lbIP[fam]) {
				got = append(got, strings.TrimSuffix(line, "\n"))
			}
		}
		if !slices.Equal(got, rules) {
			t.Errorf("%s: rules of the load-balancer IP:\n%s\nwant\n%s", fam, strings.Join(got, "\n"), strings.Join(rules, "\n"))
		}
	}
	tests := []struct {
		src, dst string
		want     uint16 // 0: not redirected, then dropped
	}{
		{"198.18.11.2", "198.19.2.1:80", 41400},
		{"198.18.10.2", "198.19.2.1:80", 0},
		{"fd5e:b1b5:11::2", "[fd5e:b1b5:19::1]:80", 41400},
		{"fd5e:b1b5:10::2", "[fd5e:b1b5:19::1]:80", 0},
	}
	for _, tc := range tests {
		src, dst := netip.MustParseAddr(tc.src), netip.MustParseAddrPort(tc.dst)
		text := Render(portals, FamilyOf(dst.Addr()), IPTablesConfig{})
		got, rule, ok := tracePacket(t, text, "PREROUTING", "tcp", src, dst, false)
		if got != tc.want {
			t.Errorf("from %s, %s redirects to :%d (%v, %q), want :%d", tc.src, tc.dst, got, ok, rule, tc.want)
		}
		if drop := dropped(t, text, "tcp", src, dst); tc.want == 0 && !drop {
			t.Errorf("from %s, %s is not dropped: outside the source range", tc.src, tc.dst)
		}
	}
}
